package memnet_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/transport"
	"github.com/kiroku-db/kiroku/transport/memnet"
	"github.com/kiroku-db/kiroku/transport/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Harness{Start: func(t *testing.T, hs []transport.Handler) *transporttest.Cluster {
		// A perfect network but for latency, so that time passes.
		net := newNet(t, memnet.Config{Seed: 1, Faults: memnet.Faults{DelayMin: time.Millisecond, DelayMax: 3 * time.Millisecond}})
		c := &transporttest.Cluster{Drive: func(done func() bool) bool { return drive(t, net, done) },
			Idle: func() { must(t, net.RunFor(time.Minute)) }}
		for i, h := range hs {
			e := join(t, net, transport.NodeID(i+1), h)
			c.Nodes = append(c.Nodes, e)
		}
		return c
	}})
}

func newNet(t *testing.T, cfg memnet.Config) *memnet.Network {
	t.Helper()
	n, err := memnet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func join(t *testing.T, n *memnet.Network, id transport.NodeID, h transport.Handler) *memnet.Endpoint {
	t.Helper()
	e, err := n.Join(id, h)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// drive runs the network a millisecond at a time until done, letting the
// goroutines of blocking calls run in between; it gives up after 100
// minutes of network time.
func drive(t *testing.T, n *memnet.Network, done func() bool) bool {
	for range 6_000_000 {
		if done() {
			return true
		}
		must(t, n.RunFor(time.Millisecond))
		runtime.Gosched()
	}
	return done()
}

// scenario runs a fixed workload with every fault on, and returns the
// trace and what the handlers saw.
func scenario(t *testing.T, seed uint64) string {
	var out strings.Builder
	net := newNet(t, memnet.Config{Seed: seed, CallTimeout: time.Second, ChunkBytes: 100,
		Trace: func(e memnet.Event) { fmt.Fprintln(&out, e) },
		Faults: memnet.Faults{Drop: 0.1, Duplicate: 0.1, DelayMin: time.Millisecond, DelayMax: 20 * time.Millisecond,
			Reorder: 0.2, ReorderDelay: 30 * time.Millisecond}})
	var eps []*memnet.Endpoint
	for id := transport.NodeID(1); id <= 3; id++ {
		h := &transporttest.Recorder{}
		h.ServeFunc = func(_ context.Context, from transport.NodeID, req []byte) ([]byte, error) {
			fmt.Fprintf(&out, "node %d serves %q from %d\n", id, req, from)
			return append([]byte("re:"), req...), nil
		}
		h.StreamFunc = func(_ context.Context, from transport.NodeID, r io.Reader) error {
			b, err := io.ReadAll(r)
			fmt.Fprintf(&out, "node %d streams %d bytes from %d\n", id, len(b), from)
			return err
		}
		eps = append(eps, join(t, net, id, &logHandler{Recorder: h, id: id, out: &out}))
	}
	for i := range 300 {
		from := eps[i%3]
		to := transport.NodeID((i+1)%3 + 1)
		must(t, from.Send(to, transporttest.Msg(i)))
		if i%25 == 0 {
			must(t, from.StartCall(to, transporttest.Msg(i), func(reply []byte, err error) {
				fmt.Fprintf(&out, "call %d: %q %v\n", i, reply, err)
			}))
		}
		if i%100 == 50 {
			must(t, from.StartStream(to, bytes.NewReader(transporttest.Payload(uint64(i), 1000)), func(err error) {
				fmt.Fprintf(&out, "stream %d: %v\n", i, err)
			}))
		}
		if i == 150 {
			net.Partition([]transport.NodeID{1}, []transport.NodeID{2, 3})
		}
		if i == 200 {
			net.HealAll()
		}
		must(t, net.RunFor(time.Duration(i%4)*time.Millisecond))
	}
	must(t, net.RunFor(time.Minute))
	return out.String()
}

// logHandler logs every Receive.
type logHandler struct {
	*transporttest.Recorder
	id  transport.NodeID
	out *strings.Builder
}

func (h *logHandler) Receive(from transport.NodeID, msgs [][]byte) {
	fmt.Fprintf(h.out, "node %d receives %q from %d\n", h.id, msgs, from)
}

func TestSameSeedSameTrace(t *testing.T) {
	a, b, c := scenario(t, 42), scenario(t, 42), scenario(t, 43)
	if a != b {
		t.Fatalf("two runs with seed 42 differ:\n%s", firstDiff(a, b))
	}
	if a == c {
		t.Fatal("seeds 42 and 43 gave the same trace")
	}
	for _, want := range []string{" drop msg ", " fault", " cut", " dup msg ", " deliver req ", " deliver result ",
		"node 2 receives", ": \"re:m", " streams 1000 bytes from ", " timeout req "} {
		if !strings.Contains(a, want) {
			t.Errorf("the trace has no %q", want)
		}
	}
	if t.Failed() {
		t.Logf("trace:\n%s", a)
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n%s\n%s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(al), len(bl))
}

// stepOnly: nothing moves without Step, and Step moves only what is due.
func TestNothingMovesWithoutStep(t *testing.T) {
	net := newNet(t, memnet.Config{Faults: memnet.Faults{DelayMin: 10 * time.Millisecond, DelayMax: 10 * time.Millisecond}})
	r := &transporttest.Recorder{}
	a := join(t, net, 1, &transporttest.Recorder{})
	join(t, net, 2, r)
	must(t, a.Send(2, []byte("x")))
	time.Sleep(20 * time.Millisecond) // real time is not the network's
	if n := net.Step(); n != 0 || r.Count(1) != 0 {
		t.Fatalf("Step before the packet is due processed %d, delivered %d", n, r.Count(1))
	}
	if at, ok := net.Next(); !ok || at != memnet.Epoch.Add(10*time.Millisecond) {
		t.Fatalf("Next = %v, %v", at, ok)
	}
	net.Clock().(*clockwork.FakeClock).Advance(10 * time.Millisecond)
	if n := net.Step(); n != 1 || r.Count(1) != 1 {
		t.Fatalf("Step when due processed %d, delivered %d", n, r.Count(1))
	}
	if net.Pending() != 0 {
		t.Fatalf("%d packets left", net.Pending())
	}
}

// sendMany sends n numbered one-message Sends from a to 2, one per tick of
// the clock.
func sendMany(t *testing.T, net *memnet.Network, a *memnet.Endpoint, n int, tick time.Duration) {
	for i := range n {
		must(t, a.Send(2, transporttest.Msg(i)))
		must(t, net.RunFor(tick))
	}
	must(t, net.RunFor(time.Hour))
}

func index(m []byte) int {
	var i int
	if _, err := fmt.Sscanf(string(m), "m%d", &i); err != nil {
		panic(err)
	}
	return i
}

func TestDropRate(t *testing.T) {
	for _, p := range []float64{0, 0.05, 0.3, 1} {
		net := newNet(t, memnet.Config{Seed: 7, Faults: memnet.Faults{Drop: p}})
		a := join(t, net, 1, &transporttest.Recorder{})
		r := &transporttest.Recorder{}
		join(t, net, 2, r)
		const n = 10000
		sendMany(t, net, a, n, 0)
		lost := float64(n-r.Count(1)) / n
		// 5 standard deviations of a binomial proportion, and a little.
		if tol := 5*math.Sqrt(p*(1-p)/n) + 1e-9; math.Abs(lost-p) > tol {
			t.Errorf("Drop %v lost %v of the messages", p, lost)
		}
		prev := -1
		for _, m := range r.Messages(1) {
			if i := index(m); i <= prev {
				t.Fatalf("Drop %v: message %d after %d", p, i, prev)
			} else {
				prev = i
			}
		}
	}
}

func TestDuplicate(t *testing.T) {
	for _, p := range []float64{0, 1} {
		net := newNet(t, memnet.Config{Seed: 3, Faults: memnet.Faults{Duplicate: p, DelayMax: 5 * time.Millisecond}})
		a := join(t, net, 1, &transporttest.Recorder{})
		r := &transporttest.Recorder{}
		join(t, net, 2, r)
		const n = 200
		sendMany(t, net, a, n, time.Millisecond)
		counts := make(map[int]int)
		for _, m := range r.Messages(1) {
			counts[index(m)]++
		}
		want := 1 + int(p)
		for i := range n {
			if counts[i] != want {
				t.Fatalf("Duplicate %v: message %d delivered %d times, want %d", p, i, counts[i], want)
			}
		}
	}
	// About half, at 0.5.
	net := newNet(t, memnet.Config{Seed: 3, Faults: memnet.Faults{Duplicate: 0.5}})
	a := join(t, net, 1, &transporttest.Recorder{})
	r := &transporttest.Recorder{}
	join(t, net, 2, r)
	sendMany(t, net, a, 4000, 0)
	if extra := r.Count(1) - 4000; extra < 1800 || extra > 2200 {
		t.Fatalf("Duplicate 0.5 duplicated %d of 4000", extra)
	}
}

// timedRecorder records when (on the network clock) each message arrived.
type timedRecorder struct {
	transporttest.Recorder
	clock clockwork.Clock
	at    map[int]time.Time
	order []int
}

func (h *timedRecorder) Receive(from transport.NodeID, msgs [][]byte) {
	for _, m := range msgs {
		i := index(m)
		h.at[i] = h.clock.Now()
		h.order = append(h.order, i)
	}
}

func TestDelayRange(t *testing.T) {
	const lo, hi = 5 * time.Millisecond, 15 * time.Millisecond
	net := newNet(t, memnet.Config{Seed: 11, Faults: memnet.Faults{DelayMin: lo, DelayMax: hi}})
	a := join(t, net, 1, &transporttest.Recorder{})
	r := &timedRecorder{clock: net.Clock(), at: make(map[int]time.Time)}
	join(t, net, 2, r)
	sent := make(map[int]time.Time)
	for i := range 2000 {
		sent[i] = net.Clock().Now()
		must(t, a.Send(2, transporttest.Msg(i)))
		must(t, net.RunFor(time.Duration(i%3)*time.Millisecond))
	}
	must(t, net.RunFor(time.Second))
	var least, most time.Duration = time.Hour, 0
	for i, s := range sent {
		got, ok := r.at[i]
		if !ok {
			t.Fatalf("message %d lost on a link without loss", i)
		}
		d := got.Sub(s)
		if d < lo || d > hi {
			t.Fatalf("message %d took %v, outside [%v, %v]", i, d, lo, hi)
		}
		least, most = min(least, d), max(most, d)
	}
	if spread := (hi - lo) / 4; least > lo+spread || most < hi-spread {
		t.Fatalf("delays spanned only [%v, %v] of [%v, %v]", least, most, lo, hi)
	}
	// Random delays alone never reorder a link.
	for k, i := range r.order {
		if i != k {
			t.Fatalf("delivery %d is message %d: reordered without Reorder", k, i)
		}
	}
}

func TestReorder(t *testing.T) {
	inversions := func(p float64) int {
		net := newNet(t, memnet.Config{Seed: 5, Faults: memnet.Faults{DelayMin: time.Millisecond,
			DelayMax: 4 * time.Millisecond, Reorder: p, ReorderDelay: 20 * time.Millisecond}})
		a := join(t, net, 1, &transporttest.Recorder{})
		r := &timedRecorder{clock: net.Clock(), at: make(map[int]time.Time)}
		join(t, net, 2, r)
		sendMany(t, net, a, 1000, time.Millisecond)
		if len(r.order) != 1000 {
			t.Fatalf("Reorder %v: %d of 1000 delivered", p, len(r.order))
		}
		n, most := 0, -1
		for _, i := range r.order {
			if i < most {
				n++
			}
			most = max(most, i)
		}
		return n
	}
	if n := inversions(0); n != 0 {
		t.Fatalf("Reorder 0 delivered %d messages after a later one", n)
	}
	if n := inversions(0.2); n < 100 {
		t.Fatalf("Reorder 0.2 delivered only %d of 1000 messages after a later one", n)
	}
}

func TestPartition(t *testing.T) {
	net := newNet(t, memnet.Config{Seed: 1, Faults: memnet.Faults{DelayMin: 5 * time.Millisecond, DelayMax: 5 * time.Millisecond}})
	rs := make([]*transporttest.Recorder, 3)
	eps := make([]*memnet.Endpoint, 3)
	for i := range rs {
		rs[i] = &transporttest.Recorder{}
		eps[i] = join(t, net, transport.NodeID(i+1), rs[i])
	}
	counts := func() [3][3]int {
		var c [3][3]int
		for to := range 3 {
			for from := range 3 {
				c[from][to] = rs[to].Count(transport.NodeID(from + 1))
			}
		}
		return c
	}
	all := func() {
		for from := range 3 {
			for to := range 3 {
				if from != to {
					must(t, eps[from].Send(transport.NodeID(to+1), []byte("x")))
				}
			}
		}
		must(t, net.RunFor(time.Second))
	}
	expect := func(what string, before [3][3]int, want [3][3]int) {
		t.Helper()
		got := counts()
		for from := range 3 {
			for to := range 3 {
				if d := got[from][to] - before[from][to]; d != want[from][to] {
					t.Errorf("%s: %d → %d delivered %d, want %d", what, from+1, to+1, d, want[from][to])
				}
			}
		}
	}

	b := counts()
	net.Cut(1, 2)
	all()
	expect("cut 1-2", b, [3][3]int{{0, 0, 1}, {0, 0, 1}, {1, 1, 0}})

	b = counts()
	net.Heal(1, 2)
	all()
	expect("healed", b, [3][3]int{{0, 1, 1}, {1, 0, 1}, {1, 1, 0}})

	b = counts()
	net.CutOneWay(1, 2)
	all()
	expect("cut 1→2", b, [3][3]int{{0, 0, 1}, {1, 0, 1}, {1, 1, 0}})
	net.HealAll()

	b = counts()
	net.Partition([]transport.NodeID{1}, []transport.NodeID{2, 3})
	all()
	expect("partition {1} {2,3}", b, [3][3]int{{0, 0, 0}, {0, 0, 1}, {0, 1, 0}})
	net.HealAll()

	// A cut also loses what is already on the link.
	b = counts()
	must(t, eps[0].Send(2, []byte("in flight")))
	net.Cut(1, 2)
	must(t, net.RunFor(time.Second))
	net.Heal(1, 2)
	must(t, net.RunFor(time.Second))
	expect("cut while in flight", b, [3][3]int{})
	all()
	expect("healed again", b, [3][3]int{{0, 1, 1}, {1, 0, 1}, {1, 1, 0}})
}

func TestBackpressure(t *testing.T) {
	net := newNet(t, memnet.Config{QueueBytes: 100, Faults: memnet.Faults{DelayMin: time.Millisecond, DelayMax: time.Millisecond}})
	a := join(t, net, 1, &transporttest.Recorder{})
	r := &transporttest.Recorder{}
	join(t, net, 2, r)
	must(t, a.Send(2, make([]byte, 60)))
	if err := a.Send(2, make([]byte, 30), make([]byte, 30)); !errors.Is(err, transport.ErrBackpressure) {
		t.Fatalf("Send over QueueBytes = %v, want ErrBackpressure", err)
	}
	must(t, a.Send(3, make([]byte, 60))) // another link, its own bound
	if err := a.Send(2, make([]byte, 101)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("Send of a message over QueueBytes = %v, want ErrTooLarge", err)
	}
	must(t, net.RunFor(time.Second))
	if n := r.Count(1); n != 1 {
		t.Fatalf("%d messages delivered: a refused Send queued some", n)
	}
	must(t, a.Send(2, make([]byte, 30), make([]byte, 30))) // room again
}

// startCall starts a call and returns where its outcome will be.
type outcome struct {
	done  bool
	at    time.Time
	reply []byte
	err   error
}

func startCall(t *testing.T, net *memnet.Network, e *memnet.Endpoint, to transport.NodeID, req string) *outcome {
	o := &outcome{}
	must(t, e.StartCall(to, []byte(req), func(reply []byte, err error) {
		*o = outcome{done: true, at: net.Clock().Now(), reply: reply, err: err}
	}))
	return o
}

func TestCallAcrossFaults(t *testing.T) {
	const timeout = 2 * time.Second
	net := newNet(t, memnet.Config{Seed: 9, CallTimeout: timeout,
		Faults: memnet.Faults{DelayMin: 10 * time.Millisecond, DelayMax: 10 * time.Millisecond}})
	a := join(t, net, 1, &transporttest.Recorder{})
	server := &transporttest.Recorder{}
	join(t, net, 2, server)

	start := net.Clock().Now()
	o := startCall(t, net, a, 2, "ping")
	must(t, net.RunFor(time.Minute))
	if !o.done || o.err != nil || string(o.reply) != "ping" || o.at.Sub(start) != 20*time.Millisecond {
		t.Fatalf("call on a slow link: %+v (after %v)", o, o.at.Sub(start))
	}

	// A lost request: Serve never runs, and the call times out on the
	// network's clock.
	must(t, net.SetLinkFaults(1, 2, memnet.Faults{Drop: 1}))
	serves := server.Serves()
	start = net.Clock().Now()
	o = startCall(t, net, a, 2, "lost")
	must(t, net.RunFor(time.Minute))
	if !o.done || !errors.Is(o.err, transport.ErrTimeout) || o.at.Sub(start) != timeout || server.Serves() != serves {
		t.Fatalf("call with a lost request: %+v after %v, %d serves", o, o.at.Sub(start), server.Serves()-serves)
	}
	net.ClearLinkFaults(1, 2)

	// A lost reply: Serve runs, the call still times out.
	must(t, net.SetLinkFaults(2, 1, memnet.Faults{Drop: 1}))
	o = startCall(t, net, a, 2, "reply lost")
	must(t, net.RunFor(time.Minute))
	if !errors.Is(o.err, transport.ErrTimeout) || server.Serves() != serves+1 {
		t.Fatalf("call with a lost reply: %+v, %d serves", o, server.Serves()-serves)
	}
	net.ClearLinkFaults(2, 1)

	// Across a partition it times out; healed, it works.
	net.Cut(1, 2)
	o = startCall(t, net, a, 2, "cut")
	must(t, net.RunFor(time.Minute))
	if !errors.Is(o.err, transport.ErrTimeout) {
		t.Fatalf("call across a cut: %+v", o)
	}
	net.Heal(1, 2)
	o = startCall(t, net, a, 2, "healed")
	must(t, net.RunFor(time.Minute))
	if o.err != nil || string(o.reply) != "healed" {
		t.Fatalf("call after healing: %+v", o)
	}

	// Duplicated requests run Serve twice; the call completes once.
	must(t, net.SetLinkFaults(1, 2, memnet.Faults{Duplicate: 1, DelayMax: 10 * time.Millisecond}))
	serves = server.Serves()
	calls := 0
	must(t, a.StartCall(2, []byte("dup"), func([]byte, error) { calls++ }))
	must(t, net.RunFor(time.Minute))
	if calls != 1 || server.Serves() != serves+2 {
		t.Fatalf("duplicated request: done called %d times, Serve %d", calls, server.Serves()-serves)
	}
	net.ClearLinkFaults(1, 2)

	// The blocking Call: a lost request ends with ErrTimeout, and a
	// cancelled context with its error.
	must(t, net.SetLinkFaults(1, 2, memnet.Faults{Drop: 1}))
	c := &transporttest.Cluster{Drive: func(done func() bool) bool { return drive(t, net, done) }}
	err := transporttest.Await(t, c, func() error { _, err := a.Call(context.Background(), 2, []byte("x")); return err })
	if !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("blocking Call of a lost request = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, err := a.Call(ctx, 2, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Call = %v", err)
	}

	// Closing the caller ends its calls.
	o = startCall(t, net, a, 2, "closing")
	must(t, a.Close())
	if !errors.Is(o.err, transport.ErrClosed) {
		t.Fatalf("call of a closed endpoint: %+v", o)
	}
}

func TestStreamAcrossFaults(t *testing.T) {
	net := newNet(t, memnet.Config{Seed: 2, ChunkBytes: 64 << 10, CallTimeout: time.Second,
		Faults: memnet.Faults{DelayMin: 5 * time.Millisecond, DelayMax: 5 * time.Millisecond}})
	a := join(t, net, 1, &transporttest.Recorder{})
	r := &transporttest.Recorder{}
	join(t, net, 2, r)
	data := transporttest.Payload(4, 5<<20+7)
	stream := func() *outcome {
		o := &outcome{}
		must(t, a.StartStream(2, bytes.NewReader(data), func(err error) {
			*o = outcome{done: true, at: net.Clock().Now(), err: err}
		}))
		return o
	}
	start := net.Clock().Now()
	o := stream()
	must(t, net.RunFor(time.Minute))
	s := r.Streams(1)
	if !o.done || o.err != nil || o.at.Sub(start) != 10*time.Millisecond || len(s) != 1 || !bytes.Equal(s[0].Data, data) {
		t.Fatalf("stream: %+v, %d streams", o, len(s))
	}
	if s[0].MaxRead > 64<<10 || s[0].Reads < len(data)/(64<<10) {
		t.Fatalf("read in %d reads of at most %d bytes; chunks are 64 KiB", s[0].Reads, s[0].MaxRead)
	}

	net.Cut(1, 2)
	o = stream()
	must(t, net.RunFor(time.Minute))
	if !errors.Is(o.err, transport.ErrTimeout) || len(r.Streams(1)) != 1 {
		t.Fatalf("stream across a cut: %+v, %d streams received", o, len(r.Streams(1)))
	}
	net.Heal(1, 2)
	// The result lost on its way back: received, but the sender times out.
	net.CutOneWay(2, 1)
	o = stream()
	must(t, net.RunFor(time.Minute))
	if !errors.Is(o.err, transport.ErrTimeout) || len(r.Streams(1)) != 2 {
		t.Fatalf("stream whose result is lost: %+v, %d streams received", o, len(r.Streams(1)))
	}
	net.HealAll()
	o = stream()
	must(t, net.RunFor(time.Minute))
	if o.err != nil || len(r.Streams(1)) != 3 {
		t.Fatalf("stream after healing: %+v", o)
	}

	// Over MaxStreamBytes.
	small := newNet(t, memnet.Config{MaxStreamBytes: 1000})
	e := join(t, small, 1, &transporttest.Recorder{})
	if err := e.StartStream(2, bytes.NewReader(data), func(error) {}); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("stream over MaxStreamBytes = %v", err)
	}
}

