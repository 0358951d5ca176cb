package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
)

// TestCallsStreamConcurrent runs many goroutines' executes over one
// client's shared stream: each gets its own reply (the result of its own
// counter), and errors arrive as the same typed errors as over unary calls.
func TestCallsStreamConcurrent(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token})
	secret := bytes.Repeat([]byte{5}, 32)
	var unaryExecs, streams atomic.Int32
	count := []grpc.DialOption{
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == api.Ledger_ExecuteContract_FullMethodName || method == api.Ledger_GetTxState_FullMethodName {
				unaryExecs.Add(1)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		countStreams(&streams),
	}
	c := dial(t, client.Config{Server: srv.Addr(), Entity: "carol", Secret: secret, AdminToken: token, DialOptions: count})
	uc := dial(t, client.Config{Server: srv.Addr(), Entity: "carol", Secret: secret, UnaryCalls: true})
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterContract(ctx, "counter", []byte(counter)); err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 24, 15
	var wg sync.WaitGroup
	// A request that cannot be marshalled (a contract id that is not
	// UTF-8) fails alone, with the unary call's code, not as a lost reply
	// retried over and over while it breaks everyone's stream.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 3 {
			_, err := c.Execute(ctx, "bad\xff", []byte(`{}`))
			_, uerr := uc.Execute(ctx, "bad\xff", []byte(`{}`))
			if codeOf(err) == codes.Unavailable || codeOf(err) == codes.OK || codeOf(err) != codeOf(uerr) {
				t.Errorf("an unmarshallable request: %v over the stream, %v unary", err, uerr)
			}
		}
	}()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("c%d", g)
			for i := 1; i <= each; i++ {
				res, err := c.Execute(ctx, "counter", fmt.Appendf(nil, `{"id":%q}`, id))
				if err != nil {
					t.Error(err)
					return
				}
				if string(res.Result) != fmt.Sprint(i) || len(res.Proofs) != 1 || res.Proofs[0].ID != id || res.Proofs[0].Age != int64(i-1) {
					t.Errorf("%s: execute %d got result %s, proofs %+v", id, i, res.Result, res.Proofs)
					return
				}
				st, err := c.TxState(ctx, res.Nonce)
				if err != nil || st.Status != proof.TxCommitted || st.Writes[id] != int64(i-1) {
					t.Errorf("%s: state of %s: %+v, %v", id, res.Nonce, st, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if unaryExecs.Load() != 0 || streams.Load() == 0 {
		t.Fatalf("%d unary execute or state calls, %d streams: the calls did not go over the stream", unaryExecs.Load(), streams.Load())
	}

	// The stream's errors are the unary calls' errors.
	for _, tc := range []struct {
		contract, arg string
		want          error
		code          codes.Code
	}{
		{"counter", `{"id":"c0","max":1}`, proof.ErrContractFailed, codes.FailedPrecondition},
		{"nope", `{}`, proof.ErrUnknownContract, 0},
		{"counter", `{"id":`, proof.ErrBadArgument, 0},
	} {
		var codesSeen []codes.Code
		for _, cl := range []*client.Client{c, uc} {
			_, err := cl.Execute(ctx, tc.contract, []byte(tc.arg))
			var ce *client.Error
			if !errors.Is(err, tc.want) || !errors.As(err, &ce) {
				t.Fatalf("%s %s: %#v; want %v", tc.contract, tc.arg, err, tc.want)
			}
			codesSeen = append(codesSeen, ce.Code)
		}
		if codesSeen[0] != codesSeen[1] || tc.code != 0 && codesSeen[0] != tc.code {
			t.Errorf("%s %s: codes stream/unary %v", tc.contract, tc.arg, codesSeen)
		}
	}
	if _, err := c.TxState(ctx, "never-used"); err != nil {
		t.Fatalf("state of an unknown nonce over the stream: %v", err)
	}
}

// TestCallsFallBackToUnary: a server without the CallBatches stream (an
// older one, or a proxy) answers Unimplemented, and the client goes unary.
func TestCallsFallBackToUnary(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token})
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var opened atomic.Int32
	gs := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		opened.Add(1)
		return h(srv, ss)
	}))
	api.RegisterLedgerServer(gs, &unaryOnly{up: api.NewLedgerClient(conn)})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()

	secret := bytes.Repeat([]byte{6}, 32)
	direct := dial(t, client.Config{Server: srv.Addr(), Entity: "dave", Secret: secret, AdminToken: token})
	if err := direct.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	c := dial(t, client.Config{Server: lis.Addr().String(), Entity: "dave", Secret: secret})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Execute(ctx, "builtin.ycsb_c", fmt.Appendf(nil, `{"ids":["a%d"]}`, g))
			if err != nil {
				t.Error(err)
				return
			}
			if st, err := c.TxState(ctx, res.Nonce); err != nil || st.Status != proof.TxCommitted {
				t.Errorf("state: %+v, %v", st, err)
			}
		}()
	}
	wg.Wait()
	if n := opened.Load(); n != 1 {
		t.Errorf("the client tried the CallBatches stream %d times; want once, then unary for good", n)
	}
}

