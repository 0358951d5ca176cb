package server

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/internal/batch"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wire"
)

// maxStreamCalls bounds the calls one CallBatches stream has in flight;
// past it the server stops reading the stream, and HTTP/2 flow control
// holds the client back.
const maxStreamCalls = 1024

// maxCallReply is the largest message of replies a CallBatches stream
// carries: the Go SDK's receive limit (client.MaxReplyBytes). A reply too
// large to fit one alone would fail the client's receive and so the whole
// stream; the call gets RESOURCE_EXHAUSTED instead, which is what a unary
// call gets.
var maxCallReply = 64 << 20 // a variable for tests

// sizedReply is a reply and its encoded size.
type sizedReply struct {
	r *api.CallReply
	n int
}

// CallBatches serves ExecuteContract and GetTxState calls multiplexed over
// one stream. Calls run concurrently, as unary calls would; one goroutine
// sends the replies, since a stream's Send is not safe for concurrent
// use, and it puts every reply ready when it sends into one message (up to
// maxCallReply bytes): a message costs the transport about as much as the
// bytes of a ledger transaction's reply. The goroutine that reads the
// stream hands each call straight to a worker (dispatcher): a goroutine
// between the two cost each call a hand-off. On shutdown (s.closing) it stops
// taking calls, answers the ones it took, and ends the stream; calls the
// client sent meanwhile are not executed, and the client sees the stream
// end before their reply (a lost reply, which the SDK retries with the
// same nonce).
func (s *service) CallBatches(st api.Ledger_CallBatchesServer) error {
	ctx := st.Context()
	replies := make(chan sizedReply, 64)
	sent := make(chan error, 1)
	go func() { sent <- sendReplies(st, replies) }()

	d := &dispatcher{s: s, ctx: ctx, work: make(chan *streamCall), replies: replies, running: make(map[uint64]*streamCall)}
	recvErr := make(chan error, 1)
	go func() { recvErr <- d.receive(st) }()
	var err error
	select {
	case err = <-recvErr:
	case <-s.closing:
	case <-ctx.Done():
	}
	d.stop()
	d.workers.Wait()
	close(replies)
	if serr := <-sent; serr != nil {
		return serr
	}
	if err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		return err
	}
	return nil
}

// dispatcher runs the calls of one CallBatches stream on workers that
// outlive them: a goroutine per call paid for growing its stack to what
// an execute needs every time (as grpc.NumStreamWorkers does for unary
// calls). The goroutine that reads the stream hands each call to an idle
// worker if there is one, else to a new one; past maxStreamCalls workers
// it waits for one to be free, and while it waits the stream is not read,
// so HTTP/2 flow control holds the client back. Workers end with the
// stream, each after answering the call it holds.
//
// Each call runs under a context of its own, made when it is handed out:
// its timeout runs from then, and a cancel the client sends for its id
// (read by the same goroutine, so always after the call) cancels it.
type dispatcher struct {
	s       *service
	ctx     context.Context
	work    chan *streamCall
	replies chan<- sizedReply
	workers sync.WaitGroup

	// mu orders handing out calls against stop: once stopped, no call is
	// handed out and work is closed.
	mu      sync.Mutex
	stopped bool
	n       int // workers started

	// running holds the calls handed out and not yet answered, by id, for
	// the client's cancels. It has a lock of its own: a worker ending a
	// call takes it while dispatch may hold mu, waiting for that worker.
	runningMu sync.Mutex
	running   map[uint64]*streamCall
}

// streamCall is a call of the stream and the context it runs under.
type streamCall struct {
	req    *api.CallRequest
	ctx    context.Context
	cancel context.CancelFunc
}

// receive reads the stream and hands out its calls until the stream ends,
// the dispatcher stops or the server closes. A message that does not
// decode ends the stream INVALID_ARGUMENT, the client's fault, not
// INTERNAL (see lenientRequest); its calls cannot be answered one by one,
// as their ids are in it.
func (d *dispatcher) receive(st api.Ledger_CallBatchesServer) error {
	for {
		msg := new(api.CallRequests)
		if err := receiveRequest(st.RecvMsg, msg, d.s.maxRequest); err != nil {
			return err
		}
		for _, req := range msg.Calls {
			if _, ok := req.Call.(*api.CallRequest_Cancel); ok {
				d.cancel(req.Id)
				continue
			}
			if !d.dispatch(d.start(req)) {
				return nil
			}
		}
	}
}

// maxTimeoutMicros is the longest call timeout a time.Duration holds
// (about 292 years); a longer one would overflow into a short or negative
// timeout, and is taken as none.
const maxTimeoutMicros = math.MaxInt64 / int64(time.Microsecond)

// start makes req's context and records it as running under its id. Two
// calls under one id (a client's error) each run; a cancel of the id
// reaches the later.
func (d *dispatcher) start(req *api.CallRequest) *streamCall {
	c := &streamCall{req: req}
	if req.TimeoutMicros > 0 && req.TimeoutMicros <= maxTimeoutMicros {
		c.ctx, c.cancel = context.WithTimeout(d.ctx, time.Duration(req.TimeoutMicros)*time.Microsecond)
	} else { // none, or one too long for a time.Duration: no limit beyond the stream's
		c.ctx, c.cancel = context.WithCancel(d.ctx)
	}
	d.runningMu.Lock()
	d.running[req.Id] = c
	d.runningMu.Unlock()
	return c
}

