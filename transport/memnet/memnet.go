package memnet

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/transport"
)

// Network is a deterministic, fault-injecting in-memory network. Nodes
// join it with a Handler and get an Endpoint, a transport.Transport.
// Nothing moves by itself: every packet gets a delivery time from the
// clock and the faults when it is sent, and Step delivers the packets due.
// Its methods are safe for concurrent use; the trace is deterministic when
// they are called in a deterministic order (typically from one goroutine).
type Network struct {
	cfg   Config // fixed after New; faults live in mu
	clock clockwork.Clock
	start time.Time
	// stepping makes Steps one at a time, so that a node's handler is
	// never called concurrently.
	stepping sync.Mutex

	mu struct {
		sync.Mutex
		rng     *rand.Rand
		seq     uint64 // the last packet id given
		calls   map[uint64]*call
		pending packetHeap
		nodes   map[transport.NodeID]*Endpoint // joined and not closed
		links   map[link]*linkState
		faults  Faults // every link's without its own
	}
}

type link struct{ from, to transport.NodeID }

type linkState struct {
	cut      bool
	faults   *Faults // nil: the network's
	inflight int     // bytes of Msg packets on the link
	fifo     time.Time
}

// call is a Call or SendStream waiting for its reply or result.
type call struct {
	from *Endpoint
	done func(reply []byte, err error)
}

// packet is what crosses a link, or a call's timeout (timeout set).
type packet struct {
	due      time.Time
	id, of   uint64
	traffic  Traffic
	from, to transport.NodeID
	call     uint64
	data     []byte   // Msg, Request, Reply
	chunks   [][]byte // Stream
	errMsg   string   // Reply, Result: the handler's error
	failed   bool     // Reply, Result: errMsg is an error
	size     int
	counted  bool // Msg: counted in its link's inflight bytes
	timeout  bool
}

// New makes a network.
func New(cfg Config) (*Network, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Network{cfg: cfg, clock: cfg.Clock, start: cfg.Clock.Now()}
	n.mu.rng = rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	n.mu.calls = make(map[uint64]*call)
	n.mu.nodes = make(map[transport.NodeID]*Endpoint)
	n.mu.links = make(map[link]*linkState)
	n.mu.faults = cfg.Faults
	return n, nil
}

// Clock is the network's clock.
func (n *Network) Clock() clockwork.Clock { return n.clock }

// Join adds node id to the network, served by h, and returns its endpoint.
// A node that closed its endpoint may join again (a restart); packets
// already on their way to it then reach the new endpoint.
func (n *Network) Join(id transport.NodeID, h transport.Handler) (*Endpoint, error) {
	if id == 0 || h == nil {
		return nil, fmt.Errorf("%w: memnet: node id 0 or nil handler", transport.ErrConfig)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.mu.nodes[id]; ok {
		return nil, fmt.Errorf("%w: memnet: node %d already joined", transport.ErrConfig, id)
	}
	e := &Endpoint{net: n, id: id, h: h}
	n.mu.nodes[id] = e
	return e, nil
}

// SetFaults sets the faults of every link without faults of its own.
func (n *Network) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mu.faults = f
	return nil
}

// SetLinkFaults sets the faults of the one-way link from → to.
func (n *Network) SetLinkFaults(from, to transport.NodeID, f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.linkLocked(from, to).faults = &f
	return nil
}

// ClearLinkFaults makes the link from → to follow the network's faults.
func (n *Network) ClearLinkFaults(from, to transport.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.linkLocked(from, to).faults = nil
}

// Cut cuts the links between a and b both ways: every packet that would
// cross them, sent before or after, is lost, until Heal.
func (n *Network) Cut(a, b transport.NodeID) { n.setCut(a, b, true, true) }

// CutOneWay cuts the link from → to only.
func (n *Network) CutOneWay(from, to transport.NodeID) { n.setCut(from, to, true, false) }

// Heal restores the links between a and b both ways. Packets lost while
// they were cut stay lost.
func (n *Network) Heal(a, b transport.NodeID) { n.setCut(a, b, false, true) }

// HealOneWay restores the link from → to.
func (n *Network) HealOneWay(from, to transport.NodeID) { n.setCut(from, to, false, false) }

