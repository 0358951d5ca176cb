// Package transporttest is the conformance suite of transport.Transport:
// the behaviour every implementation shares on a network without faults
// (order, calls, streams, refusals, Close). Each implementation runs it
// through a Harness; what an implementation does under faults is tested
// beside it.
package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/transport"
)

// Harness makes clusters of an implementation.
type Harness struct {
	// Start makes nodes 1..len(handlers), node i+1 served by handlers[i],
	// all peers of each other, and registers their cleanup with t.
	Start func(t *testing.T, handlers []transport.Handler) *Cluster
}

// Cluster is a running cluster.
type Cluster struct {
	// Nodes[i] is node i+1's transport.
	Nodes []transport.Transport
	// Drive lets the network run until done returns true, and reports
	// whether it did before the harness gave up (memnet steps its clock;
	// grpcnet waits in real time).
	Drive func(done func() bool) bool
	// Idle lets the network run for a while with nothing to wait for, to
	// show that something does not happen.
	Idle func()
}

// Stream is what a Recorder's ReceiveStream read.
type Stream struct {
	Data    []byte
	Reads   int // Read calls that returned bytes
	MaxRead int // the most bytes one Read returned
}

// Recorder is a Handler that records what it receives. Serve echoes the
// request and ReceiveStream reads everything, unless ServeFunc or
// StreamFunc, set before use, say otherwise.
type Recorder struct {
	ServeFunc  func(ctx context.Context, from transport.NodeID, req []byte) ([]byte, error)
	StreamFunc func(ctx context.Context, from transport.NodeID, r io.Reader) error

	mu      sync.Mutex
	msgs    map[transport.NodeID][][]byte
	batches map[transport.NodeID][]int
	streams map[transport.NodeID][]Stream
	serves  int
}

var _ transport.Handler = (*Recorder)(nil)

// Receive records msgs.
func (r *Recorder) Receive(from transport.NodeID, msgs [][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.msgs == nil {
		r.msgs = make(map[transport.NodeID][][]byte)
		r.batches = make(map[transport.NodeID][]int)
	}
	r.msgs[from] = append(r.msgs[from], msgs...)
	r.batches[from] = append(r.batches[from], len(msgs))
}

// Serve counts the call and echoes req, or runs ServeFunc.
func (r *Recorder) Serve(ctx context.Context, from transport.NodeID, req []byte) ([]byte, error) {
	r.mu.Lock()
	r.serves++
	r.mu.Unlock()
	if r.ServeFunc != nil {
		return r.ServeFunc(ctx, from, req)
	}
	return req, nil
}

// ReceiveStream reads r to its end and records it, or runs StreamFunc.
func (r *Recorder) ReceiveStream(ctx context.Context, from transport.NodeID, rd io.Reader) error {
	if r.StreamFunc != nil {
		return r.StreamFunc(ctx, from, rd)
	}
	var s Stream
	buf := make([]byte, 4<<20)
	for {
		n, err := rd.Read(buf)
		if n > 0 {
			s.Data = append(s.Data, buf[:n]...)
			s.Reads++
			s.MaxRead = max(s.MaxRead, n)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.streams == nil {
		r.streams = make(map[transport.NodeID][]Stream)
	}
	r.streams[from] = append(r.streams[from], s)
	return nil
}

// Messages is a copy of what peer from's messages received so far.
func (r *Recorder) Messages(from transport.NodeID) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs[from])
}

// Batches is the sizes of the batches received from peer from.
func (r *Recorder) Batches(from transport.NodeID) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches[from])
}

// Count is the number of messages received from peer from.
func (r *Recorder) Count(from transport.NodeID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs[from])
}

// Streams is what ReceiveStream recorded from peer from.
func (r *Recorder) Streams(from transport.NodeID) []Stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.streams[from])
}

// Serves is how many requests Serve got.
func (r *Recorder) Serves() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serves
}

// Await runs f on a goroutine while c's network runs, and returns its
// result; it fails t if the network gave up first.
func Await[T any](t testing.TB, c *Cluster, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	var v T
	got := false
	if !c.Drive(func() bool {
		if !got {
			select {
			case v = <-ch:
				got = true
			default:
				runtime.Gosched()
			}
		}
		return got
	}) {
		t.Fatal("transporttest: the network gave up before the call returned")
	}
	return v
}

