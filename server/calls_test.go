package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
)

// TestCallsReplyOverLimit: a reply larger than a Calls stream carries
// fails its own call with RESOURCE_EXHAUSTED (the transaction stays
// committed) and the stream goes on serving the others; sent, it would
// have failed the client's receive and so every call sharing the stream.
func TestCallsReplyOverLimit(t *testing.T) {
	defer func(n int) { maxCallReply = n }(maxCallReply)
	maxCallReply = 64 << 10
	ctx := context.Background()
	const token = "admin-token"
	srv, err := Start(ctx, Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AdminToken: token,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(time.Second)
	var streams atomic.Int32
	count := grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		streams.Add(1)
		return streamer(ctx, desc, cc, method, opts...)
	})
	c, err := client.Dial(client.Config{Server: srv.Addr(), Entity: "erin", Secret: bytes.Repeat([]byte{7}, 32), AdminToken: token,
		// The client's receive limit is the stream's, as the SDK's is.
		DialOptions: []grpc.DialOption{count, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCallReply))}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	const writer = "def invoke(ledger, args):\n    for i in range(args['n']):\n        ledger.put('a%d-%d' % (args['run'], i), i)\n    return args['n']\n"
	if err := c.RegisterContract(ctx, "writer", []byte(writer)); err != nil {
		t.Fatal(err)
	}
	_, err = c.Execute(ctx, "writer", []byte(`{"n":1000,"run":1}`))
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
		t.Errorf("the client opened %d Calls streams, want 1", n)
	}
}
