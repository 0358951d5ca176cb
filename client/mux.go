package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/internal/batch"
	"github.com/kiroku-db/kiroku/wire"
)

// mux carries a client's ExecuteContract and GetTxState calls over one
// CallBatches stream shared by all its goroutines. A unary gRPC call opens
// an HTTP/2 stream and encodes headers both ways; on two cores that cost
// about 50 µs of CPU per call against about 13 µs for a message on an open
// stream (measured with 64 callers), a third of a ledger transaction's
// CPU. The calls queued when one is sent share its message, as the
// replies ready together share theirs, which spreads that cost further.
//
// A caller whose ctx ends before its reply stops waiting and sends a
// cancel for its call (cancelCall).
//
// A broken stream fails every call waiting on it with Unavailable, which
// call treats as a lost reply and retries (on a new stream) with the same
// nonce. A server without CallBatches (Unimplemented) turns the mux off for
// good, and its calls go unary.
type mux struct {
	api api.LedgerClient

	mu      sync.Mutex
	cur     *muxStream
	opening chan struct{} // closed when the open under way ends; nil if none
	openErr error         // how the last open failed
	off     bool          // the server has no CallBatches (or refuses it)
	closed  bool
	ctx     context.Context // lives as long as the client
	cancel  context.CancelFunc
}

// muxStream is one CallBatches stream and the calls waiting on it.
type muxStream struct {
	stream api.Ledger_CallBatchesClient
	cancel context.CancelFunc
	sendq  chan *muxCall // to the one goroutine that sends

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*muxCall
	err     error         // why the stream broke; set once
	done    chan struct{} // closed when it broke
}

// muxCall is one call waiting for its reply.
type muxCall struct {
	req   *api.CallRequest
	size  int                 // bound of req's encoded size
	reply chan *api.CallReply // buffered: receive never blocks on it
	// sendErr is the error of this call's own Send, which ended the
	// stream: it belongs to this call, not to the others that waited.
	sendErr error
}

// maxMuxedCall is the largest request sent over the stream, and the most
// bytes of calls one message carries unless it holds a single call; a
// larger call goes unary, where a size limit of the server fails that call
// alone rather than the stream every caller shares.
const maxMuxedCall = 1 << 20

// idTimeoutBytes bounds what a request's id and timeout, set after its
// size is taken, add to it: two fields of a tag and a varint each.
const idTimeoutBytes = 2 * (1 + binary.MaxVarintLen64)

// maxBatchCalls bounds the calls one message carries.
const maxBatchCalls = 256

// ErrBadReply is returned when a server's reply does not answer the call it
// was sent for. A server that sends one is broken or dishonest; the call is
// not retried.
var ErrBadReply = errors.New("client: the server's reply does not answer the call")

// errMuxOff is what calls waiting on a stream the server does not serve
// get: they go unary instead.
var errMuxOff = status.Error(codes.Unimplemented, "client: the server has no CallBatches stream")

func newMux(a api.LedgerClient) *mux {
	ctx, cancel := context.WithCancel(context.Background())
	return &mux{api: a, ctx: ctx, cancel: cancel}
}