// Payload is n deterministic pseudo-random bytes.
func Payload(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// Msg is the i-th numbered test message.
func Msg(i int) []byte { return fmt.Appendf(nil, "m%06d", i) }

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("SendInOrder", func(t *testing.T) { testSendInOrder(t, h) })
	t.Run("Call", func(t *testing.T) { testCall(t, h) })
	t.Run("Stream", func(t *testing.T) { testStream(t, h) })
	t.Run("BadPeer", func(t *testing.T) { testBadPeer(t, h) })
	t.Run("Close", func(t *testing.T) { testClose(t, h) })
}

func recorders(n int) ([]*Recorder, []transport.Handler) {
	rs := make([]*Recorder, n)
	hs := make([]transport.Handler, n)
	for i := range rs {
		rs[i] = &Recorder{}
		hs[i] = rs[i]
	}
	return rs, hs
}

// testSendInOrder: every message arrives once, in order, per peer.
func testSendInOrder(t *testing.T, h Harness) {
	rs, hs := recorders(3)
	c := h.Start(t, hs)
	const n = 600
	for i := 0; i < n; {
		k := 1 + i%5 // Sends of 1 to 5 messages
		var to2, to3 [][]byte
		for j := i; j < min(i+k, n); j++ {
			to2 = append(to2, Msg(j))
			to3 = append(to3, Msg(n+j))
		}
		if err := c.Nodes[0].Send(2, to2...); err != nil {
			t.Fatalf("Send to 2: %v", err)
		}
		if err := c.Nodes[0].Send(3, to3...); err != nil {
			t.Fatalf("Send to 3: %v", err)
		}
		if err := c.Nodes[1].Send(3, to2...); err != nil {
			t.Fatalf("Send from 2 to 3: %v", err)
		}
		i += len(to2)
	}
	if !c.Drive(func() bool { return rs[1].Count(1) == n && rs[2].Count(1) == n && rs[2].Count(2) == n }) {
		t.Fatalf("got %d, %d and %d messages of %d", rs[1].Count(1), rs[2].Count(1), rs[2].Count(2), n)
	}
	c.Idle()
	for _, check := range []struct {
		r    *Recorder
		from transport.NodeID
		base int
	}{{rs[1], 1, 0}, {rs[2], 1, n}, {rs[2], 2, 0}} {
		got := check.r.Messages(check.from)
		if len(got) != n {
			t.Fatalf("from %d: %d messages, want %d (duplicates?)", check.from, len(got), n)
		}
		for i, m := range got {
			if want := Msg(check.base + i); !bytes.Equal(m, want) {
				t.Fatalf("from %d: message %d is %q, want %q", check.from, i, m, want)
			}
		}
	}
	if got := rs[0].Count(2) + rs[0].Count(3); got != 0 {
		t.Fatalf("node 1 received %d messages; nobody sent it any", got)
	}
}

