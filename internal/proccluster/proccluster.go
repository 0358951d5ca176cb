// Package proccluster runs a cluster of `kiroku server` processes on
// loopback, for the clustered demo and for tests that kill, pause and
// partition real processes. Each member is a child process with its own
// data directory (holding the keys all members share) and log file.
// Members reach each other through fault-injecting TCP proxies, one per
// ordered pair, when Config.Proxies is set: Isolate cuts a member off
// from its peers (clients still reach it), Heal joins them again.
package proccluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/server"
)

// Config describes a cluster to start.
type Config struct {
	// Exe is the kiroku binary; Env is added to each child's environment.
	Exe string
	Env []string
	// Nodes is how many members (3 or 5, usually).
	Nodes int
	// Dir holds each member's data directory and log (Dir/N, Dir/N.log).
	Dir string
	// AdminToken is given to every member (KIROKU_ADMIN_TOKEN).
	AdminToken string
	// Proxies routes each member's traffic to each peer through a proxy
	// that Isolate can cut.
	Proxies bool
	// Args are added to each member's command line (--raft-tick, ...).
	Args []string
}

// Cluster is a running cluster.
type Cluster struct {
	cfg   Config
	addrs map[uint64]string // each member's own address (its clients')
	mu    sync.Mutex
	procs map[uint64]*exec.Cmd
	exits map[uint64]chan struct{}
	// proxies[from][to] carries member from's traffic to member to.
	proxies map[uint64]map[uint64]*Proxy
}

