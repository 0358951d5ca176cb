package validator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestClockOverlap checks the clock's two properties on real concurrent
// callers: transactions whose real intervals overlapped get overlapping
// clock intervals, and e_i < b_j only when T_i really finished before T_j
// began. A transaction's real interval runs from just after its begin
// clock returned to just before its end clock was asked for; a global
// sequence counter orders those points.
func TestClockOverlap(t *testing.T) {
	for _, cfg := range []ClockConfig{{Counters: 1}, {Counters: 2}, {Counters: 16}, {Counters: 2, ScanEvery: 3}} {
		t.Run(fmt.Sprintf("K=%d,N=%d", cfg.Counters, cfg.ScanEvery), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := cfg.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			db := openEngineDB(t)
			if err := ensureSchema(ctx, db, DefaultNamespace); err != nil {
				t.Fatal(err)
			}
			type iv struct{ b, e, start, end int64 }
			var seq atomic.Int64
			var mu sync.Mutex
			var ivs []iv
			var wg sync.WaitGroup
			for w := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each worker has its own Clock: like separate processes
					// sharing the table.
					c, err := newClock(ctx, db, DefaultNamespace, cfg)
					if err != nil {
						t.Error(err)
						return
					}
					rng := rand.New(rand.NewPCG(uint64(w), 3))
					for range 40 {
						b, err := c.Begin(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						start := seq.Add(1)
						if rng.IntN(3) == 0 {
							time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
						}
						end := seq.Add(1)
						e, err := c.End(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						ivs = append(ivs, iv{b, e, start, end})
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			overlaps := 0
			for i, x := range ivs {
				if x.e < x.b {
					t.Fatalf("end clock %d before begin clock %d", x.e, x.b)
				}
				for _, y := range ivs[i+1:] {
					real := x.start < y.end && y.start < x.end
					clock := x.b <= y.e && y.b <= x.e
					if real {
						overlaps++
						if !clock {
							t.Fatalf("really overlapping transactions got disjoint clocks: %+v %+v", x, y)
						}
					}
					if (x.e < y.b && !(x.end < y.start)) || (y.e < x.b && !(y.end < x.start)) {
						t.Fatalf("clocks claim a precedence real time does not have: %+v %+v", x, y)
					}
				}
			}
			if overlaps == 0 {
				t.Fatal("no transactions overlapped; the test shows nothing")
			}
			t.Logf("%d transactions, %d really overlapping pairs", len(ivs), overlaps)
		})
	}
}

// TestCoalescerRunsAfterArrival has many callers share runs and checks
// what the clock relies on: every caller's result comes from a run that
// started after it arrived and ended before it returned, and runs never
// overlap. It also checks runs were shared, and that a caller whose
// context was cancelled fails only its own run, never one it shares.
func TestCoalescerRunsAfterArrival(t *testing.T) {
	var c coalescer
	var started, ended, running atomic.Int64
	op := func(ctx context.Context) (int64, error) {
		if running.Add(1) != 1 {
			t.Error("two runs at once")
		}
		n := started.Add(1)
		time.Sleep(time.Duration(rand.IntN(50)) * time.Microsecond)
		running.Add(-1)
		ended.Store(n)
		return n, ctx.Err()
	}
	const callers, calls = 32, 200
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range calls {
				ctx, cancel := context.WithCancel(context.Background())
				if i%4 == 0 && j%2 == 0 {
					cancel() // joins as cancelled; the first caller of a run is not shared
				}
				cancelled := ctx.Err() != nil
				arrived := started.Load()
				v, err := c.do(ctx, op)
				cancel()
				// Only a caller's own, unshared run may fail on its
				// cancellation; a run shared with it never does.
				if (err != nil && !cancelled) || v <= arrived || v > ended.Load() {
					t.Errorf("caller arrived after run %d got run %d (ended: %d), err %v", arrived, v, ended.Load(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	if runs := started.Load(); runs >= callers*calls {
		t.Errorf("%d runs for %d calls: none shared", runs, callers*calls)
	}
}
