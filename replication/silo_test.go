package replication

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/grpcnet"
)

// siloCluster runs members of a replicated engine in this process, each
// with its own gRPC server and transport on loopback.
type siloCluster struct {
	t       *testing.T
	dir     string
	peers   []uint64
	addrs   map[transport.NodeID]string
	members map[uint64]*siloMember
}

type siloMember struct {
	silo *Silo
	tr   *grpcnet.Transport
	srv  *grpc.Server
}

func newSiloCluster(t *testing.T, n int) *siloCluster {
	c := &siloCluster{t: t, dir: t.TempDir(), addrs: map[transport.NodeID]string{}, members: map[uint64]*siloMember{}}
	for i := range n {
		id := uint64(i + 1)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.addrs[transport.NodeID(id)] = l.Addr().String()
		l.Close()
		c.peers = append(c.peers, id)
	}
	for _, id := range c.peers {
		c.start(id)
	}
	t.Cleanup(func() {
		for id := range c.members {
			c.stop(id)
		}
	})
	return c
}

func (c *siloCluster) start(id uint64) {
	dir := filepath.Join(c.dir, fmt.Sprint(id))
	s, err := OpenSilo(SiloConfig{
		Node: Config{ID: id, Peers: c.peers, Dir: dir, TickInterval: 20 * time.Millisecond, PreVote: true, CheckQuorum: true,
			SegmentSize: 4 << 20},
		Engine: engine.Config{Dir: filepath.Join(dir, "engine"), EpochInterval: 5 * time.Millisecond, CheckpointInterval: -1},
	})
	if err != nil {
		c.t.Fatalf("member %d: %v", id, err)
	}
	tr, err := grpcnet.New(grpcnet.Config{NodeID: transport.NodeID(id), ClusterID: "silo-test", Peers: c.addrs,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond}, s.Runner().Handler())
	if err != nil {
		c.t.Fatal(err)
	}
	s.Node().SetTransport(tr)
	var l net.Listener
	for deadline := time.Now().Add(5 * time.Second); ; {
		if l, err = net.Listen("tcp", c.addrs[transport.NodeID(id)]); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	srv := grpc.NewServer()
	tr.Register(srv)
	go srv.Serve(l)
	s.Start()
	c.members[id] = &siloMember{silo: s, tr: tr, srv: srv}
}

// stop stops a member as a crash would, as far as its peers can tell.
func (c *siloCluster) stop(id uint64) {
	m := c.members[id]
	delete(c.members, id)
	m.srv.Stop()
	m.tr.Close()
	if err := m.silo.Close(); err != nil {
		c.t.Logf("member %d: closing: %v", id, err)
	}
}

// leader waits for a member whose engine leads.
func (c *siloCluster) leader(within time.Duration) *siloMember {
	c.t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, m := range c.members {
			if m.silo.Leading() {
				return m
			}
		}
	}
	c.t.Fatal("no member leads")
	return nil
}

var siloTable = &storage.Table{Namespace: "s", Name: "kv", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
	Columns: []storage.Column{{Name: "v", Type: storage.TypeText}}}

// TestSiloFailover: three members; writers commit on the leader; the
// leader is stopped; a new one takes over within the election timeout
// and every commit acknowledged before is there, on every member, once
// the stopped one is back and has caught up.
func TestSiloFailover(t *testing.T) {
	ctx := context.Background()
	c := newSiloCluster(t, 3)
	first := c.leader(10 * time.Second)
	db := first.silo.DB()
	if err := db.CreateNamespace(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, siloTable); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		acked  = map[string]string{}
		cur    atomic.Pointer[siloMember]
		stopW  = make(chan struct{})
		wg     sync.WaitGroup
		errors atomic.Int64
	)
	cur.Store(first)
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopW:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%d", w, i), fmt.Sprint(i)
				err := cur.Load().silo.DB().Put(ctx, &storage.Put{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)},
					Values: storage.Values{"v": storage.Text(v)}})
				if err != nil {
					errors.Add(1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				mu.Lock()
				acked[k] = v
				mu.Unlock()
			}
		})
	}
	time.Sleep(700 * time.Millisecond)
	var oldID uint64
	for id, m := range c.members {
		if m == first {
			oldID = id
		}
	}
	killed := time.Now()
	c.stop(oldID)
	next := c.leader(5 * time.Second)
	failover := time.Since(killed)
	cur.Store(next)
	time.Sleep(700 * time.Millisecond)
	close(stopW)
	wg.Wait()
	mu.Lock()
	n := len(acked)
	mu.Unlock()
	t.Logf("failover in %v; %d commits acknowledged, %d attempts failed", failover, n, errors.Load())
	if n < 100 {
		t.Fatalf("only %d commits acknowledged", n)
	}
	if failover > 2*time.Second {
		t.Errorf("failover took %v", failover)
	}
	c.start(oldID)
	// Every acknowledged commit is on every member, the restarted one
	// included, once it has applied the log.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		missing := ""
		for id, m := range c.members {
			for k, v := range acked {
				row, ok, err := m.silo.DB().Get(ctx, &storage.Get{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)}})
				if err != nil || !ok || row["v"].AsText() != v {
					missing = fmt.Sprintf("member %d: %s: %v %v %v", id, k, ok, err, row)
					break
				}
			}
			if missing != "" {
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an acknowledged commit is missing: %s", missing)
		}
	}
	if len(c.members) != 3 {
		t.Fatalf("%d members", len(c.members))
	}
}
