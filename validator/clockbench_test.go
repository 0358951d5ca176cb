package validator

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkClockEnd is the CPU cost of an end clock (a scan of the K
// counters and one conditional write) on the engine, per K: on this machine
// about 6 µs at K=1, 8.5 µs at K=4 and 17 µs at K=16 (28, 34 and 59
// allocations).
func BenchmarkClockEnd(b *testing.B) {
	for _, k := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			ctx := context.Background()
			c := benchClock(b, k)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.End(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClockParallel is a begin and an end clock taken by 64
// goroutines at once, per K: the figures behind ClockConfig's default.
// On this 2-core machine about 7, 11 and 20 µs of wall time per pair at
// K=1, 4 and 16 (twice that in CPU).
func BenchmarkClockParallel(b *testing.B) {
	for _, k := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			ctx := context.Background()
			c := benchClock(b, k)
			b.SetParallelism(64 / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Begin(ctx); err != nil {
						b.Error(err)
						return
					}
					if _, err := c.End(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// benchClock is a clock of k counters on a fresh engine database.
func benchClock(b *testing.B, k int) *Clock {
	ctx := context.Background()
	db := openEngineDB(b)
	if err := ensureSchema(ctx, db, DefaultNamespace); err != nil {
		b.Fatal(err)
	}
	c, err := newClock(ctx, db, DefaultNamespace, ClockConfig{Counters: k, ScanEvery: 1})
	if err != nil {
		b.Fatal(err)
	}
	return c
}
