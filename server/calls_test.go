package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/ledger"
)

// TestCallsReplyOverLimit: a reply larger than a CallBatches stream carries
// fails its own call with RESOURCE_EXHAUSTED (the transaction stays
// committed) and the stream goes on serving the others; sent, it would
// have failed the client's receive and so every call sharing the stream.
func TestCallsReplyOverLimit(t *testing.T) {
	var streams atomic.Int32
	ctx, c := limitedStream(t, "erin", &streams, nil)
	const writer = "def invoke(ledger, args):\n    for i in range(args['n']):\n        ledger.put('a%d-%d' % (args['run'], i), i)\n    return args['n']\n"
	if err := c.RegisterContract(ctx, "writer", []byte(writer)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Execute(ctx, "writer", []byte(`{"n":1000,"run":1}`))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != codes.ResourceExhausted {
		t.Fatalf("a reply over the stream's limit: got %v, want RESOURCE_EXHAUSTED", err)
	}
	if vs, err := c.History(ctx, "a1-999", ledger.ScanRange{End: -1}); err != nil || len(vs) != 1 {
		t.Fatalf("the transaction whose reply was too large: %d versions of its last asset, %v; want it committed", len(vs), err)
	}
	if res, err := c.Execute(ctx, "writer", []byte(`{"n":1,"run":2}`)); err != nil || len(res.Proofs) != 1 {
		t.Fatalf("a call after the refused reply: %v", err)
	}
	if n := streams.Load(); n != 1 {
		t.Errorf("the client opened %d CallBatches streams, want 1", n)
	}
}

// TestRepliesShareMessagesWithinLimit: replies ready together share a
// message, but never past maxCallReply bytes, the client's receive limit:
// a message over it would fail the client's receive and so the stream of
// every caller sharing it.
func TestRepliesShareMessagesWithinLimit(t *testing.T) {
	var streams, shared atomic.Int32
	ctx, c := limitedStream(t, "fay", &streams, &shared)
	// Each reply is about 25 KB: two fit a message, three do not.
	const wide = "def invoke(ledger, args):\n    return 'w' * 25000\n"
	if err := c.RegisterContract(ctx, "wide", []byte(wide)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 6 {
				res, err := c.Execute(ctx, "wide", []byte(`{}`))
				if err != nil {
					t.Error(err)
					return
				}
				if len(res.Result) < 25000 {
					t.Errorf("a result of %d bytes, want at least 25000", len(res.Result))
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := streams.Load(); n != 1 {
		t.Errorf("the client opened %d CallBatches streams, want 1: a message of replies passed the limit", n)
	}
	if shared.Load() == 0 {
		t.Error("no message carried two replies: the limit was not put to the test")
	}
}

// limitedStream starts a server whose CallBatches messages of replies
// carry at most 64 KiB, and returns a client of it for entity whose
// receive limit is the same (as the SDK's is the server's) and which
// counts the streams it opens and, if shared is not nil, the messages it
// receives with several replies.
func limitedStream(t *testing.T, entity string, streams, shared *atomic.Int32) (context.Context, *client.Client) {
	t.Helper()
	old := maxCallReply
	maxCallReply = 64 << 10
	t.Cleanup(func() { maxCallReply = old })
	ctx := context.Background()
	const token = "admin-token"
	srv, err := Start(ctx, Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AdminToken: token,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(time.Second) })
	watch := grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		streams.Add(1)
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if shared == nil || err != nil {
			return cs, err
		}
		return &sharedCount{ClientStream: cs, shared: shared}, nil
	})
	return ctx, secretClient(t, srv, entity, token, watch, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCallReply)))
}

// secretClient dials srv as entity, with an HMAC secret it enrols using the
// administrator's token, and closes the client when the test ends.
func secretClient(t *testing.T, srv *Running, entity, token string, opts ...grpc.DialOption) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Config{Server: srv.Addr(), Entity: entity, Secret: bytes.Repeat([]byte(entity[:1]), 32), AdminToken: token,
		DialOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.RegisterSecret(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// sharedCount counts the messages received that carry several replies.
type sharedCount struct {
	grpc.ClientStream
	shared *atomic.Int32
}

func (s *sharedCount) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if b, ok := m.(*api.CallReplies); ok && err == nil && len(b.Replies) > 1 {
		s.shared.Add(1)
	}
	return err
}

// TestCancelReachesStreamCall: a caller that gives up on a call sent over
// the CallBatches stream cancels it on the server, as the end of a unary
// call's stream does: the server's call stops waiting for a durable commit
// that is not coming, rather than working on for a caller gone. The stream
// goes on serving the client's next call.
func TestCancelReachesStreamCall(t *testing.T) {
	// Every fsync waits while the gate is shut.
	var gate atomic.Pointer[chan struct{}]
	var held atomic.Int32
	hook := func(bool) {
		if g := gate.Load(); g != nil {
			held.Add(1)
			<-*g
		}
	}
	failed := make(chan slog.Record, 16)
	ctx := context.Background()
	const token = "admin-token"
	srv, err := Start(ctx, Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AdminToken: token,
		Engine: engine.Config{FS: vfsutil.SyncHookFS(vfs.Default, hook)},
		Logger: slog.New(&recordHandler{msg: "rpc failed", out: failed})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(time.Second) })
	var streams atomic.Int32
	count := grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		streams.Add(1)
		return streamer(ctx, desc, cc, method, opts...)
	})
	c := secretClient(t, srv, "gus", token, count)
	const put = "def invoke(ledger, args):\n    ledger.put(args['id'], 1)\n    return 1\n"
	if err := c.RegisterContract(ctx, "put", []byte(put)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Execute(ctx, "put", []byte(`{"id":"a"}`)); err != nil {
		t.Fatal(err)
	}

	shut := make(chan struct{})
	gate.Store(&shut)
	open := sync.OnceFunc(func() { gate.Store(nil); close(shut) })
	defer open()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Execute(cctx, "put", []byte(`{"id":"b"}`))
		done <- err
	}()
	for held.Load() == 0 { // the commit's epoch is being made durable
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	var ce *client.Error
	if err := <-done; !errors.As(err, &ce) || ce.Code != codes.Canceled {
		t.Fatalf("the cancelled call returned %v, want CANCELED", err)
	}
	select {
	case r := <-failed:
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		if attrs["method"] != "ExecuteContract" || attrs["code"] != codes.Canceled.String() {
			t.Fatalf("the server's call ended with %v, want ExecuteContract CANCELED", attrs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server's call went on waiting for durability 10 s after its caller cancelled it")
	}
	open()
	if _, err := c.Execute(ctx, "put", []byte(`{"id":"c"}`)); err != nil {
		t.Fatalf("a call after the cancelled one: %v", err)
	}
	if n := streams.Load(); n != 1 {
		t.Errorf("the client opened %d CallBatches streams, want 1", n)
	}
}

// recordHandler sends the records whose message is msg to out, dropping
// them when out is full.
type recordHandler struct {
	msg string
	out chan<- slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.out <- r.Clone():
		default:
		}
	}
	return nil
}