// Partition cuts, both ways, every link between nodes of different groups.
// Links within a group, and of nodes in no group, are left as they are.
func (n *Network) Partition(groups ...[]transport.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					n.linkLocked(a, b).cut = true
					n.linkLocked(b, a).cut = true
				}
			}
		}
	}
}

// HealAll restores every link.
func (n *Network) HealAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.mu.links {
		l.cut = false
	}
}

func (n *Network) setCut(a, b transport.NodeID, cut, both bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.linkLocked(a, b).cut = cut
	if both {
		n.linkLocked(b, a).cut = cut
	}
}

func (n *Network) linkLocked(from, to transport.NodeID) *linkState {
	k := link{from, to}
	l := n.mu.links[k]
	if l == nil {
		l = &linkState{}
		n.mu.links[k] = l
	}
	return l
}

// Pending is the number of packets and call timeouts not yet processed.
func (n *Network) Pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.mu.pending)
}

// Next is when the earliest pending packet or timeout is due; ok is false
// when nothing is pending.
func (n *Network) Next() (at time.Time, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.mu.pending) == 0 {
		return time.Time{}, false
	}
	return n.mu.pending[0].due, true
}

// Step processes every packet and timeout that is due at the clock's
// current time and was pending when Step began, in order of due time and
// then of sending, and returns how many it processed. Handlers and call
// completions run synchronously, on the caller's goroutine, without the
// network's lock: they may send, but not Step (Steps run one at a time,
// so a node's handler is never called concurrently). What they send is
// processed by a later Step, even if already due, so one Step always
// ends. A run of due messages on one link, with nothing else between
// them, reaches the Handler as one batch.
func (n *Network) Step() int {
	n.stepping.Lock()
	defer n.stepping.Unlock()
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	limit := n.mu.seq
	count := 0
	for {
		p := n.popDueLocked(now, limit)
		if p == nil {
			return count
		}
		count++
		if act := n.processLocked(now, p, limit, &count); act != nil {
			n.mu.Unlock()
			act()
			n.mu.Lock()
		}
	}
}

// maxStepsAtOnce bounds RunFor's Steps at one instant: packets that keep
// making packets due at once (zero-delay ping-pong) would never let time
// move.
const maxStepsAtOnce = 1 << 20

// ErrLivelock is RunFor's error when maxStepsAtOnce steps at one instant
// did not empty what is due.
var ErrLivelock = errors.New("memnet: packets keep falling due at one instant")

// RunFor moves the clock forward by d, stopping at every due time on the
// way to Step, and ends with the clock at its start plus d and nothing due.
// It needs the clock to be a *clockwork.FakeClock (the default).
func (n *Network) RunFor(d time.Duration) error {
	fc, ok := n.clock.(*clockwork.FakeClock)
	if !ok {
		return fmt.Errorf("%w: memnet: RunFor needs a *clockwork.FakeClock", transport.ErrConfig)
	}
	end := fc.Now().Add(d)
	steps := 0
	for {
		now := fc.Now()
		at, ok := n.Next()
		if !ok || at.After(end) {
			break
		}
		if at.After(now) {
			fc.Advance(at.Sub(now))
			steps = 0
		}
		n.Step()
		if steps++; steps > maxStepsAtOnce {
			return ErrLivelock
		}
	}
	if now := fc.Now(); end.After(now) {
		fc.Advance(end.Sub(now))
	}
	return nil
}

func (n *Network) popDueLocked(now time.Time, limit uint64) *packet {
	if len(n.mu.pending) == 0 {
		return nil
	}
	p := n.mu.pending[0]
	if p.due.After(now) || p.id > limit {
		return nil
	}
	return heap.Pop(&n.mu.pending).(*packet)
}

func (n *Network) traceLocked(e Event) {
	if n.cfg.Trace == nil {
		return
	}
	e.At = n.clock.Now().Sub(n.start)
	n.cfg.Trace(e)
}

func (n *Network) event(k Kind, p *packet) Event {
	return Event{Kind: k, Traffic: p.traffic, From: p.from, To: p.to, ID: p.id, Of: p.of, Call: p.call,
		Due: p.due.Sub(n.start), Size: p.size}
}

