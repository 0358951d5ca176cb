package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/ledger"
)

// TestHistoryLargerThanAReply: an asset whose history is larger than the
// client receives in one message (1 MiB here; 64 MiB in the SDK) is read
// whole, through replies the server keeps within its budget (256 KiB
// here; 16 MiB by default). Before the budget, the server built one reply
// of every version up to its count cap, and the client's receive failed.
func TestHistoryLargerThanAReply(t *testing.T) {
	ctx := context.Background()
	const token, versions, fill = "admin-token", 40, 40 << 10
	srv, err := Start(ctx, Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AdminToken: token,
		Limits: ledger.Limits{MaxValueBytes: 64 << 10, MaxArgumentBytes: 64 << 10, MaxReplyBytes: 256 << 10},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(time.Second) })
	var mu sync.Mutex
	var replies []*api.GetAssetReply // this range's
	watch := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*api.GetAssetReply); ok && err == nil {
			mu.Lock()
			replies = append(replies, r)
			mu.Unlock()
		}
		return err
	})
	c := secretClient(t, srv, "gus", token, watch, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<20)))
	const fillSrc = "def invoke(ledger, args):\n    ledger.put('big', args['fill'])\n    return None\n"
	if err := c.RegisterContract(ctx, "fill", []byte(fillSrc)); err != nil {
		t.Fatal(err)
	}
	for i := range versions {
		// A 20 KB value from a 40 KB argument: a version stores both.
		arg := fmt.Sprintf(`{"fill":%q,"pad":%q}`, strings.Repeat(string(rune('a'+i%26)), fill/2), strings.Repeat("p", fill/2))
		if _, err := c.Execute(ctx, "fill", []byte(arg)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		r     ledger.ScanRange
		want  []int64 // ages, in order
		limit int32   // the first reply's
	}{
		{ledger.ScanRange{End: -1, Ascending: true}, ages(0, versions-1), 1000},
		{ledger.ScanRange{End: -1}, ages(versions-1, 0), 1000},
		{ledger.ScanRange{Start: 3, End: 30, Ascending: true, Limit: 20}, ages(3, 22), 20},
		{ledger.ScanRange{Start: 3, End: 30, Limit: 20}, ages(30, 11), 20},
		{ledger.ScanRange{Start: 5, End: -1}, ages(versions-1, 5), 1000},
	} {
		mu.Lock()
		replies = nil
		mu.Unlock()
		vs, err := c.History(ctx, "big", tc.r)
		if err != nil {
			t.Fatalf("%+v: %v", tc.r, err)
		}
		got := make([]int64, len(vs))
		for i, v := range vs {
			got[i] = v.Age
			if want := strings.Repeat(string(rune('a'+int(v.Age)%26)), fill/2); string(v.Output) != fmt.Sprintf("%q", want) {
				t.Fatalf("%+v: version %d's value is not the one written", tc.r, v.Age)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Fatalf("%+v: ages %v, want %v", tc.r, got, tc.want)
		}
		// Each version is about 61 KB encoded, so a 256 KiB reply holds
		// four: the range took several replies, each but the last cut
		// short, the first serving the range's limit (the server's cap
		// for none).
		mu.Lock()
		rs := replies
		mu.Unlock()
		if len(rs) < (len(tc.want)+3)/4 {
			t.Fatalf("%+v: %d replies for %d versions", tc.r, len(rs), len(tc.want))
		}
		if rs[0].Limit != tc.limit {
			t.Fatalf("%+v: the first reply served a limit of %d, want %d", tc.r, rs[0].Limit, tc.limit)
		}
		for i, r := range rs {
			if r.Truncated != (i < len(rs)-1) {
				t.Fatalf("%+v: reply %d of %d truncated=%v", tc.r, i, len(rs), r.Truncated)
			}
		}
	}
}

// ages lists the ages from a to b, either way.
func ages(a, b int64) []int64 {
	var out []int64
	for x := a; ; {
		out = append(out, x)
		if x == b {
			return out
		}
		if a < b {
			x++
		} else {
			x--
		}
	}
}