func TestDownNodeAndRejoin(t *testing.T) {
	net := newNet(t, memnet.Config{Faults: memnet.Faults{DelayMax: time.Millisecond}})
	a := join(t, net, 1, &transporttest.Recorder{})
	b := join(t, net, 2, &transporttest.Recorder{})
	if _, err := net.Join(2, &transporttest.Recorder{}); !errors.Is(err, transport.ErrConfig) {
		t.Fatalf("joining twice = %v", err)
	}
	must(t, b.Close())
	must(t, a.Send(2, []byte("to nobody")))
	must(t, a.Send(9, []byte("to a node that never joined")))
	must(t, net.RunFor(time.Second))
	r := &transporttest.Recorder{}
	join(t, net, 2, r)
	must(t, a.Send(2, []byte("after restart")))
	must(t, net.RunFor(time.Second))
	if got := r.Messages(1); len(got) != 1 || string(got[0]) != "after restart" {
		t.Fatalf("the restarted node received %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, f := range []memnet.Faults{{Drop: -0.1}, {Duplicate: 1.5}, {Reorder: math.NaN()},
		{DelayMin: 2, DelayMax: 1}, {DelayMin: -1}, {ReorderDelay: -1}} {
		if _, err := memnet.New(memnet.Config{Faults: f}); !errors.Is(err, transport.ErrConfig) {
			t.Errorf("faults %+v: %v", f, err)
		}
	}
	if _, err := memnet.New(memnet.Config{QueueBytes: -1}); !errors.Is(err, transport.ErrConfig) {
		t.Errorf("negative QueueBytes: %v", err)
	}
	net := newNet(t, memnet.Config{Clock: clockwork.NewRealClock()})
	if err := net.RunFor(time.Second); !errors.Is(err, transport.ErrConfig) {
		t.Errorf("RunFor on a real clock = %v", err)
	}
}