// sendLocked puts p on its link, applying the link's faults.
func (n *Network) sendLocked(p *packet) {
	now := n.clock.Now()
	l := n.linkLocked(p.from, p.to)
	f := &n.mu.faults
	if l.faults != nil {
		f = l.faults
	}
	n.mu.seq++
	p.id = n.mu.seq
	rng := n.mu.rng
	if l.cut {
		n.dropLocked(p, "cut")
		return
	}
	if f.Drop > 0 && rng.Float64() < f.Drop {
		n.dropLocked(p, "fault")
		return
	}
	p.due = now.Add(drawDelay(rng, f))
	if f.Reorder > 0 && rng.Float64() < f.Reorder {
		p.due = p.due.Add(1 + time.Duration(rng.Int64N(int64(f.ReorderDelay))))
	} else {
		if p.due.Before(l.fifo) {
			p.due = l.fifo
		}
		l.fifo = p.due
	}
	n.pushLocked(l, p)
	n.traceLocked(n.event(Sent, p))
	if f.Duplicate > 0 && rng.Float64() < f.Duplicate {
		c := *p
		c.data = slices.Clone(p.data) // each delivery's bytes are its handler's
		n.mu.seq++
		c.id, c.of = n.mu.seq, p.id
		c.due = now.Add(drawDelay(rng, f))
		n.pushLocked(l, &c)
		n.traceLocked(n.event(Duplicated, &c))
	}
}

func drawDelay(rng *rand.Rand, f *Faults) time.Duration {
	d := f.DelayMin
	if span := f.DelayMax - f.DelayMin; span > 0 {
		d += time.Duration(rng.Int64N(int64(span) + 1))
	}
	return d
}

func (n *Network) pushLocked(l *linkState, p *packet) {
	if p.traffic == Msg {
		p.counted = true
		l.inflight += p.size
	}
	heap.Push(&n.mu.pending, p)
}

// dropLocked records the loss of p (which is not, or no longer, pending).
func (n *Network) dropLocked(p *packet, reason string) {
	n.uncountLocked(p)
	e := n.event(Dropped, p)
	e.Due, e.Reason = 0, reason
	n.traceLocked(e)
}

func (n *Network) uncountLocked(p *packet) {
	if p.counted {
		p.counted = false
		n.linkLocked(p.from, p.to).inflight -= p.size
	}
}

// processLocked handles p, popped from pending, and returns what must run
// without the lock, if anything. It may pop further packets (a batch),
// adding them to *count.
func (n *Network) processLocked(now time.Time, p *packet, limit uint64, count *int) func() {
	if p.timeout {
		c := n.mu.calls[p.call]
		if c == nil {
			return nil // answered before its timeout
		}
		delete(n.mu.calls, p.call)
		n.traceLocked(Event{Kind: TimedOut, Traffic: p.traffic, From: p.from, To: p.to, ID: p.id, Call: p.call})
		return func() {
			c.done(nil, fmt.Errorf("memnet: %s %d to node %d: %w", p.traffic, p.call, p.to, transport.ErrTimeout))
		}
	}
	if n.linkLocked(p.from, p.to).cut {
		n.dropLocked(p, "cut")
		return nil
	}
	switch p.traffic {
	case Reply, Result:
		n.uncountLocked(p)
		c := n.mu.calls[p.call]
		if c == nil {
			n.traceLocked(n.event(Stale, p))
			return nil
		}
		delete(n.mu.calls, p.call)
		n.traceLocked(n.event(Delivered, p))
		var err error
		if p.failed {
			err = &transport.RemoteError{Peer: p.from, Msg: p.errMsg}
		}
		return func() { c.done(p.data, err) }
	}
	dst := n.mu.nodes[p.to]
	if dst == nil {
		n.dropLocked(p, "down")
		return nil
	}
	n.uncountLocked(p)
	n.traceLocked(n.event(Delivered, p))
	switch p.traffic {
	case Msg:
		batch := [][]byte{p.data}
		for len(n.mu.pending) > 0 {
			q := n.mu.pending[0]
			if q.timeout || q.traffic != Msg || q.from != p.from || q.to != p.to || q.due.After(now) || q.id > limit {
				break
			}
			heap.Pop(&n.mu.pending)
			*count++
			n.uncountLocked(q)
			n.traceLocked(n.event(Delivered, q))
			batch = append(batch, q.data)
		}
		return func() { dst.h.Receive(p.from, batch) }
	case Request:
		return func() {
			reply, err := dst.h.Serve(context.Background(), p.from, p.data)
			n.answer(p, reply, err)
		}
	case Stream:
		return func() {
			err := dst.h.ReceiveStream(context.Background(), p.from, &chunkReader{chunks: p.chunks})
			n.answer(p, nil, err)
		}
	}
	panic(fmt.Sprintf("memnet: packet of traffic %v", p.traffic))
}