// unaryOnly relays the two calls the mux carries, as unary calls only.
type unaryOnly struct {
	api.UnimplementedLedgerServer
	up api.LedgerClient
}

func (u *unaryOnly) ExecuteContract(ctx context.Context, r *api.ExecuteRequest) (*api.ExecuteReply, error) {
	return u.up.ExecuteContract(ctx, r)
}

func (u *unaryOnly) GetTxState(ctx context.Context, r *api.GetTxStateRequest) (*api.TxState, error) {
	return u.up.GetTxState(ctx, r)
}

// TestStopWithOpenStream: a client's open CallBatches stream does not hold a
// graceful stop for its whole grace period, and the client's next call,
// against a server that is gone, fails instead of hanging.
func TestStopWithOpenStream(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token})
	secret := bytes.Repeat([]byte{4}, 32)
	c := dial(t, client.Config{Server: srv.Addr(), Entity: "erin", Secret: secret, AdminToken: token,
		AttemptTimeout: time.Second, MaxAttempts: 2})
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Execute(ctx, "builtin.ycsb_c", []byte(`{"ids":["x"]}`)); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Stop(time.Minute) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the server's graceful stop waits on the client's idle CallBatches stream")
	}
	if _, err := c.Execute(ctx, "builtin.ycsb_c", []byte(`{"ids":["x"]}`)); codeOf(err) != codes.Unavailable {
		t.Fatalf("execute against a stopped server: %v; want Unavailable", err)
	}
}

func codeOf(err error) codes.Code {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return codes.OK
}

