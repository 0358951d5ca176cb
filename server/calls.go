package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/internal/batch"
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

// batchEntry is what a call or reply of n bytes takes in a message of
// them: its tag, length and bytes.
func batchEntry(n int) int { return 1 + protowire.SizeBytes(n) }

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
// bytes of a ledger transaction's reply. On shutdown (s.closing) it stops
// taking calls, answers the ones it took, and ends the stream; calls the
// client sent meanwhile are not executed, and the client sees the stream
// end before their reply (a lost reply, which the SDK retries with the
// same nonce).
func (s *service) CallBatches(st api.Ledger_CallBatchesServer) error {
	ctx := st.Context()
	reqs := make(chan *api.CallRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			batch, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			for _, req := range batch.Calls {
				select {
				case reqs <- req:
				case <-ctx.Done():
					return
				}
			}
		}
	}()

	replies := make(chan sizedReply, 64)
	sent := make(chan error, 1)
	go func() { sent <- sendReplies(st, replies) }()

	// Calls run on workers that outlive them: a goroutine per call paid
	// for growing its stack to what an execute needs every time (as
	// grpc.NumStreamWorkers does for unary calls). A call goes to an idle
	// worker if there is one, else to a new one; past maxStreamCalls
	// workers it waits for one to be free, and while it waits the stream
	// is not read, so HTTP/2 flow control holds the client back. Workers
	// end with the stream, each after answering the call it holds.
	work := make(chan *api.CallRequest)
	var workers sync.WaitGroup
	nworkers := 0
	worker := func(req *api.CallRequest) {
		defer workers.Done()
		replies <- s.call(ctx, req)
		for req := range work {
			replies <- s.call(ctx, req)
		}
	}
	var err error
loop:
	for {
		select {
		case <-s.closing: // first, so that a closing stream takes no more calls
			break loop
		default:
		}
		select {
		case req := <-reqs:
			select {
			case work <- req:
			default:
				if nworkers == maxStreamCalls {
					work <- req
					break
				}
				nworkers++
				workers.Add(1)
				go worker(req)
			}
		case err = <-recvErr:
			break loop
		case <-s.closing:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	close(work)
	workers.Wait()
	close(replies)
	if serr := <-sent; serr != nil {
		return serr
	}
	if err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		return err
	}
	return nil
}

// sendReplies sends the replies of a stream until the channel closes,
// each message holding the replies ready when it is sent, up to
// maxCallReply bytes (see batch.Queue). After a failed Send it keeps
// draining, so no call blocks; it returns the first error.
func sendReplies(st api.Ledger_CallBatchesServer, replies <-chan sizedReply) error {
	q := batch.Queue[sizedReply]{C: replies, Size: func(r sizedReply) int { return batchEntry(r.n) }, Room: maxCallReply}
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

// call runs one call of a CallBatches stream through the same interceptor
// a unary call takes, and turns its outcome into the reply.
func (s *service) call(ctx context.Context, req *api.CallRequest) sizedReply {
	if req.TimeoutMicros > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMicros)*time.Microsecond)
		defer cancel()
	}
	var kind string
	fail := func(err error) (any, error) {
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
			res, err := s.l.Execute(ctx, wire.RequestFromAPI(c.Execute))
			if err != nil {
				return fail(err)
			}
			out := &api.CallReply{Id: req.Id, Result: &api.CallReply_Execute{Execute: wire.ResultToAPI(res)}}
			if size = proto.Size(out); batchEntry(size) > maxCallReply {
				// Sent, it would end the stream of every caller sharing it.
				return nil, status.Errorf(codes.ResourceExhausted, "the reply of committed transaction %s is %d bytes, more than the %d a CallBatches stream carries: read its outcome with GetTxState and its proofs with GetProof",
					c.Execute.GetNonce(), size, maxCallReply-batchEntry(0))
			}
			return out, nil
		}
	case *api.CallRequest_GetTxState:
		method = api.Ledger_GetTxState_FullMethodName
		h = func(ctx context.Context, _ any) (any, error) {
			st, err := s.l.TxState(ctx, c.GetTxState.GetNonce())
			if err != nil {
				return fail(err)
			}
			return &api.CallReply{Id: req.Id, Result: &api.CallReply_TxState{TxState: wire.TxStateToAPI(st)}}, nil
		}
	}
	out, err := s.observe(ctx, req, &grpc.UnaryServerInfo{Server: s, FullMethod: method}, h)
	if err != nil {
		st := status.Convert(err)
		r := &api.CallReply{Id: req.Id, Result: &api.CallReply_Error{Error: &api.CallError{Code: int32(st.Code()), Message: st.Message(), Kind: kind}}}
		return sizedReply{r, proto.Size(r)}
	}
	r := out.(*api.CallReply)
	if size == 0 {
		size = proto.Size(r)
	}
	return sizedReply{r, size}
}