// answer sends the reply or result of request or stream p back.
func (n *Network) answer(p *packet, reply []byte, err error) {
	r := &packet{traffic: Reply, from: p.to, to: p.from, call: p.call, data: reply, size: len(reply)}
	if p.traffic == Stream {
		r.traffic = Result
	}
	if err != nil {
		r.failed, r.errMsg, r.data, r.size = true, err.Error(), nil, len(err.Error())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sendLocked(r)
}

// chunkReader reads a stream's chunks, which it does not modify (a
// duplicate shares them); each Read returns at most one chunk, so at most
// ChunkBytes.
type chunkReader struct {
	chunks [][]byte
	off    int // in chunks[0]
}

func (r *chunkReader) Read(b []byte) (int, error) {
	for len(r.chunks) > 0 && r.off == len(r.chunks[0]) {
		r.chunks, r.off = r.chunks[1:], 0
	}
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	if len(b) == 0 {
		return 0, nil
	}
	k := copy(b, r.chunks[0][r.off:])
	r.off += k
	return k, nil
}

// Endpoint is a node's transport on a Network. Its Call and SendStream
// block until a Step delivers the reply (or the timeout falls due), so
// they must be called on another goroutine than the one stepping the
// network; StartCall and StartStream are their non-blocking forms, for a
// simulator that runs everything on one goroutine.
type Endpoint struct {
	net *Network
	id  transport.NodeID
	h   transport.Handler
	// closed is guarded by net.mu.
	closed bool
}

var _ transport.Transport = (*Endpoint)(nil)

// ID is the endpoint's node id.
func (e *Endpoint) ID() transport.NodeID { return e.id }

func (e *Endpoint) checkLocked(to transport.NodeID) error {
	if e.closed {
		return transport.ErrClosed
	}
	if to == 0 || to == e.id {
		return fmt.Errorf("%w: node %d (from %d)", transport.ErrUnknownPeer, to, e.id)
	}
	return nil
}

// Send puts each message on the link to peer to, in order (see Faults for
// what the link may do to it). Any node id but 0 and the endpoint's own is
// a peer: messages to a node that is not joined are lost ("down"). The
// messages are copied. The link's bytes in flight are bounded by
// Config.QueueBytes.
func (e *Endpoint) Send(to transport.NodeID, msgs ...[]byte) error {
	n := e.net
	total := 0
	for _, m := range msgs {
		if len(m) > n.cfg.QueueBytes {
			return fmt.Errorf("memnet: message of %d bytes: %w", len(m), transport.ErrTooLarge)
		}
		total += len(m)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := e.checkLocked(to); err != nil {
		return err
	}
	if l := n.linkLocked(e.id, to); l.inflight+total > n.cfg.QueueBytes {
		return fmt.Errorf("memnet: %d bytes in flight to node %d: %w", l.inflight, to, transport.ErrBackpressure)
	}
	for _, m := range msgs {
		n.sendLocked(&packet{traffic: Msg, from: e.id, to: to, data: slices.Clone(m), size: len(m)})
	}
	return nil
}

// StartCall sends req to peer to and returns at once. done is called
// exactly once, from Step (with the reply, a *RemoteError, or ErrTimeout
// after Config.CallTimeout) or from Close (ErrClosed), unless StartCall
// returns an error. A duplicated request runs the peer's Serve twice; the
// first reply to arrive is the one done gets.
func (e *Endpoint) StartCall(to transport.NodeID, req []byte, done func(reply []byte, err error)) error {
	if done == nil {
		return fmt.Errorf("%w: memnet: nil done", transport.ErrConfig)
	}
	_, err := e.start(&packet{traffic: Request, from: e.id, to: to, data: slices.Clone(req), size: len(req)}, done)
	return err
}

// StartStream reads r to its end (at most Config.MaxStreamBytes) and sends
// it to peer to as one packet, which the peer's ReceiveStream reads in
// chunks of at most Config.ChunkBytes. done is called as for StartCall.
func (e *Endpoint) StartStream(to transport.NodeID, r io.Reader, done func(err error)) error {
	if done == nil {
		return fmt.Errorf("%w: memnet: nil done", transport.ErrConfig)
	}
	chunks, size, err := e.readChunks(to, r)
	if err != nil {
		return err
	}
	_, err = e.start(&packet{traffic: Stream, from: e.id, to: to, chunks: chunks, size: size},
		func(_ []byte, err error) { done(err) })
	return err
}

// readChunks checks that to is a peer, then reads r to its end in chunks.
func (e *Endpoint) readChunks(to transport.NodeID, r io.Reader) ([][]byte, int, error) {
	n := e.net
	n.mu.Lock()
	err := e.checkLocked(to)
	n.mu.Unlock()
	if err != nil {
		return nil, 0, err
	}
	var chunks [][]byte
	var total int64
	for {
		b := make([]byte, n.cfg.ChunkBytes)
		k, err := io.ReadFull(r, b)
		if k > 0 {
			if total += int64(k); total > n.cfg.MaxStreamBytes {
				return nil, 0, fmt.Errorf("memnet: stream over %d bytes: %w", n.cfg.MaxStreamBytes, transport.ErrTooLarge)
			}
			chunks = append(chunks, b[:k])
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return chunks, int(total), nil
		case err != nil:
			return nil, 0, fmt.Errorf("memnet: reading the stream: %w", err)
		}
	}
}

// start registers p's call, schedules its timeout, sends p, and returns
// the call's id.
func (e *Endpoint) start(p *packet, done func([]byte, error)) (uint64, error) {
	n := e.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := e.checkLocked(p.to); err != nil {
		return 0, err
	}
	n.mu.seq++
	t := &packet{timeout: true, traffic: p.traffic, from: p.from, to: p.to, id: n.mu.seq,
		due: n.clock.Now().Add(n.cfg.CallTimeout)}
	t.call, p.call = t.id, t.id
	n.mu.calls[t.id] = &call{from: e, done: done}
	heap.Push(&n.mu.pending, t)
	n.sendLocked(p)
	return t.id, nil
}

// Call is StartCall, waiting for done. If ctx ends first, the call is
// abandoned (a late reply is Stale) and Call returns ctx.Err().
func (e *Endpoint) Call(ctx context.Context, to transport.NodeID, req []byte) ([]byte, error) {
	type result struct {
		reply []byte
		err   error
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch := make(chan result, 1)
	id, err := e.start(&packet{traffic: Request, from: e.id, to: to, data: slices.Clone(req), size: len(req)},
		func(reply []byte, err error) { ch <- result{reply, err} })
	if err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.reply, r.err
	case <-ctx.Done():
		e.net.abandon(id)
		return nil, ctx.Err()
	}
}

// SendStream is StartStream, waiting for done; ctx as for Call.
func (e *Endpoint) SendStream(ctx context.Context, to transport.NodeID, r io.Reader) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	chunks, size, err := e.readChunks(to, r)
	if err != nil {
		return err
	}
	ch := make(chan error, 1)
	id, err := e.start(&packet{traffic: Stream, from: e.id, to: to, chunks: chunks, size: size},
		func(_ []byte, err error) { ch <- err })
	if err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		e.net.abandon(id)
		return ctx.Err()
	}
}

func (n *Network) abandon(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.mu.calls, id)
}

// Close takes the node off the network: packets that reach it from now on
// are lost ("down"), its calls in flight end with ErrClosed (in the order
// they were made), and its Handler is not called by a later Step. The node
// may Join again.
func (e *Endpoint) Close() error {
	n := e.net
	n.mu.Lock()
	if e.closed {
		n.mu.Unlock()
		return nil
	}
	e.closed = true
	if n.mu.nodes[e.id] == e {
		delete(n.mu.nodes, e.id)
	}
	var ids []uint64
	for id, c := range n.mu.calls {
		if c.from == e {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	dones := make([]func([]byte, error), len(ids))
	for i, id := range ids {
		dones[i] = n.mu.calls[id].done
		delete(n.mu.calls, id)
	}
	n.mu.Unlock()
	for _, done := range dones {
		done(nil, transport.ErrClosed)
	}
	return nil
}

type packetHeap []*packet

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].id < h[j].id
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(*packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return p
}
