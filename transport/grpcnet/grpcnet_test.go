package grpcnet_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/grpcnet"
	"github.com/kiroku-db/kiroku/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node is one running node: a gRPC server on 127.0.0.1 with a transport
// registered on it.
type node struct {
	id     transport.NodeID
	addr   string
	cfg    grpcnet.Config
	h      transport.Handler
	tr     *grpcnet.Transport
	srv    *grpc.Server
	served chan struct{}
}

// spec describes a node to start; tweak may change its config, which
// starts as a member of cluster "test" whose peers are all the nodes.
type spec struct {
	h     transport.Handler
	tweak func(c *grpcnet.Config, addrs map[transport.NodeID]string)
}

// start starts nodes 1..len(specs) and registers their stop with t.
func start(t *testing.T, specs ...spec) []*node {
	t.Helper()
	addrs := make(map[transport.NodeID]string)
	lis := make([]net.Listener, len(specs))
	for i := range specs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i] = l
		addrs[transport.NodeID(i+1)] = l.Addr().String()
	}
	nodes := make([]*node, len(specs))
	for i, s := range specs {
		id := transport.NodeID(i + 1)
		cfg := grpcnet.Config{NodeID: id, ClusterID: "test", Peers: addrs,
			BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
		if s.tweak != nil {
			cfg.Peers = clone(addrs)
			s.tweak(&cfg, addrs)
		}
		n := &node{id: id, addr: addrs[id], cfg: cfg, h: s.h}
		n.serve(t, lis[i])
		nodes[i] = n
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop(t)
		}
	})
	return nodes
}

