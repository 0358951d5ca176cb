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
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/wire"
)

// maxStreamCalls bounds the calls one Calls stream has in flight; past it
// the server stops reading the stream, and HTTP/2 flow control holds the
// client back.
const maxStreamCalls = 1024

// maxCallReply is the largest reply a Calls stream carries: the Go SDK's
// receive limit (client.MaxReplyBytes). A larger one would fail the
// client's receive and so the whole stream; the call gets
// RESOURCE_EXHAUSTED instead, which is what a unary call gets.
var maxCallReply = 64 << 20 // a variable for tests

// Calls serves ExecuteContract and GetTxState calls multiplexed over one
// stream. Calls run concurrently, as unary calls would; one goroutine
// sends the replies, since a stream's Send is not safe for
// concurrent use. On shutdown (s.closing) it stops taking calls, answers
// the ones it took, and ends the stream; calls the client sent meanwhile
// are not executed, and the client sees the stream end before their reply
// (a lost reply, which the SDK retries with the same nonce).
func (s *service) Calls(st api.Ledger_CallsServer) error {
	ctx := st.Context()
	reqs := make(chan *api.CallRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	replies := make(chan *api.CallReply, 64)
	sent := make(chan error, 1)
	go func() {
		var err error
		for r := range replies {
			if err == nil {
				err = st.Send(r)
			}
			// After a failed Send keep draining, so no call blocks.
		}
		sent <- err
	}()

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

// call runs one call of a Calls stream through the same interceptor a
// unary call takes, and turns its outcome into the reply.
func (s *service) call(ctx context.Context, req *api.CallRequest) *api.CallReply {
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
	method := "/kiroku.v1.Ledger/Calls"
	h := func(context.Context, any) (any, error) {
		return nil, status.Error(codes.InvalidArgument, "a call carries neither execute nor get_tx_state")
	}
	switch c := req.Call.(type) {
	case *api.CallRequest_Execute:
		method = api.Ledger_ExecuteContract_FullMethodName
		h = func(ctx context.Context, _ any) (any, error) {
			res, err := s.l.Execute(ctx, wire.RequestFromAPI(c.Execute))
			if err != nil {
				return fail(err)
			}
			out := &api.CallReply{Id: req.Id, Result: &api.CallReply_Execute{Execute: wire.ResultToAPI(res)}}
			if n := proto.Size(out); n > maxCallReply {
				// Sent, it would end the stream of every caller sharing it.
				return nil, status.Errorf(codes.ResourceExhausted, "the reply of committed transaction %s is %d bytes, more than the %d a Calls stream carries: read its outcome with GetTxState and its proofs with GetProof",
					c.Execute.GetNonce(), n, maxCallReply)
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
		return &api.CallReply{Id: req.Id, Result: &api.CallReply_Error{Error: &api.CallError{Code: int32(st.Code()), Message: st.Message(), Kind: kind}}}
	}
	return out.(*api.CallReply)
}
