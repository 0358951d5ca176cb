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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
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
	c, err := client.Dial(client.Config{Server: srv.Addr(), Entity: entity, Secret: bytes.Repeat([]byte(entity[:1]), 32), AdminToken: token,
		DialOptions: []grpc.DialOption{watch, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCallReply))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, c
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