func clone(m map[transport.NodeID]string) map[transport.NodeID]string {
	c := make(map[transport.NodeID]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (n *node) serve(t *testing.T, l net.Listener) {
	t.Helper()
	tr, err := grpcnet.New(n.cfg, n.h)
	if err != nil {
		t.Fatal(err)
	}
	n.tr, n.srv, n.served = tr, grpc.NewServer(), make(chan struct{})
	tr.Register(n.srv)
	go func() {
		defer close(n.served)
		_ = n.srv.Serve(l)
	}()
}

// stop closes the transport and stops the server; again is a no-op.
func (n *node) stop(t *testing.T) {
	if n.srv == nil {
		return
	}
	if err := n.tr.Close(); err != nil {
		t.Errorf("node %d: Close: %v", n.id, err)
	}
	n.srv.Stop()
	<-n.served
	n.srv = nil
}

// restart starts the node again on the same address, with handler h.
func (n *node) restart(t *testing.T, h transport.Handler) {
	t.Helper()
	var l net.Listener
	var err error
	for range 100 { // the port was just freed; take it back
		if l, err = net.Listen("tcp", n.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	n.h = h
	n.serve(t, l)
}

// wait polls done for up to 20 s.
func wait(done func() bool) bool {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if done() {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return done()
}

func cluster(nodes []*node) *transporttest.Cluster {
	c := &transporttest.Cluster{Drive: wait, Idle: func() { time.Sleep(300 * time.Millisecond) }}
	for _, n := range nodes {
		c.Nodes = append(c.Nodes, n.tr)
	}
	return c
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Harness{Start: func(t *testing.T, hs []transport.Handler) *transporttest.Cluster {
		specs := make([]spec, len(hs))
		for i, h := range hs {
			specs[i] = spec{h: h}
		}
		return cluster(start(t, specs...))
	}})
}

func numbered(i, size int) []byte {
	b := make([]byte, size)
	copy(b, fmt.Sprintf("m%06d", i))
	return b
}

func index(m []byte) int {
	var i int
	if _, err := fmt.Sscanf(string(m[:7]), "m%06d", &i); err != nil {
		panic(err)
	}
	return i
}

func TestBatching(t *testing.T) {
	r := &transporttest.Recorder{}
	batch := func(c *grpcnet.Config, _ map[transport.NodeID]string) { c.BatchBytes = 1024 }
	nodes := start(t, spec{h: &transporttest.Recorder{}, tweak: batch}, spec{h: r, tweak: batch})
	// 1000 messages of 100 bytes, queued at once: each takes 102 bytes in
	// a batch, so 10 fit in 1024 bytes.
	var msgs [][]byte
	for i := range 1000 {
		msgs = append(msgs, numbered(i, 100))
	}
	if err := nodes[0].tr.Send(2, msgs...); err != nil {
		t.Fatal(err)
	}
	if !wait(func() bool { return r.Count(1) == 1000 }) {
		t.Fatalf("%d of 1000 messages arrived", r.Count(1))
	}
	for i, m := range r.Messages(1) {
		if !bytes.Equal(m, msgs[i]) {
			t.Fatalf("message %d is %q, want %q", i, m[:7], msgs[i][:7])
		}
	}
	batches := r.Batches(1)
	if len(batches) != 100 {
		t.Fatalf("%d batches, want 100 of 10: %v", len(batches), batches)
	}
	for i, n := range batches {
		if n != 10 {
			t.Fatalf("batch %d has %d messages, want 10", i, n)
		}
	}
	// A message that cannot fit a batch is refused at once.
	if err := nodes[0].tr.Send(2, make([]byte, 1024)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("Send of a message over BatchBytes = %v", err)
	}
	if _, err := nodes[0].tr.Call(context.Background(), 2, make([]byte, 1024)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("Call with a request over BatchBytes = %v", err)
	}
}

// blockingHandler holds Receive, but for message 0's, until release is
// closed.
type blockingHandler struct {
	*transporttest.Recorder
	release chan struct{}
}

func (h *blockingHandler) Receive(from transport.NodeID, msgs [][]byte) {
	if index(msgs[0]) != 0 {
		<-h.release
	}
	h.Recorder.Receive(from, msgs)
}

func TestBackpressure(t *testing.T) {
	h := &blockingHandler{Recorder: &transporttest.Recorder{}, release: make(chan struct{})}
	small := func(c *grpcnet.Config, _ map[transport.NodeID]string) {
		c.QueueBytes, c.BatchBytes = 64<<10, 16<<10
	}
	nodes := start(t, spec{h: &transporttest.Recorder{}, tweak: small}, spec{h: h, tweak: small})
	defer func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	}()
	// Message 0 opens the stream. Then the receiver's handler stalls, so
	// its stream stalls once gRPC's flow control windows are full, then
	// the sender, then the queue fills.
	if err := nodes[0].tr.Send(2, numbered(0, 8<<10)); err != nil {
		t.Fatal(err)
	}
	if !wait(func() bool { return h.Count(1) == 1 }) {
		t.Fatal("message 0 did not arrive")
	}
	accepted := []int{0}
	refused := -1
	for i := 1; i < 20000 && refused < 0; i++ {
		done := make(chan error, 1)
		go func() { done <- nodes[0].tr.Send(2, numbered(i, 8<<10)) }()
		select {
		case err := <-done:
			switch {
			case err == nil:
				accepted = append(accepted, i)
			case errors.Is(err, transport.ErrBackpressure):
				refused = i
			default:
				t.Fatalf("Send %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Send %d blocked", i)
		}
	}
	if refused < 0 {
		t.Fatal("160 MiB sent to a stalled peer, and no ErrBackpressure")
	}
	// What was refused was not queued: after the stall, exactly the
	// accepted messages arrive, in order.
	close(h.release)
	if !wait(func() bool { return h.Count(1) >= len(accepted) }) {
		t.Fatalf("%d of %d accepted messages arrived", h.Count(1), len(accepted))
	}
	time.Sleep(100 * time.Millisecond)
	got := h.Messages(1)
	if len(got) != len(accepted) {
		t.Fatalf("%d messages arrived, %d were accepted", len(got), len(accepted))
	}
	for k, m := range got {
		if index(m) != accepted[k] {
			t.Fatalf("arrival %d is message %d, want %d", k, index(m), accepted[k])
		}
	}
	t.Logf("ErrBackpressure after %d messages of 8 KiB", refused)
}

// unreachable records OnUnreachable's reports.
type unreachable struct {
	mu      sync.Mutex
	errs    []error
	dropped int
}

func (u *unreachable) report(_ transport.NodeID, dropped int, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.errs = append(u.errs, err)
	u.dropped += dropped
}

func (u *unreachable) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.errs)
}

func (u *unreachable) last() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.errs) == 0 {
		return nil
	}
	return u.errs[len(u.errs)-1]
}