func (m *mux) close() {
	m.cancel() // first: an open under way gives up
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

// stream returns the open stream, opening one if there is none; nil when
// the mux is off. Opening waits for the connection, so it runs on a
// goroutine of its own, and callers wait for it only as long as their ctx
// lets them.
func (m *mux) stream(ctx context.Context) (*muxStream, error) {
	for {
		m.mu.Lock()
		switch {
		case m.off:
			m.mu.Unlock()
			return nil, nil
		case m.closed:
			m.mu.Unlock()
			return nil, status.Error(codes.Canceled, "client: closed")
		case m.cur != nil:
			s := m.cur
			m.mu.Unlock()
			return s, nil
		case m.opening == nil:
			m.opening = make(chan struct{})
			go m.open(m.opening)
		}
		opening := m.opening
		m.mu.Unlock()
		select {
		case <-opening:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		m.mu.Lock()
		err := m.openErr
		ok := m.cur != nil || m.off
		m.mu.Unlock()
		if !ok && err != nil {
			return nil, err
		}
	}
}

func (m *mux) open(done chan struct{}) {
	ctx, cancel := context.WithCancel(m.ctx)
	st, err := m.api.CallBatches(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	defer close(done)
	m.opening = nil
	if m.openErr = err; err != nil {
		cancel()
		if refused(status.Code(err)) {
			m.off = true
		}
		return
	}
	s := &muxStream{stream: st, cancel: cancel, sendq: make(chan *muxCall, 64),
		pending: make(map[uint64]*muxCall), done: make(chan struct{})}
	m.cur = s
	go m.receive(s)
	go m.send(s)
}

// refused reports whether a stream ended with code means the server will
// not serve it at all (no CallBatches, or not allowed): calls then go unary,
// where each gets the server's own answer.
func refused(code codes.Code) bool {
	return code == codes.Unimplemented || code == codes.Unauthenticated || code == codes.PermissionDenied
}

// send is the one goroutine that writes s (Send is not safe for
// concurrent use, and it may block on flow control, which callers must
// not wait out past their ctx). Each message carries the calls queued
// when it is sent, up to maxMuxedCall bytes (see batch.Queue).
func (m *mux) send(s *muxStream) {
	q := batch.Queue[*muxCall]{C: s.sendq, Size: func(c *muxCall) int { return c.size }, Room: maxMuxedCall, Most: maxBatchCalls}
	buf := make([]*muxCall, 0, maxBatchCalls)
	for {
		calls, ok := q.Next(buf[:0], s.done)
		if !ok {
			return
		}
		msg := &api.CallRequests{Calls: make([]*api.CallRequest, len(calls))}
		for i, c := range calls {
			msg.Calls[i] = c.req
		}
		if err := s.stream.Send(msg); err != nil {
			// io.EOF: the stream is over, and receive learns why from
			// Recv and ends it with that status; ending it here with
			// io.EOF would hide a refusal (Unimplemented), and the next
			// call would open another stream instead of going unary.
			// Anything else (a request would not marshal, say) is the
			// fault of the calls sent, and grpc has ended the stream.
			if err != io.EOF {
				s.blame(calls, status.Convert(err).Err())
				m.broken(s, err)
			}
			return
		}
	}
}

// blame gives err, which ended the stream when calls were sent, to the
// calls whose request does not marshal, or to all of them if none is
// found at fault; the others get the stream's end (a lost reply, retried).
func (s *muxStream) blame(calls []*muxCall, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := false
	for _, c := range calls {
		if _, merr := proto.Marshal(c.req); merr != nil {
			c.sendErr, found = err, true
		}
	}
	if !found {
		for _, c := range calls {
			c.sendErr = err
		}
	}
}

// receive hands each reply to its caller until the stream breaks.
func (m *mux) receive(s *muxStream) {
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			m.broken(s, err)
			return
		}
		for _, r := range msg.Replies {
			s.mu.Lock()
			c := s.pending[r.Id]
			delete(s.pending, r.Id)
			s.mu.Unlock()
			if c != nil {
				c.reply <- r
			}
		}
	}
}

// broken fails s's waiting calls and forgets s, so the next call opens a
// new stream.
func (m *mux) broken(s *muxStream, err error) {
	code := status.Code(err)
	m.mu.Lock()
	if m.cur == s {
		m.cur = nil
	}
	if refused(code) {
		m.off = true
	}
	m.mu.Unlock()
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	if refused(code) {
		s.err = errMuxOff
	} else {
		// Whatever ended the stream, the replies still owed are lost:
		// the calls may or may not have run, and their retries (same
		// nonce) find out.
		s.err = status.Errorf(codes.Unavailable, "client: call stream ended: %v", err)
	}
	s.pending = nil
	close(s.done)
}

// do sends req (its id is set here) and waits for its reply. The error is
// a gRPC status error; a call error in the reply is returned as a
// *callError carrying the ledger's error kind. errMuxOff: send it unary.
func (m *mux) do(ctx context.Context, req *api.CallRequest) (*api.CallReply, error) {
	n := proto.Size(req) + idTimeoutBytes
	if n > maxMuxedCall {
		return nil, errMuxOff
	}
	s, err := m.stream(ctx)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, errMuxOff
	}
	c := &muxCall{req: req, size: batch.Entry(n), reply: make(chan *api.CallReply, 1)}
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	s.next++
	req.Id = s.next
	s.pending[req.Id] = c
	s.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		req.TimeoutMicros = max(1, time.Until(dl).Microseconds())
	}
	select {
	case s.sendq <- c:
	case <-s.done:
		return nil, s.failure(c)
	case <-ctx.Done():
		s.forget(req.Id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case r := <-c.reply:
		return reply(r)
	case <-s.done:
		// A reply delivered just before the stream ended is still the
		// answer: receive hands it over before it learns of the end.
		select {
		case r := <-c.reply:
			return reply(r)
		default:
		}
		return nil, s.failure(c)
	case <-ctx.Done():
		select {
		case r := <-c.reply:
			return reply(r)
		default:
		}
		s.forget(req.Id)
		s.cancelCall(req.Id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// cancelCall tells the server to cancel call id, queued to be sent (or
// sent) on s, as the end of its stream tells the server a unary call is
// cancelled: otherwise the server would go on working for a caller gone.
// The cancel follows the call on the queue, so the server reads it after
// the call. A full queue does not hold the caller back: a goroutine waits
// for room instead.
func (s *muxStream) cancelCall(id uint64) {
	req := &api.CallRequest{Id: id, Call: &api.CallRequest_Cancel{Cancel: &api.CancelCall{}}}
	c := &muxCall{req: req, size: batch.Entry(proto.Size(req))}
	select {
	case s.sendq <- c:
	case <-s.done:
	default:
		go func() {
			select {
			case s.sendq <- c:
			case <-s.done:
			}
		}()
	}
}

func reply(r *api.CallReply) (*api.CallReply, error) {
	if e := r.GetError(); e != nil {
		return nil, &callError{st: status.New(codes.Code(e.Code), e.Message), kind: e.Kind, leader: e.Leader}
	}
	return r, nil
}

// failure is why c did not get a reply from the broken stream.
func (s *muxStream) failure(c *muxCall) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.sendErr != nil {
		return c.sendErr
	}
	return s.err
}

func (s *muxStream) forget(id uint64) {
	s.mu.Lock()
	if s.pending != nil {
		delete(s.pending, id)
	}
	s.mu.Unlock()
}

// callError is a call's error from a CallBatches reply: the status a unary call
// would have ended with, and what its error-kind trailer would have held.
type callError struct {
	st     *status.Status
	kind   string
	leader string // with kind not_leader: the leader's address, if known
}

func (e *callError) Error() string              { return e.st.Err().Error() }
func (e *callError) GRPCStatus() *status.Status { return e.st }

// trailer is the trailer a unary call would have carried.
func (e *callError) trailer() metadata.MD {
	if e.kind == "" {
		return nil
	}
	md := metadata.Pairs(wire.ErrorKindKey, e.kind)
	if e.leader != "" {
		md.Append(wire.LeaderKey, e.leader)
	}
	return md
}

// viaMux runs a call over the mux, or unary if the mux is off or the
// client was configured with UnaryCalls; unary gets the call options.
func viaMux[T comparable](ctx context.Context, c *target, req *api.CallRequest, get func(*api.CallReply) T,
	unary func(ctx context.Context, opts ...grpc.CallOption) (T, error), opts []grpc.CallOption) (T, error) {
	var zero T
	if c.mux != nil {
		r, err := c.mux.do(ctx, req)
		if err == nil {
			// A reply under the call's id must carry the call's kind of
			// result: the server may be Byzantine.
			if v := get(r); v != zero {
				return v, nil
			}
			return zero, fmt.Errorf("%w: the reply to call %d carries no result of its kind", ErrBadReply, req.Id)
		}
		if err != errMuxOff {
			return zero, err
		}
	}
	return unary(ctx, opts...)
}
