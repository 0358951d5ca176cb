package replication

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/kiroku-db/kiroku/transport"
)

// Runner drives a Node on a goroutine of its own: ticks from the node's
// clock, messages from the transport (through Handler), proposals from
// callers, and the log's fsync completions. Everything it does to the
// node happens on that goroutine.
type Runner struct {
	n     *Node
	inbox chan [][]byte
	// Committed entries are applied on a goroutine of their own (apply),
	// fed in order through jobs; results come back through applied.
	jobs      chan applyJob
	applied   chan appliedJob
	applyDone chan struct{}
	stopping  atomic.Bool
	calls     chan func()
	stop      chan struct{}
	done      chan struct{}
	failed    chan struct{} // closed when the node stops on an error (Err)
	once      sync.Once
	mu        sync.Mutex
	err       error
	// streams, if set, takes the streams peers send (SendStream); without
	// it they are refused.
	streams func(ctx context.Context, from transport.NodeID, r io.Reader) error
}

// inboxBatches bounds the batches of messages waiting for the loop; past
// it the transport's batches are dropped, as a lossy network would, and
// Raft sends again.
const inboxBatches = 4096

// NewRunner readies a runner for n; Handler is then what n's transport
// delivers to, and Start starts the loop.
func NewRunner(n *Node) *Runner {
	r := &Runner{n: n, inbox: make(chan [][]byte, inboxBatches), calls: make(chan func()),
		stop: make(chan struct{}), done: make(chan struct{}), failed: make(chan struct{}),
		jobs: make(chan applyJob, applyJobs), applied: make(chan appliedJob, applyJobs), applyDone: make(chan struct{})}
	n.setApplier(func(j applyJob) { r.jobs <- j })
	return r
}

// applyJobs bounds the apply jobs queued; Raft bounds the entries being
// applied at once (MaxCommittedSizePerReady), so a full queue is rare and
// only slows the loop.
const applyJobs = 1024

// Start starts the loop and the applier.
func (r *Runner) Start() {
	go r.apply()
	go r.loop()
}

// apply applies the jobs in order, beside the loop.
func (r *Runner) apply() {
	defer close(r.applyDone)
	for j := range r.jobs {
		if r.stopping.Load() {
			continue
		}
		r.applied <- r.n.applyEntries(j)
	}
}

func (r *Runner) loop() {
	defer close(r.done)
	t := r.n.cfg.Clock.NewTicker(r.n.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.Chan():
			r.n.Tick()
		case b := <-r.inbox:
			for _, m := range b {
				r.n.Step(m) // a refused message is a lost one
			}
		case f := <-r.calls:
			f()
		case res := <-r.applied:
			r.n.finishJob(res)
		case <-r.n.Woken():
		}
		r.drain()
		if err := r.n.Process(); err != nil {
			r.mu.Lock()
			r.err = err
			r.mu.Unlock()
			close(r.failed)
			<-r.stop // a stopped node does nothing more
			return
		}
	}
}

// drainLimit bounds the events one Process waits for.
const drainLimit = 1024

// drain takes the messages and calls already waiting, without blocking,
// so that one Ready carries all of them: proposals that arrived together
// become one append and one message per peer.
func (r *Runner) drain() {
	for range drainLimit {
		select {
		case b := <-r.inbox:
			for _, m := range b {
				r.n.Step(m)
			}
		case f := <-r.calls:
			f()
		default:
			return
		}
	}
}

// Do runs f on the loop and waits for it; the node is f's to use. It
// returns ErrStopped once the loop has ended.
func (r *Runner) Do(ctx context.Context, f func(n *Node)) error {
	ran := make(chan struct{})
	select {
	case r.calls <- func() { f(r.n); close(ran) }:
	case <-r.done:
		return r.stopped()
	case <-ctx.Done():
		return ctx.Err()
	}
	<-ran
	return nil
}

// Propose proposes each of data as an entry, in order, on the loop.
func (r *Runner) Propose(ctx context.Context, data ...[]byte) error {
	var err error
	if derr := r.Do(ctx, func(n *Node) {
		for _, d := range data {
			if err = n.Propose(d); err != nil {
				return
			}
		}
	}); derr != nil {
		return derr
	}
	return err
}

// ReadIndex returns an index a linearizable read must see, once this
// node has applied it: a read of the state machine after it sees every
// write committed before ReadIndex was called.
func (r *Runner) ReadIndex(ctx context.Context) (uint64, error) {
	type result struct {
		index uint64
		err   error
	}
	ch := make(chan result, 1)
	if err := r.Do(ctx, func(n *Node) {
		n.ReadIndex(func(i uint64, err error) { ch <- result{i, err} })
	}); err != nil {
		return 0, err
	}
	select {
	case res := <-ch:
		return res.index, res.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-r.done:
		return 0, r.stopped()
	}
}

// Status is the node's status, read on the loop.
func (r *Runner) Status(ctx context.Context) (Status, error) {
	var st Status
	err := r.Do(ctx, func(n *Node) { st = n.Status() })
	return st, err
}

// Failed is closed when the node stops on an error: Err says which.
func (r *Runner) Failed() <-chan struct{} { return r.failed }

// Err is the error that stopped the node, or nil.
func (r *Runner) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *Runner) stopped() error {
	if err := r.Err(); err != nil {
		return err
	}
	return ErrStopped
}

// Stop ends the loop and the applier and waits for them. It does not
// close the node.
func (r *Runner) Stop() {
	r.once.Do(func() {
		r.stopping.Store(true)
		close(r.stop)
		// The applier may be waiting to hand back a result the stopped
		// loop no longer takes.
		go func() {
			for range r.applied {
			}
		}()
		<-r.done
		close(r.jobs)
		<-r.applyDone
		close(r.applied)
	})
	<-r.done
}

// Handler is the transport.Handler that feeds the runner.
func (r *Runner) Handler() transport.Handler { return runnerHandler{r} }

type runnerHandler struct{ r *Runner }

func (h runnerHandler) Receive(_ transport.NodeID, msgs [][]byte) {
	select {
	case h.r.inbox <- msgs:
	default: // full: lost, Raft sends again
	}
}

// errNoCalls: the Raft group sends messages (and a Silo's snapshots)
// only; nothing calls a node.
var errNoCalls = errors.New("replication: a node serves no calls")

func (runnerHandler) Serve(context.Context, transport.NodeID, []byte) ([]byte, error) {
	return nil, errNoCalls
}

func (h runnerHandler) ReceiveStream(ctx context.Context, from transport.NodeID, r io.Reader) error {
	if f := h.r.streams; f != nil {
		return f(ctx, from, r)
	}
	return errNoCalls
}

// setStreams makes the runner's handler pass the streams peers send to
// fn (a Silo's snapshots). Call it before the transport delivers.
func (r *Runner) setStreams(fn func(ctx context.Context, from transport.NodeID, r io.Reader) error) {
	r.streams = fn
}
