package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/grpcnet"
)

// LocalSilos runs the members of a replicated engine in this process,
// each with its own directory under Dir, its own gRPC server and
// transport on loopback: for tests and benchmarks on one machine.
type LocalSilos struct {
	dir         string
	node        Config
	eng         engine.Config
	persistOnly bool
	peers       []uint64
	addrs       map[transport.NodeID]string
	mu          sync.Mutex
	members     map[uint64]*localSilo
}

type localSilo struct {
	silo *Silo
	tr   *grpcnet.Transport
	srv  *grpc.Server
}

// StartLocalSilos starts n members in dir. node and eng are each member's
// configuration; their ids, peers and directories are filled in.
func StartLocalSilos(n int, dir string, node Config, eng engine.Config) (*LocalSilos, error) {
	return StartLocalSilosWith(n, dir, SiloConfig{Node: node, Engine: eng})
}

// StartLocalSilosWith is StartLocalSilos with every member's whole
// configuration (ids, peers and directories are filled in).
func StartLocalSilosWith(n int, dir string, cfg SiloConfig) (*LocalSilos, error) {
	node, eng := cfg.Node, cfg.Engine
	c := &LocalSilos{dir: dir, node: node, eng: eng, persistOnly: cfg.PersistOnly, addrs: map[transport.NodeID]string{}, members: map[uint64]*localSilo{}}
	for i := range n {
		id := uint64(i + 1)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		c.addrs[transport.NodeID(id)] = l.Addr().String()
		l.Close()
		c.peers = append(c.peers, id)
	}
	for _, id := range c.peers {
		if err := c.Start(id); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Peers are the members' ids.
func (c *LocalSilos) Peers() []uint64 { return c.peers }

// MemberLabel is the profiler label (runtime/pprof) every goroutine of a
// LocalSilos member carries, with the member's id as its value: a CPU
// profile of the process then tells the members' work apart.
const MemberLabel = "kiroku_member"

// Start starts member id (again). Every goroutine it starts, and every
// goroutine those start, carries MemberLabel.
func (c *LocalSilos) Start(id uint64) (err error) {
	pprof.Do(context.Background(), pprof.Labels(MemberLabel, fmt.Sprint(id)), func(context.Context) { err = c.start(id) })
	return err
}

func (c *LocalSilos) start(id uint64) error {
	dir := filepath.Join(c.dir, fmt.Sprint(id))
	nc, ec := c.node, c.eng
	nc.ID, nc.Peers, nc.Dir = id, c.peers, dir
	if nc.ClusterID == "" {
		nc.ClusterID = "local"
	}
	ec.Dir = filepath.Join(dir, "engine")
	s, err := OpenSilo(SiloConfig{Node: nc, Engine: ec, PersistOnly: c.persistOnly})
	if err != nil {
		return fmt.Errorf("member %d: %w", id, err)
	}
	tr, err := grpcnet.New(grpcnet.Config{NodeID: transport.NodeID(id), ClusterID: nc.ClusterID, Peers: c.addrs,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, QueueBytes: 256 << 20, BatchBytes: 4 << 20}, s.Runner().Handler())
	if err != nil {
		s.Close()
		return err
	}
	s.Node().SetTransport(tr)
	var l net.Listener
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if l, err = net.Listen("tcp", c.addrs[transport.NodeID(id)]); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		tr.Close()
		s.Close()
		return err
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	tr.Register(srv)
	go srv.Serve(l)
	s.Start()
	c.mu.Lock()
	c.members[id] = &localSilo{silo: s, tr: tr, srv: srv}
	c.mu.Unlock()
	return nil
}

// Stop stops member id, as a crash would look to its peers.
func (c *LocalSilos) Stop(id uint64) error {
	c.mu.Lock()
	m := c.members[id]
	delete(c.members, id)
	c.mu.Unlock()
	if m == nil {
		return nil
	}
	m.srv.Stop()
	m.tr.Close()
	return m.silo.Close()
}

// Member is member id's Silo, or nil if it is stopped.
func (c *LocalSilos) Member(id uint64) *Silo {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.members[id]; m != nil {
		return m.silo
	}
	return nil
}

// Leader waits for a member whose engine leads and returns its id.
func (c *LocalSilos) Leader(within time.Duration) (uint64, *Silo, error) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		for id, m := range c.members {
			if m.silo.Leading() {
				c.mu.Unlock()
				return id, m.silo, nil
			}
		}
		c.mu.Unlock()
	}
	return 0, nil, errors.New("replication: no member leads")
}

// Close stops every member.
func (c *LocalSilos) Close() error {
	var errs []error
	for _, id := range c.peers {
		errs = append(errs, c.Stop(id))
	}
	return errors.Join(errs...)
}