// Start starts the members and waits until each answers.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	c := &Cluster{cfg: cfg, addrs: map[uint64]string{}, procs: map[uint64]*exec.Cmd{}, exits: map[uint64]chan struct{}{},
		proxies: map[uint64]map[uint64]*Proxy{}}
	ls := make([]net.Listener, cfg.Nodes)
	for i := range cfg.Nodes {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls[i] = l
		c.addrs[uint64(i+1)] = l.Addr().String()
	}
	// The members' ports are held until the proxies have theirs, so that
	// no proxy takes a member's.
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	if cfg.Proxies {
		for from := range c.addrs {
			c.proxies[from] = map[uint64]*Proxy{}
			for to, addr := range c.addrs {
				if from == to {
					continue
				}
				p, err := NewProxy(addr)
				if err != nil {
					c.Close()
					return nil, err
				}
				c.proxies[from][to] = p
			}
		}
	}
	shared := filepath.Join(cfg.Dir, "keys-template")
	if _, err := server.InitKeys(shared, auth.SchemeECDSA); err != nil {
		c.Close()
		return nil, err
	}
	for id := range c.addrs {
		if err := copyKeys(filepath.Join(shared, "keys"), filepath.Join(c.DataDir(id), "keys")); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, l := range ls {
		l.Close()
	}
	for _, id := range c.IDs() {
		if err := c.Start(id); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, id := range c.IDs() {
		if err := c.WaitUp(ctx, id); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func copyKeys(from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	for _, n := range []string{"ledger-ecdsa.pem", "secrets.key"} {
		b, err := os.ReadFile(filepath.Join(from, n))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, n), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// IDs are the members' ids, in order.
func (c *Cluster) IDs() []uint64 {
	var ids []uint64
	for id := range c.addrs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Addr is member id's address.
func (c *Cluster) Addr(id uint64) string { return c.addrs[id] }

// Servers is every member's address, comma-separated: a client's server
// list.
func (c *Cluster) Servers() string {
	var out []string
	for _, id := range c.IDs() {
		out = append(out, c.addrs[id])
	}
	return strings.Join(out, ",")
}

// DataDir is member id's data directory.
func (c *Cluster) DataDir(id uint64) string {
	return filepath.Join(c.cfg.Dir, strconv.FormatUint(id, 10))
}

// LogFile is where member id's output goes.
func (c *Cluster) LogFile(id uint64) string {
	return filepath.Join(c.cfg.Dir, fmt.Sprintf("%d.log", id))
}

// peersFor is member id's --peers: its own address, and its proxies to
// the others (or their addresses).
func (c *Cluster) peersFor(id uint64) string {
	var out []string
	for _, p := range c.IDs() {
		a := c.addrs[p]
		if px := c.proxies[id][p]; px != nil {
			a = px.Addr()
		}
		out = append(out, fmt.Sprintf("%d=%s", p, a))
	}
	return strings.Join(out, ",")
}

// Start starts member id (again).
func (c *Cluster) Start(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.procs[id] != nil {
		return fmt.Errorf("proccluster: member %d runs already", id)
	}
	logf, err := os.OpenFile(c.LogFile(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append([]string{"server", "--node-id", strconv.FormatUint(id, 10), "--peers", c.peersFor(id),
		"--data-dir", c.DataDir(id), "--listen", c.addrs[id], "--cluster-id", "proccluster"}, c.cfg.Args...)
	cmd := exec.Command(c.cfg.Exe, args...)
	cmd.Env = append(append(os.Environ(), c.cfg.Env...), "KIROKU_ADMIN_TOKEN="+c.cfg.AdminToken)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no orphan outlives the test
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	c.procs[id], c.exits[id] = cmd, exited
	return nil
}

// WaitUp waits until member id answers a status call. A member that
// runs and still does not answer when ctx ends is sent SIGQUIT, and the
// error carries its log with the stacks of its goroutines in kiroku's
// code: what it was stuck on.
func (c *Cluster) WaitUp(ctx context.Context, id uint64) error {
	var last error
	for {
		_, err := c.Status(ctx, id)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = err // (not the one the deadline cut short)
		}
		c.mu.Lock()
		cmd, exited := c.procs[id], c.exits[id]
		c.mu.Unlock()
		select {
		case <-exited:
			b, _ := os.ReadFile(c.LogFile(id))
			return fmt.Errorf("proccluster: member %d exited:\n%s", id, tail(string(b), 2000))
		case <-ctx.Done():
			dump := ""
			if cmd != nil {
				_ = cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-exited:
				case <-time.After(5 * time.Second):
				}
				b, _ := os.ReadFile(c.LogFile(id))
				log, stacks, _ := strings.Cut(string(b), "SIGQUIT: quit")
				dump = "\n" + tail(log, 6000) + "\n" + ownStacks(stacks)
			}
			return fmt.Errorf("proccluster: member %d did not answer (last: %v): %w%s", id, last, ctx.Err(), dump)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ownStacks keeps, of a Go traceback of every goroutine, the goroutines
// with a frame in kiroku's own packages.
func ownStacks(dump string) string {
	var out []string
	for _, g := range strings.Split(dump, "\n\n") {
		if strings.Contains(g, "github.com/kiroku-db/kiroku/") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Kill kills member id with SIGKILL and waits for it to be gone.
func (c *Cluster) Kill(id uint64) error { return c.signalStop(id, syscall.SIGKILL) }

// Stop stops member id with SIGTERM (a graceful stop) and waits.
func (c *Cluster) Stop(id uint64) error { return c.signalStop(id, syscall.SIGTERM) }

func (c *Cluster) signalStop(id uint64, sig syscall.Signal) error {
	c.mu.Lock()
	cmd, exited := c.procs[id], c.exits[id]
	delete(c.procs, id)
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused member cannot stop
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	return nil
}

// Running reports whether member id's process runs (it may be paused).
func (c *Cluster) Running(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[id] != nil
}

// Pause stops member id's process with SIGSTOP; Resume continues it.
func (c *Cluster) Pause(id uint64) error  { return c.signal(id, syscall.SIGSTOP) }
func (c *Cluster) Resume(id uint64) error { return c.signal(id, syscall.SIGCONT) }

func (c *Cluster) signal(id uint64, sig syscall.Signal) error {
	c.mu.Lock()
	cmd := c.procs[id]
	c.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("proccluster: member %d does not run", id)
	}
	return cmd.Process.Signal(sig)
}

// Isolate cuts member id off from its peers, both ways (its clients still
// reach it). It needs Config.Proxies.
func (c *Cluster) Isolate(id uint64) {
	for from, m := range c.proxies {
		for to, p := range m {
			if from == id || to == id {
				p.SetBlocked(true)
			}
		}
	}
}

// Heal joins every member to every other again.
func (c *Cluster) Heal() {
	for _, m := range c.proxies {
		for _, p := range m {
			p.SetBlocked(false)
		}
	}
}

func (c *Cluster) dial(id uint64) (*grpc.ClientConn, api.ClusterClient, error) {
	conn, err := grpc.NewClient(c.addrs[id], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, api.NewClusterClient(conn), nil
}

// Status is member id's view of the cluster.
func (c *Cluster) Status(ctx context.Context, id uint64) (*api.ClusterStatus, error) {
	conn, cc, err := c.dial(id)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return cc.Status(ctx, &api.ClusterStatusRequest{})
}

// Leader waits for a member that leads and serves, and returns its id.
func (c *Cluster) Leader(ctx context.Context) (uint64, error) {
	for {
		for _, id := range c.IDs() {
			if !c.Running(id) {
				continue
			}
			if st, err := c.Status(ctx, id); err == nil && st.Serving {
				return id, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("proccluster: no member serves: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TransferLeader hands the leadership to member to, retrying through
// elections until ctx ends.
func (c *Cluster) TransferLeader(ctx context.Context, to uint64) error {
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.cfg.AdminToken)
	for {
		lead, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		if lead == to {
			return nil
		}
		conn, cc, err := c.dial(lead)
		if err != nil {
			return err
		}
		_, err = cc.TransferLeader(actx, &api.TransferLeaderRequest{NodeId: to})
		conn.Close()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("proccluster: transfer to %d: %w (last: %v)", to, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close kills every member and closes the proxies.
func (c *Cluster) Close() {
	for _, id := range c.IDs() {
		_ = c.Kill(id)
	}
	for _, m := range c.proxies {
		for _, p := range m {
			p.Close()
		}
	}
}

// ---- the proxy ------------------------------------------------------------

// Proxy forwards TCP connections to a target; blocked, it cuts the
// connections it carries and refuses new ones.
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	block  bool
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on a loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// SetBlocked cuts (true) or restores (false) the link.
func (p *Proxy) SetBlocked(b bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.block = b
	if b {
		for c := range p.conns {
			c.Close()
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.block || p.closed {
			p.mu.Unlock()
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Close stops the proxy and cuts its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.l.Close()
	p.SetBlocked(true)
	p.wg.Wait()
}