// cancel cancels the running call id, if there is one.
func (d *dispatcher) cancel(id uint64) {
	d.runningMu.Lock()
	c := d.running[id]
	d.runningMu.Unlock()
	if c != nil {
		c.cancel()
	}
}

// run answers c.
func (d *dispatcher) run(c *streamCall) {
	r := d.s.call(c.ctx, c.req)
	d.forget(c)
	d.replies <- r
}

// forget ends c's context and drops it from the running calls: it was
// answered, or will not run.
func (d *dispatcher) forget(c *streamCall) {
	c.cancel()
	d.runningMu.Lock()
	if d.running[c.req.Id] == c {
		delete(d.running, c.req.Id)
	}
	d.runningMu.Unlock()
}

// dispatch hands c to a worker; false means the stream takes no more
// calls, and c is dropped.
func (d *dispatcher) dispatch(c *streamCall) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.s.closing: // a closing server takes no more calls
		d.forget(c)
		return false
	default:
	}
	if d.stopped {
		d.forget(c)
		return false
	}
	select {
	case d.work <- c:
		return true
	default:
	}
	if d.n == maxStreamCalls {
		d.work <- c // workers take calls without mu
		return true
	}
	d.n++
	d.workers.Add(1)
	go d.worker(c)
	return true
}

func (d *dispatcher) worker(c *streamCall) {
	defer d.workers.Done()
	d.run(c)
	for c := range d.work {
		d.run(c)
	}
}

// stop ends dispatching; the workers finish the calls they hold.
func (d *dispatcher) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopped {
		d.stopped = true
		close(d.work)
	}
}

// sendReplies sends the replies of a stream until the channel closes,
// each message holding the replies ready when it is sent, up to
// maxCallReply bytes (see batch.Queue). After a failed Send it keeps
// draining, so no call blocks; it returns the first error.
func sendReplies(st api.Ledger_CallBatchesServer, replies <-chan sizedReply) error {
	q := batch.Queue[sizedReply]{C: replies, Size: func(r sizedReply) int { return batch.Entry(r.n) }, Room: maxCallReply}
	var err error
	var buf []sizedReply
	for {
		rs, ok := q.Next(buf[:0], nil)
		if !ok {
			return err
		}
		buf = rs
		if err != nil {
			continue
		}
		msg := &api.CallReplies{Replies: make([]*api.CallReply, len(rs))}
		for i, r := range rs {
			msg.Replies[i] = r.r
		}
		err = st.Send(msg)
	}
}

// call runs one call of a CallBatches stream, under its own context
// (dispatcher.start), through the same interceptor a unary call takes, and
// turns its outcome into the reply.
func (s *service) call(ctx context.Context, req *api.CallRequest) sizedReply {
	var kind, leader string
	fail := func(err error) (any, error) {
		if s.member != nil && errors.Is(err, storage.ErrNotLeader) {
			var nl *NotLeaderError
			if !errors.As(err, &nl) {
				err = s.member.notLeader(err)
			}
			nl = nil
			if errors.As(err, &nl) {
				leader = nl.Address
			}
		}
		var code codes.Code
		code, kind = errorCode(err)
		return nil, status.Error(code, err.Error())
	}
	method := api.Ledger_CallBatches_FullMethodName
	h := func(context.Context, any) (any, error) {
		return nil, status.Error(codes.InvalidArgument, "a call carries neither execute nor get_tx_state")
	}
	size := 0
	switch c := req.Call.(type) {
	case *api.CallRequest_Execute:
		method = api.Ledger_ExecuteContract_FullMethodName
		h = func(ctx context.Context, _ any) (any, error) {
			l, err := s.ledger()
			if err != nil {
				return fail(err)
			}
			res, err := l.ExecuteOrdered(ctx, wire.RequestFromAPI(c.Execute), wire.OrderTokenFromAPI(c.Execute.OrderToken))
			if err != nil {
				return fail(err)
			}
			out := &api.CallReply{Id: req.Id, Result: &api.CallReply_Execute{Execute: wire.ResultToAPI(res)}}
			if size = proto.Size(out); batch.Entry(size) > maxCallReply {
				// Sent, it would end the stream of every caller sharing it.
				return nil, status.Errorf(codes.ResourceExhausted, "the reply of committed transaction %s is %d bytes, more than the %d a CallBatches stream carries: read its outcome with GetTxState and its proofs with GetProof",
					c.Execute.GetNonce(), size, maxCallReply-batch.Entry(0))
			}
			return out, nil
		}
	case *api.CallRequest_GetTxState:
		method = api.Ledger_GetTxState_FullMethodName
		h = func(ctx context.Context, _ any) (any, error) {
			l, err := s.readLedger(ctx)
			if err != nil {
				return fail(err)
			}
			st, err := l.TxState(ctx, c.GetTxState.GetNonce())
			if err != nil {
				return fail(err)
			}
			return &api.CallReply{Id: req.Id, Result: &api.CallReply_TxState{TxState: wire.TxStateToAPI(st)}}, nil
		}
	}
	out, err := s.observe(ctx, req, &grpc.UnaryServerInfo{Server: s, FullMethod: method}, h)
	if err != nil {
		st := status.Convert(err)
		r := &api.CallReply{Id: req.Id, Result: &api.CallReply_Error{Error: &api.CallError{Code: int32(st.Code()), Message: st.Message(), Kind: kind, Leader: leader}}}
		return sizedReply{r, proto.Size(r)}
	}
	r := out.(*api.CallReply)
	if size == 0 {
		size = proto.Size(r)
	}
	return sizedReply{r, size}
}
