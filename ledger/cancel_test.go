package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// TestContextStopsContract: a contract that runs long within its step
// budget stops when its request's context ends — a deadline or a cancel —
// not at the end of its budget. The request fails with the context's
// error, which says nothing about the request: no abort is recorded (the
// nonce stays free) and nothing is written.
func TestContextStopsContract(t *testing.T) { backends(t, testContextStopsContract) }

func testContextStopsContract(t *testing.T, b storage.Backend) {
	// About 18 s of steps on this project's machines: a build whose
	// contracts ignore the context ran that long.
	f := newFixtureLimits(t, b, Limits{MaxSteps: 3_000_000_000, MaxReadBytes: 64 << 10})
	if err := f.register(f.hmac, "spin", "def invoke(ledger, args):\n    ledger.put('s', 1)\n    n = 0\n    while True:\n        n += 1\n"); err != nil {
		t.Fatal(err)
	}
	deadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 200*time.Millisecond)
	}
	cancelled := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		return ctx, cancel
	}
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{{"deadline", deadline, context.DeadlineExceeded}, {"cancel", cancelled, context.Canceled}} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			req := f.request(f.hmac, "spin", `{}`)
			start := time.Now()
			_, err := f.l.Execute(ctx, req)
			if took := time.Since(start); !errors.Is(err, c.want) || Kind(err) != "" || took > 10*time.Second {
				t.Fatalf("after %v: %v (kind %q); want %v, no kind, well within 10 s", took, err, Kind(err), c.want)
			}
			st, err := f.l.TxState(context.Background(), req.Nonce)
			if err != nil || st.Status != TxUnknown {
				t.Fatalf("the nonce's state %+v, %v; want none recorded", st, err)
			}
			if latest, err := f.l.Latest(context.Background(), "s"); err != nil || latest != -1 {
				t.Fatalf("asset s at age %d, %v; want none written", latest, err)
			}
		})
	}
}
