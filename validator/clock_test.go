package validator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

// sharedDB hides the engine's storage.Exclusive: Clocks over it scan the
// table, as the Clocks of separate processes on a shared database
// (PostgreSQL) must. It keeps the unsynced view.
type sharedDB struct{ storage.Backend }

func (s sharedDB) Unsynced() storage.Ops { return storage.Unsynced(s.Backend) }

// TestClockOverlap checks the clock's properties on real concurrent
// callers: transactions whose real intervals overlapped get overlapping
// clock intervals, e_i < b_j only when T_i really finished before T_j
// began, and e_i < b_j whenever T_i's end clock returned before T_j's
// begin clock was asked for. A transaction's real interval runs from just
// after its begin clock returned to just before its end clock was asked
// for; a global sequence counter orders those points and the two around
// them. Each worker has its own Clock. On the engine itself (exclusive)
// they are Clocks of one process and read the value they share; on
// sharedDB they scan, like separate processes sharing the table, for
// which a ScanEvery begin clock promises the last property only for what
// its own process saw, so it is not checked there. Grouped, workers come
// in threes sharing a Clock, as the threads of one process, and take
// their clocks as the Validator's logging does there: from the request
// and stamp committers, which claim one or scan for it (TestClockClaims
// follows which they do).
func TestClockOverlap(t *testing.T) {
	for _, tc := range []struct {
		cfg             ClockConfig
		shared, grouped bool
	}{{ClockConfig{Counters: 1}, true, false}, {ClockConfig{Counters: 2}, true, false}, {ClockConfig{Counters: 16}, true, false}, {ClockConfig{Counters: 2, ScanEvery: 3}, true, false},
		{ClockConfig{Counters: 1}, true, true}, {ClockConfig{Counters: 4}, true, true},
		{ClockConfig{Counters: 1}, false, false}, {ClockConfig{Counters: 4, ScanEvery: 3}, false, false}} {
		t.Run(fmt.Sprintf("K=%d,N=%d,shared=%v,grouped=%v", tc.cfg.Counters, tc.cfg.ScanEvery, tc.shared, tc.grouped), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := tc.cfg.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			var db storage.Backend = openEngineDB(t)
			if tc.shared {
				db = sharedDB{db}
			}
			if err := ensureSchema(ctx, db, DefaultNamespace); err != nil {
				t.Fatal(err)
			}
			checkReturn := !tc.shared || cfg.ScanEvery <= 1
			type iv struct{ b, e, ask, start, end, ret int64 }
			var seq atomic.Int64
			var mu sync.Mutex
			var ivs []iv
			type proc struct {
				c      *Clock
				rc, sc *committer // request and stamp committers
			}
			procs := make([]proc, 12)
			for w := range procs {
				if tc.grouped && w%3 != 0 {
					procs[w] = procs[w-w%3]
					continue
				}
				c, err := newClock(ctx, db, DefaultNamespace, cfg)
				if err != nil {
					t.Fatal(err)
				}
				procs[w] = proc{c, &committer{db: db, clock: c}, &committer{db: db, clock: c, ends: true}}
			}
			var wg sync.WaitGroup
			for w := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := procs[w].c
					if c.owned == tc.shared {
						t.Errorf("clock on a shared database: %v; owned: %v", tc.shared, c.owned)
						return
					}
					rng := rand.New(rand.NewPCG(uint64(w), 3))
					for range 40 {
						ask := seq.Add(1)
						var b int64
						var err error
						if tc.grouped {
							b, err = procs[w].rc.do(ctx)
						} else {
							b, err = c.Begin(ctx)
						}
						if err != nil {
							t.Error(err)
							return
						}
						start := seq.Add(1)
						if rng.IntN(3) == 0 {
							time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
						}
						end := seq.Add(1)
						var e int64
						if tc.grouped {
							e, err = procs[w].sc.do(ctx)
						} else {
							e, err = c.End(ctx)
						}
						if err != nil {
							t.Error(err)
							return
						}
						ret := seq.Add(1)
						mu.Lock()
						ivs = append(ivs, iv{b, e, ask, start, end, ret})
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			overlaps, ordered := 0, 0
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
					for _, p := range [][2]iv{{x, y}, {y, x}} {
						if p[0].ret < p[1].ask {
							ordered++
							if checkReturn && p[0].e >= p[1].b {
								t.Fatalf("a transaction whose end clock returned before another asked for its begin clock does not precede it: %+v %+v", p[0], p[1])
							}
						}
					}
				}
			}
			if overlaps == 0 || ordered == 0 {
				t.Fatalf("%d overlapping and %d ordered pairs; the test shows nothing", overlaps, ordered)
			}
			t.Logf("%d transactions, %d really overlapping pairs, %d ordered", len(ivs), overlaps, ordered)
			if tc.grouped {
				var n [4]int
				for w := 0; w < len(procs); w += 3 {
					p := procs[w]
					n[0], n[1], n[2], n[3] = n[0]+p.rc.claimed, n[1]+p.rc.scanned, n[2]+p.sc.claimed, n[3]+p.sc.scanned
				}
				t.Logf("begin clocks claimed by %d groups, scanned for by %d; end clocks claimed by %d, scanned for by %d", n[0], n[1], n[2], n[3])
			}
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

// TestClockClaims follows the clocks that the committers take on a shared
// database while another process (a second Clock) raises one counter,
// each in turn, between groups: the stamp committer's end clocks and the
// request committer's begin clocks. A claim made after such a raise must
// fail and the clock come from a scan; the next group, backing off,
// scans; the one after claims again. Every clock is max + 1 of the
// counters as they were before it was taken, whichever way it came: a
// begin clock leaves them as they were, and after an end clock claimed
// every counter holds it.
func TestClockClaims(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T, db storage.Backend, ns string, ends bool) {
		if err := ensureSchema(ctx, db, ns); err != nil {
			t.Fatal(err)
		}
		const k = 3
		c, err := newClock(ctx, db, ns, ClockConfig{Counters: k})
		if err != nil {
			t.Fatal(err)
		}
		other, err := newClock(ctx, db, ns, ClockConfig{Counters: k})
		if err != nil {
			t.Fatal(err)
		}
		gc := &committer{db: db, clock: c, ends: ends}
		counters := func() []int64 {
			var vs []int64
			for i := range k {
				row, ok, err := db.Get(ctx, &storage.Get{Namespace: ns, Table: tClock, Partition: c.scan.Partition, Clustering: c.slots[i]})
				if err != nil || !ok {
					t.Fatalf("counter %d: %v, found %v", i, err, ok)
				}
				vs = append(vs, row["value"].AsBigInt())
			}
			return vs
		}
		take := func(claim bool) {
			t.Helper()
			before := counters()
			claimed, scanned := gc.claimed, gc.scanned
			v, err := gc.do(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if v != slices.Max(before)+1 {
				t.Fatalf("clock %d; the counters held %v before", v, before)
			}
			after := counters()
			if claim && (gc.claimed != claimed+1 || gc.scanned != scanned) {
				t.Fatalf("want a claim: claims %d → %d, scans %d → %d", claimed, gc.claimed, scanned, gc.scanned)
			}
			if !claim && (gc.claimed != claimed || gc.scanned != scanned+1) {
				t.Fatalf("want a scan: claims %d → %d, scans %d → %d", claimed, gc.claimed, scanned, gc.scanned)
			}
			switch {
			case !ends:
				if !slices.Equal(after, before) {
					t.Fatalf("a begin clock changed the counters: %v → %v", before, after)
				}
			case claim:
				for i, x := range after {
					if x != v {
						t.Fatalf("counter %d holds %d after end clock %d was claimed (%v)", i, x, v, after)
					}
				}
			case slices.Max(after) != v:
				t.Fatalf("counters %v after end clock %d was taken from a scan", after, v)
			}
		}
		// Nothing seen yet: the first group scans. An end clock raises a
		// counter, which this process then has seen; a begin clock raises
		// nothing, so here the process raises one itself. Either way the
		// next group claims.
		take(false)
		if !ends {
			if _, err := c.End(ctx); err != nil {
				t.Fatal(err)
			}
		}
		take(true)
		for round := range 2 * k {
			// The other process raises one counter, the next each round.
			if _, err := other.End(ctx); err != nil {
				t.Fatal(err)
			}
			take(false) // the claim fails; a scan
			take(false) // backing off
			take(true)
			if t.Failed() {
				t.Fatalf("round %d", round)
			}
		}
		// Two failed claims in a row back off for three groups.
		for try := range 2 {
			if _, err := other.End(ctx); err != nil {
				t.Fatal(err)
			}
			take(false) // the claim fails
			if try == 0 {
				take(false) // backing off
			}
		}
		if gc.skip != 3 || gc.backoff != 3 {
			t.Fatalf("after two failed claims in a row: skip %d, backoff %d; want 3, 3", gc.skip, gc.backoff)
		}
	}
	for _, ends := range []bool{true, false} {
		t.Run(fmt.Sprintf("ends=%v", ends), func(t *testing.T) {
			t.Run("engine", func(t *testing.T) { run(t, sharedDB{openEngineDB(t)}, DefaultNamespace, ends) })
			t.Run("postgres", func(t *testing.T) { run(t, openPostgresDB(t), fmt.Sprintf("clockclaims_%d", rand.Uint64()), ends) })
		})
	}
}

// TestClockOwnedAcrossReopen checks that on an exclusive database, which
// no clock scans while it is open, a process that opens it after a crash
// starts above every clock handed out before and carried by a durable
// row: the reservations' counter writes carry the value, and the open
// scans the counters once. Each life takes more end clocks than one
// reservation covers, and the crash keeps only what was synced, up to a
// durable commit made after the last clock, as a logged request would be.
func TestClockOwnedAcrossReopen(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewCrashableMem()
	var last int64
	for life := range 3 {
		db, err := engine.Open(engine.Config{Dir: "/v", FS: fs, EpochInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := ensureSchema(ctx, db, DefaultNamespace); err != nil {
			t.Fatal(err)
		}
		c, err := newClock(ctx, db, DefaultNamespace, ClockConfig{Counters: 3, ScanEvery: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !c.owned {
			t.Fatal("a clock on the engine does not take the exclusive path")
		}
		first := last
		for range reserveAhead + 5 + life {
			b, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if b <= last {
				t.Fatalf("life %d: begin clock %d after end clock %d returned", life, b, last)
			}
			if last, err = c.End(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Validation's horizon is the last clock handed out, not the
		// reservation: a transaction that ends after the horizon was
		// read must end above it.
		if cur, err := c.current(ctx); err != nil || cur != last {
			t.Errorf("life %d: current clock %d (%v) after end clock %d", life, cur, err, last)
		}
		// The counters hold a reservation that covers every clock handed
		// out and reaches no further than one reservation past the last.
		top, err := c.latest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if top < last || top > last+reserveAhead {
			t.Errorf("life %d: counters hold %d after end clocks %d–%d; want a reservation of at most %d past the last", life, top, first+1, last, reserveAhead)
		}
		if err := db.Put(ctx, &storage.Put{Namespace: DefaultNamespace, Table: tMeta, Partition: storage.Values{"name": storage.Text("probe")},
			Values: storage.Values{"value": storage.Text(fmt.Sprint(last))}}); err != nil {
			t.Fatal(err)
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		fs = crashed
	}
}

// TestClockOwnedConcurrent takes end clocks from many goroutines of one
// process, through two Clocks on one exclusive database, across several
// reservations: each caller's end clocks grow, no value is handed out
// twice (the shared value is raised, never overwritten with an older
// one), and the counters cover them all.
func TestClockOwnedConcurrent(t *testing.T) {
	ctx := context.Background()
	db := openEngineDB(t)
	if err := ensureSchema(ctx, db, DefaultNamespace); err != nil {
		t.Fatal(err)
	}
	var clocks [2]*Clock
	for i := range clocks {
		c, err := newClock(ctx, db, DefaultNamespace, ClockConfig{Counters: 2, ScanEvery: 1})
		if err != nil {
			t.Fatal(err)
		}
		clocks[i] = c
	}
	const callers, calls = 8, reserveAhead / 2
	var (
		mu   sync.Mutex
		seen = make(map[int64]bool)
		wg   sync.WaitGroup
		top  atomic.Int64
	)
	for w := range callers {
		wg.Go(func() {
			c := clocks[w%2]
			var prev int64
			for range calls {
				e, err := c.End(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if e <= prev {
					t.Errorf("end clock %d after %d from the same caller", e, prev)
				}
				prev = e
				mu.Lock()
				if seen[e] {
					t.Errorf("end clock %d handed out twice", e)
				}
				seen[e] = true
				mu.Unlock()
				for m := top.Load(); m < e && !top.CompareAndSwap(m, e); m = top.Load() {
				}
			}
		})
	}
	wg.Wait()
	got, err := clocks[0].latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got < top.Load() {
		t.Errorf("counters hold %d; end clocks reached %d", got, top.Load())
	}
}