func TestReconnect(t *testing.T) {
	var u unreachable
	r := &transporttest.Recorder{}
	nodes := start(t, spec{h: &transporttest.Recorder{}, tweak: func(c *grpcnet.Config, _ map[transport.NodeID]string) {
		c.OnUnreachable = u.report
	}}, spec{h: r})
	a := nodes[0].tr
	if err := a.Send(2, numbered(0, 10)); err != nil {
		t.Fatal(err)
	}
	if !wait(func() bool { return r.Count(1) == 1 }) {
		t.Fatal("the first message did not arrive")
	}

	nodes[1].stop(t)
	i := 1
	// The sender notices the stream broke (while idle, thanks to its
	// watcher) and fails to reconnect while the peer is down.
	if !wait(func() bool { return u.count() >= 2 }) {
		t.Fatalf("%d unreachable reports while the peer is down", u.count())
	}
	for ; i < 20; i++ { // sent while down: dropped, or delivered after the restart
		if err := a.Send(2, numbered(i, 10)); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.last(); !errors.Is(err, transport.ErrUnreachable) {
		t.Fatalf("the report of a down peer is %v, want ErrUnreachable", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Call(ctx, 2, []byte("x")); !errors.Is(err, transport.ErrUnreachable) {
		t.Fatalf("Call to a down peer = %v, want ErrUnreachable", err)
	}

	r2 := &transporttest.Recorder{}
	nodes[1].restart(t, r2)
	if !wait(func() bool {
		if err := a.Send(2, numbered(i, 10)); err != nil {
			t.Fatal(err)
		}
		i++
		time.Sleep(5 * time.Millisecond)
		return r2.Count(1) > 0
	}) {
		t.Fatal("no message reached the restarted peer")
	}
	// Reconnected: what is sent now arrives, all of it, in order.
	first := i
	for ; i < first+200; i++ {
		if err := a.Send(2, numbered(i, 10)); err != nil {
			t.Fatal(err)
		}
	}
	if !wait(func() bool { m := r2.Messages(1); return len(m) > 0 && index(m[len(m)-1]) == first+199 }) {
		t.Fatal("the messages sent after reconnecting did not all arrive")
	}
	prev, count := -1, 0
	for _, m := range r2.Messages(1) {
		k := index(m)
		if k <= prev {
			t.Fatalf("message %d after %d: reordered or duplicated across the reconnection", k, prev)
		}
		if k >= first {
			count++
		}
		prev = k
	}
	if count != 200 {
		t.Fatalf("%d of the 200 messages sent after reconnecting arrived", count)
	}
	if got := r.Count(1); got != 1 {
		t.Fatalf("the first incarnation got %d messages", got)
	}
}

func TestLargeStream(t *testing.T) {
	r := &transporttest.Recorder{}
	nodes := start(t, spec{h: &transporttest.Recorder{}}, spec{h: r})
	data := transporttest.Payload(8, 8<<20+3)
	if err := nodes[0].tr.SendStream(context.Background(), 2, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	s := r.Streams(1)
	if len(s) != 1 || !bytes.Equal(s[0].Data, data) {
		t.Fatal("the stream did not arrive whole")
	}
	if s[0].MaxRead > 256<<10 || s[0].Reads < 33 {
		t.Fatalf("read in %d reads of at most %d bytes; chunks are 256 KiB", s[0].Reads, s[0].MaxRead)
	}

	// A sender whose chunks exceed the receiver's ChunkBytes is refused.
	big := start(t, spec{h: &transporttest.Recorder{}, tweak: func(c *grpcnet.Config, _ map[transport.NodeID]string) {
		c.ChunkBytes = 512 << 10
	}}, spec{h: r})
	err := big[0].tr.SendStream(context.Background(), 2, bytes.NewReader(data))
	if !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("chunks over the receiver's ChunkBytes: %v", err)
	}
}

// refused checks that node from's traffic to node to is refused with
// want, and that to's handler never sees it.
func refused(t *testing.T, nodes []*node, u *unreachable, from, to int, want error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, h := nodes[from-1].tr, nodes[to-1].h.(*transporttest.Recorder)
	peer := transport.NodeID(to)
	if _, err := tr.Call(ctx, peer, []byte("x")); !errors.Is(err, want) {
		t.Errorf("Call: %v, want %v", err, want)
	}
	if err := tr.SendStream(ctx, peer, bytes.NewReader([]byte("snapshot"))); !errors.Is(err, want) {
		t.Errorf("SendStream: %v, want %v", err, want)
	}
	if err := tr.Send(peer, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !wait(func() bool { return u.count() > 0 }) {
		t.Fatal("a refused stream was not reported")
	}
	if err := u.last(); !errors.Is(err, want) {
		t.Errorf("the refused stream was reported with %v, want %v", err, want)
	}
	var re *transport.RemoteError
	if err := u.last(); !errors.As(err, &re) || re.Peer != peer {
		t.Errorf("the refusal is %#v, not a RemoteError from %d", err, peer)
	}
	time.Sleep(100 * time.Millisecond)
	if h.Count(transport.NodeID(from)) != 0 || h.Serves() != 0 || len(h.Streams(transport.NodeID(from))) != 0 {
		t.Errorf("the refused node's traffic reached the handler")
	}
}

func TestWrongCluster(t *testing.T) {
	var u unreachable
	nodes := start(t, spec{h: &transporttest.Recorder{}}, spec{h: &transporttest.Recorder{}},
		spec{h: &transporttest.Recorder{}, tweak: func(c *grpcnet.Config, _ map[transport.NodeID]string) {
			c.ClusterID, c.OnUnreachable = "other", u.report
		}})
	refused(t, nodes, &u, 3, 1, transport.ErrWrongCluster)
}

func TestUnknownPeer(t *testing.T) {
	var u unreachable
	notThree := func(c *grpcnet.Config, _ map[transport.NodeID]string) { delete(c.Peers, 3) }
	nodes := start(t, spec{h: &transporttest.Recorder{}, tweak: notThree}, spec{h: &transporttest.Recorder{}, tweak: notThree},
		spec{h: &transporttest.Recorder{}, tweak: func(c *grpcnet.Config, _ map[transport.NodeID]string) {
			c.OnUnreachable = u.report
		}})
	refused(t, nodes, &u, 3, 1, transport.ErrUnknownPeer)
	if err := nodes[0].tr.Send(3, []byte("x")); !errors.Is(err, transport.ErrUnknownPeer) {
		t.Fatalf("Send to a node not among the peers = %v", err)
	}
}

func TestWrongNode(t *testing.T) {
	var u unreachable
	nodes := start(t, spec{h: &transporttest.Recorder{}}, spec{h: &transporttest.Recorder{}},
		spec{h: &transporttest.Recorder{}, tweak: func(c *grpcnet.Config, addrs map[transport.NodeID]string) {
			c.Peers[2], c.OnUnreachable = addrs[1], u.report // node 3 thinks node 2 is where node 1 is
		}})
	refused(t, nodes, &u, 3, 2, transport.ErrWrongNode)
	if h := nodes[0].h.(*transporttest.Recorder); h.Count(3) != 0 || h.Serves() != 0 {
		t.Fatal("traffic for node 2 reached node 1's handler")
	}
}

// TestCloseEndsEverything: Close ends calls and streams in flight, on
// both sides, and leaves no goroutine behind.
func TestCloseEndsEverything(t *testing.T) {
	served := make(chan struct{}, 8)
	blockServe := &transporttest.Recorder{
		ServeFunc: func(ctx context.Context, _ transport.NodeID, _ []byte) ([]byte, error) {
			served <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		},
		StreamFunc: func(ctx context.Context, _ transport.NodeID, r io.Reader) error {
			served <- struct{}{}
			_, err := io.Copy(io.Discard, r) // the sender never finishes
			return err
		},
	}
	nodes := start(t, spec{h: &transporttest.Recorder{}}, spec{h: blockServe}, spec{h: &transporttest.Recorder{}})
	a := nodes[0].tr

	// The server closes while a call and a stream are in its handler.
	callErr := make(chan error, 1)
	go func() { _, err := a.Call(context.Background(), 2, []byte("x")); callErr <- err }()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { // a snapshot that never ends, until pw is closed
		for {
			if _, err := pw.Write(make([]byte, 1024)); err != nil {
				return
			}
		}
	}()
	streamErr := make(chan error, 1)
	go func() { streamErr <- a.SendStream(context.Background(), 2, pr) }()
	<-served
	<-served
	closed := make(chan error, 1)
	go func() { closed <- nodes[1].tr.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the handlers forever")
	}
	if err := <-callErr; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("a call whose server closed = %v, want ErrClosed", err)
	}
	if err := <-streamErr; err == nil {
		t.Fatal("a stream whose receiver closed succeeded")
	}

	// The caller closes while its call waits.
	nodes[2].stop(t)
	nodes[2].restart(t, &transporttest.Recorder{ServeFunc: blockServe.ServeFunc})
	go func() { _, err := a.Call(context.Background(), 3, []byte("x")); callErr <- err }()
	<-served
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-callErr; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("a call of a closed transport = %v, want ErrClosed", err)
	}

	for _, n := range nodes {
		n.stop(t)
	}
	pw.Close()
	goleak.VerifyNone(t)
}

func TestConfigValidate(t *testing.T) {
	peers := map[transport.NodeID]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"}
	for name, c := range map[string]grpcnet.Config{
		"no node id":      {ClusterID: "c", Peers: peers},
		"no cluster":      {NodeID: 1, Peers: peers},
		"bad cluster":     {NodeID: 1, ClusterID: "a\nb", Peers: peers},
		"peer 0":          {NodeID: 1, ClusterID: "c", Peers: map[transport.NodeID]string{0: "x"}},
		"no address":      {NodeID: 1, ClusterID: "c", Peers: map[transport.NodeID]string{2: ""}},
		"queue < batch":   {NodeID: 1, ClusterID: "c", QueueBytes: 1000, BatchBytes: 2000},
		"negative":        {NodeID: 1, ClusterID: "c", ChunkBytes: -1},
		"jitter too high": {NodeID: 1, ClusterID: "c", BackoffJitter: 1},
	} {
		if err := c.Validate(); !errors.Is(err, transport.ErrConfig) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	c := grpcnet.Config{NodeID: 1, ClusterID: "c", Peers: peers}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.QueueBytes != 16<<20 || c.BatchBytes != 1<<20 || c.ChunkBytes != 256<<10 || c.BackoffBase != 100*time.Millisecond ||
		c.BackoffMax != 5*time.Second || c.BackoffJitter != 0.2 || c.Clock == nil || c.Logger == nil {
		t.Fatalf("defaults not filled: %+v", c)
	}
	if _, err := grpcnet.New(c, nil); !errors.Is(err, transport.ErrConfig) {
		t.Fatalf("New with a nil handler = %v", err)
	}
}

// TestAddPeer: a node accepts traffic only from the peers it knows; once
// it adds a peer, that peer's messages arrive and it can send to it. A
// peer added again at another address is refused.
func TestAddPeer(t *testing.T) {
	rec := &transporttest.Recorder{}
	nodes := start(t, spec{h: &transporttest.Recorder{}}, spec{h: rec, tweak: func(c *grpcnet.Config, addrs map[transport.NodeID]string) {
		delete(c.Peers, 1) // node 2 does not know node 1 yet
	}})
	a, b := nodes[0], nodes[1]
	if err := b.tr.Send(1, []byte("x")); !errors.Is(err, transport.ErrUnknownPeer) {
		t.Fatalf("sending to an unknown peer: %v, want ErrUnknownPeer", err)
	}
	if _, err := a.tr.Call(context.Background(), 2, []byte("q")); !errors.Is(err, transport.ErrUnknownPeer) {
		t.Fatalf("a call from a peer the receiver does not know: %v, want its refusal", err)
	}
	if err := b.tr.AddPeer(1, a.addr); err != nil {
		t.Fatal(err)
	}
	if err := b.tr.AddPeer(1, a.addr); err != nil {
		t.Fatalf("adding a peer again at its address: %v", err)
	}
	if err := b.tr.AddPeer(1, "127.0.0.1:1"); !errors.Is(err, transport.ErrConfig) {
		t.Fatalf("adding a peer at another address: %v, want ErrConfig", err)
	}
	if err := a.tr.Send(2, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); rec.Count(1) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the added peer's message did not arrive")
		}
	}
	if err := b.tr.Send(1, []byte("back")); err != nil {
		t.Fatalf("sending to the added peer: %v", err)
	}
}