// TestCallsDeadlineWhileConnecting: a server that accepts the connection
// and never speaks holds the stream's opening; a call still ends at its
// deadline, and Close does not wait for the opening.
func TestCallsDeadlineWhileConnecting(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // silent until the test ends
		}
	}()
	c, err := client.Dial(client.Config{Server: lis.Addr().String(), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.TxState(ctx, "n")
		done <- err
	}()
	select {
	case err := <-done:
		if codeOf(err) != codes.DeadlineExceeded {
			t.Errorf("TxState against a silent server: %v; want DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("TxState against a silent server outlived its 300 ms deadline by 10 s")
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for the stream's opening")
	}
}

// fanout reads args.reads absent assets and writes args.writes fresh ones:
// each proof of its reply carries the whole input set.
const fanout = `def invoke(ledger, args):
    for i in range(args['reads']):
        ledger.get('input-asset-with-a-long-name-so-each-proof-is-big-%d' % i)
    for i in range(args['writes']):
        ledger.put('out%s-%d' % (args['run'], i), i)
    return args['writes']
`

// TestLargeReplies: an execute whose reply is over gRPC's default 4 MiB
// receive limit reaches the caller over the stream and over a unary call,
// and the stream goes on serving; one whose reply would pass the ledger's
// MaxReplyBytes is refused before it commits (too_large, nothing written,
// recorded as aborted).
func TestLargeReplies(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token, Limits: ledger.Limits{MaxReplyBytes: 12 << 20}})
	secret := bytes.Repeat([]byte{6}, 32)
	var streams atomic.Int32
	c := dial(t, client.Config{Server: srv.Addr(), Entity: "dave", Secret: secret, AdminToken: token,
		DialOptions: []grpc.DialOption{countStreams(&streams)}})
	uc := dial(t, client.Config{Server: srv.Addr(), Entity: "dave", Secret: secret, UnaryCalls: true})
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterContract(ctx, "fanout", []byte(fanout)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    *client.Client
		name string
	}{{c, "stream"}, {uc, "unary"}} {
		res, err := tc.c.Execute(ctx, "fanout", fmt.Appendf(nil, `{"reads":200,"writes":400,"run":%q}`, tc.name))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		size := 0
		for _, p := range res.Proofs {
			for id := range p.Input {
				size += len(id)
			}
		}
		if len(res.Proofs) != 400 || size < 4<<20 {
			t.Fatalf("%s: %d proofs, about %d bytes of input sets: the reply should be over 4 MiB", tc.name, len(res.Proofs), size)
		}
	}
	// Over the ledger's limit: refused before the commit.
	big, err := c.NewRequest("fanout", []byte(`{"reads":200,"writes":1000,"run":"big"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecuteRequest(ctx, big); !errors.Is(err, proof.ErrTooLarge) {
		t.Fatalf("a reply over MaxReplyBytes: got %v, want too_large", err)
	}
	if st, err := c.TxState(ctx, big.Nonce); err != nil || st.Status != proof.TxAborted || st.Kind != "too_large" {
		t.Fatalf("the refused transaction's state: %+v, %v; want aborted, too_large", st, err)
	}
	if vs, err := c.History(ctx, "outbig-0", proof.ScanRange{End: -1}); !errors.Is(err, proof.ErrNotFound) {
		t.Fatalf("the refused transaction wrote outbig-0: %d versions, %v", len(vs), err)
	}
	if res, err := c.Execute(ctx, "fanout", []byte(`{"reads":1,"writes":1,"run":"after"}`)); err != nil || len(res.Proofs) != 1 {
		t.Fatalf("a call after the large ones: %v", err)
	}
	if n := streams.Load(); n != 1 {
		t.Errorf("the client opened %d CallBatches streams, want 1: a large reply broke the stream", n)
	}
}

// countStreams counts the streams a client opens.
func countStreams(n *atomic.Int32) grpc.DialOption {
	return grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		n.Add(1)
		return streamer(ctx, desc, cc, method, opts...)
	})
}

// messageLog records the messages of the CallBatches streams a client
// opens: the calls of each message sent and the replies of each received.
type messageLog struct {
	mu      sync.Mutex
	sent    []*api.CallRequests
	replies []int
}

func (l *messageLog) option() grpc.DialOption {
	return grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return cs, err
		}
		return &loggedStream{ClientStream: cs, log: l}, nil
	})
}

type loggedStream struct {
	grpc.ClientStream
	log *messageLog
}

func (s *loggedStream) SendMsg(m any) error {
	if b, ok := m.(*api.CallRequests); ok {
		s.log.mu.Lock()
		s.log.sent = append(s.log.sent, proto.Clone(b).(*api.CallRequests))
		s.log.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *loggedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if b, ok := m.(*api.CallReplies); ok && err == nil {
		s.log.mu.Lock()
		s.log.replies = append(s.log.replies, len(b.Replies))
		s.log.mu.Unlock()
	}
	return err
}

// TestCallsShareMessages: concurrent callers' calls share the stream's
// messages, both ways, each caller still gets its own reply, and a message
// of several calls stays within maxMuxedCall bytes (calls of 300 KB go at
// most three to a message).
func TestCallsShareMessages(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token, Limits: ledger.Limits{MaxArgumentBytes: 400 << 10}})
	secret := bytes.Repeat([]byte{8}, 32)
	var log messageLog
	c := dial(t, client.Config{Server: srv.Addr(), Entity: "erin", Secret: secret, AdminToken: token,
		DialOptions: []grpc.DialOption{log.option()}})
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	const echo = "def invoke(ledger, args):\n    return len(args['pad'])\n"
	if err := c.RegisterContract(ctx, "echo", []byte(echo)); err != nil {
		t.Fatal(err)
	}
	run := func(goroutines, each, pad int) {
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					n := pad + g*each + i
					res, err := c.Execute(ctx, "echo", fmt.Appendf(nil, `{"pad":%q}`, bytes.Repeat([]byte("x"), n)))
					if err != nil {
						t.Error(err)
						return
					}
					if string(res.Result) != fmt.Sprint(n) {
						t.Errorf("a caller got the result %s, want its own %d", res.Result, n)
					}
				}
			}()
		}
		wg.Wait()
	}
	run(32, 20, 0)
	log.mu.Lock()
	calls, shared := 0, 0
	for _, m := range log.sent {
		calls += len(m.Calls)
		if len(m.Calls) > 1 {
			shared++
		}
	}
	replies, sharedReplies := 0, 0
	for _, n := range log.replies {
		replies += n
		if n > 1 {
			sharedReplies++
		}
	}
	log.sent, log.replies = nil, nil
	log.mu.Unlock()
	if calls < 640 || replies != calls {
		t.Fatalf("%d calls sent and %d replies received, want at least 640 and as many replies", calls, replies)
	}
	if shared == 0 || sharedReplies == 0 {
		t.Errorf("%d messages of several calls and %d of several replies among %d calls: nothing shared a message", shared, sharedReplies, calls)
	}

	// Calls of 300 KB: a message that holds several stays within the
	// limit. The runs repeat (at most five) until some message held more
	// than one, so that the bound was tested.
	multi := 0
	for try := 0; try < 5 && multi == 0; try++ {
		run(8, 3, 300<<10)
		log.mu.Lock()
		for _, m := range log.sent {
			if len(m.Calls) < 2 {
				continue
			}
			multi++
			if n := proto.Size(m); n > client.MaxMuxedCall {
				t.Errorf("a message of %d calls is %d bytes, more than %d", len(m.Calls), n, client.MaxMuxedCall)
			}
		}
		log.sent, log.replies = nil, nil
		log.mu.Unlock()
	}
	if multi == 0 {
		t.Error("no message of 300 KB calls held more than one call in five runs: the size bound was not tested")
	}
}