// testCall: a reply comes back; a Serve error comes back as a RemoteError.
func testCall(t *testing.T, h Harness) {
	rs, hs := recorders(2)
	rs[1].ServeFunc = func(_ context.Context, from transport.NodeID, req []byte) ([]byte, error) {
		if string(req) == "fail" {
			return nil, errors.New("no such key")
		}
		return fmt.Appendf(nil, "%d said %s", from, req), nil
	}
	c := h.Start(t, hs)
	type result struct {
		reply []byte
		err   error
	}
	call := func(req string) result {
		return Await(t, c, func() result {
			b, err := c.Nodes[0].Call(context.Background(), 2, []byte(req))
			return result{b, err}
		})
	}
	if r := call("hello"); r.err != nil || string(r.reply) != "1 said hello" {
		t.Fatalf("Call = %q, %v", r.reply, r.err)
	}
	r := call("fail")
	var re *transport.RemoteError
	if !errors.Is(r.err, transport.ErrRemote) || !errors.As(r.err, &re) || re.Peer != 2 || re.Msg != "no such key" {
		t.Fatalf("Call of a failing Serve = %q, %v; want a RemoteError from 2 saying %q", r.reply, r.err, "no such key")
	}
	if errors.Is(r.err, transport.ErrWrongCluster) {
		t.Fatalf("a handler's error matches ErrWrongCluster: %v", r.err)
	}
	// Calls run concurrently and each gets its own reply.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fmt.Sprintf("c%d", i)
			b, err := c.Nodes[0].Call(context.Background(), 2, []byte(req))
			if err == nil && string(b) != "1 said "+req {
				err = fmt.Errorf("reply %q to %q", b, req)
			}
			errs <- err
		}()
	}
	Await(t, c, func() int { wg.Wait(); return 0 })
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// testStream: a payload of several chunks arrives whole, read in pieces;
// the receiver's error comes back.
func testStream(t *testing.T, h Harness) {
	rs, hs := recorders(2)
	c := h.Start(t, hs)
	data := Payload(1, 3<<20+12345)
	if err := Await(t, c, func() error {
		return c.Nodes[0].SendStream(context.Background(), 2, bytes.NewReader(data))
	}); err != nil {
		t.Fatalf("SendStream: %v", err)
	}
	s := rs[1].Streams(1)
	if len(s) != 1 || !bytes.Equal(s[0].Data, data) {
		t.Fatalf("received %d streams; want one of %d bytes, equal to what was sent", len(s), len(data))
	}
	if s[0].Reads < 2 || s[0].MaxRead >= len(data) {
		t.Fatalf("the stream was read in %d reads of at most %d bytes: not in chunks", s[0].Reads, s[0].MaxRead)
	}
	// An empty stream is a stream too.
	if err := Await(t, c, func() error {
		return c.Nodes[0].SendStream(context.Background(), 2, bytes.NewReader(nil))
	}); err != nil {
		t.Fatalf("SendStream of nothing: %v", err)
	}
	if s := rs[1].Streams(1); len(s) != 2 || len(s[1].Data) != 0 {
		t.Fatalf("the empty stream arrived as %d streams", len(s))
	}

	rs[1].StreamFunc = func(_ context.Context, _ transport.NodeID, r io.Reader) error {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return err
		}
		return errors.New("snapshot corrupt")
	}
	err := Await(t, c, func() error {
		return c.Nodes[0].SendStream(context.Background(), 2, bytes.NewReader(data[:100<<10]))
	})
	var re *transport.RemoteError
	if !errors.Is(err, transport.ErrRemote) || !errors.As(err, &re) || re.Msg != "snapshot corrupt" {
		t.Fatalf("SendStream to a failing receiver = %v", err)
	}
	// A failing reader fails the sender with its error.
	bad := errors.New("disk gone")
	err = Await(t, c, func() error {
		return c.Nodes[0].SendStream(context.Background(), 2, io.MultiReader(bytes.NewReader(data[:1000]), errReader{bad}))
	})
	if !errors.Is(err, bad) {
		t.Fatalf("SendStream of a failing reader = %v, want %v", err, bad)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// testBadPeer: node 0 and oneself are no peers.
func testBadPeer(t *testing.T, h Harness) {
	_, hs := recorders(2)
	c := h.Start(t, hs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, to := range []transport.NodeID{0, 1} {
		if err := c.Nodes[0].Send(to, []byte("x")); !errors.Is(err, transport.ErrUnknownPeer) {
			t.Errorf("Send to %d = %v, want ErrUnknownPeer", to, err)
		}
		if _, err := c.Nodes[0].Call(ctx, to, []byte("x")); !errors.Is(err, transport.ErrUnknownPeer) {
			t.Errorf("Call to %d = %v, want ErrUnknownPeer", to, err)
		}
		if err := c.Nodes[0].SendStream(ctx, to, bytes.NewReader(nil)); !errors.Is(err, transport.ErrUnknownPeer) {
			t.Errorf("SendStream to %d = %v, want ErrUnknownPeer", to, err)
		}
	}
}

// testClose: a closed transport refuses everything, and its handler gets
// nothing more.
func testClose(t *testing.T, h Harness) {
	rs, hs := recorders(2)
	c := h.Start(t, hs)
	if err := c.Nodes[0].Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Nodes[0].Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	if err := c.Nodes[0].Send(2, []byte("x")); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Send after Close = %v", err)
	}
	if _, err := c.Nodes[0].Call(ctx, 2, []byte("x")); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Call after Close = %v", err)
	}
	if err := c.Nodes[0].SendStream(ctx, 2, bytes.NewReader(nil)); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("SendStream after Close = %v", err)
	}
	// Node 2 still sends to node 1; nothing reaches node 1's handler.
	for i := range 10 {
		if err := c.Nodes[1].Send(1, Msg(i)); err != nil && !errors.Is(err, transport.ErrBackpressure) {
			t.Fatalf("Send to a closed node = %v", err)
		}
	}
	c.Idle()
	if n := rs[0].Count(2); n != 0 {
		t.Fatalf("a closed node's handler received %d messages", n)
	}
}
