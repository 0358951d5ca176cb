package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/jonboulle/clockwork"
)

// ack is one call of an AppendAsync callback, with what the log said at
// the time of the call.
type ack struct {
	last    uint64
	err     error
	durable uint64 // DurableIndex() inside the callback
}

// acks collects AppendAsync callbacks on a channel, as a caller should: the
// callback hands off and returns.
type acks struct {
	l *Log
	c chan ack
}

func newAcks(l *Log) *acks { return &acks{l: l, c: make(chan ack, 1000)} }

func (a *acks) done(last uint64, err error) {
	a.c <- ack{last: last, err: err, durable: a.l.DurableIndex()}
}

// none fails if a callback has run. Callers use it only where no callback
// can be on its way: the syncer is held inside an fsync, or waits on a
// timer of a fake clock.
func (a *acks) none(t *testing.T, why string) {
	t.Helper()
	select {
	case k := <-a.c:
		t.Fatalf("%s: a callback ran (%+v)", why, k)
	default:
	}
}

// next waits for the next callback (a watchdog, not a timing: it fails a
// hung test).
func (a *acks) next(t *testing.T) ack {
	t.Helper()
	select {
	case k := <-a.c:
		return k
	case <-time.After(10 * time.Second):
		t.Fatal("no callback within 10 s")
		return ack{}
	}
}

// expect waits for callbacks with these last indexes, in this order, each
// successful and each after an fsync covering it (unless periodic).
func (a *acks) expect(t *testing.T, periodic bool, lasts ...uint64) {
	t.Helper()
	for _, want := range lasts {
		k := a.next(t)
		if k.err != nil || k.last != want {
			t.Fatalf("callback (%d, %v), want (%d, nil)", k.last, k.err, want)
		}
		if !periodic && k.durable < k.last {
			t.Fatalf("callback for %d ran with durable index %d: before the fsync covering it", k.last, k.durable)
		}
	}
}

func mustAppendAsync(t *testing.T, l *Log, want uint64, done func(uint64, error), payloads ...[]byte) {
	t.Helper()
	first, err := l.AppendAsync(payloads, done)
	if err != nil || first != want {
		t.Fatalf("AppendAsync: first %d, %v; want %d", first, err, want)
	}
}

// TestAppendAsyncAckAfterSync holds the disk's fsyncs: no callback runs
// while the fsync covering its batch is held, a batch appended while an
// fsync is in flight waits for the next one, and callbacks come in append
// order with the last index of their batch.
func TestAppendAsyncAckAfterSync(t *testing.T) {
	for _, p := range []Policy{BatchPolicy(), GroupPolicy(time.Millisecond), CountPolicy(1, time.Millisecond)} {
		t.Run(p.String(), func(t *testing.T) {
			g := newGateFS(vfs.NewCrashableMem())
			l := mustOpen(t, testConfig(g, p))
			defer l.Close()
			g.started.Store(0) // count from here: Open fsyncs the recovered tail
			a := newAcks(l)
			g.hold.Store(true)
			mustAppendAsync(t, l, 1, a.done, []byte("a"))
			release1 := <-g.waiting // the fsync covering a has started, and is held
			mustAppendAsync(t, l, 2, a.done, []byte("b1"), []byte("b2"))
			mustAppendAsync(t, l, 4, a.done, []byte("c"))
			a.none(t, "fsync of a held")
			close(release1)
			a.expect(t, false, 1)
			release2 := <-g.waiting // b and c need an fsync of their own
			a.none(t, "fsync of b and c held")
			if n := g.started.Load(); n != 2 {
				t.Fatalf("%d fsyncs started, want 2", n)
			}
			g.hold.Store(false)
			close(release2)
			a.expect(t, false, 3, 4)
			if d := l.DurableIndex(); d != 4 {
				t.Fatalf("durable index %d, want 4", d)
			}
		})
	}
}

// TestAppendAsyncPeriodicAcksOnWrite: under Periodic a callback runs once
// its batch is written, before any fsync.
func TestAppendAsyncPeriodicAcksOnWrite(t *testing.T) {
	g := newGateFS(vfs.NewCrashableMem())
	l := mustOpen(t, testConfig(g, PeriodicPolicy(time.Hour)))
	g.started.Store(0)
	g.hold.Store(true)
	a := newAcks(l)
	for i := range 5 {
		mustAppendAsync(t, l, uint64(2*i+1), a.done, payload(0, 2*i), payload(0, 2*i+1))
	}
	a.expect(t, true, 2, 4, 6, 8, 10)
	if g.started.Load() != 0 || l.DurableIndex() != 0 {
		t.Fatalf("periodic synced early: %d fsyncs, durable %d", g.started.Load(), l.DurableIndex())
	}
	done := make(chan error, 1)
	go func() { done <- l.Close() }()
	close(<-g.waiting) // Close fsyncs what is left
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAppendAsyncManyInFlight: batches appended while an fsync is held
// pile up, and the next single fsync covers them all.
func TestAppendAsyncManyInFlight(t *testing.T) {
	g := newGateFS(vfs.NewCrashableMem())
	cfg := testConfig(g, BatchPolicy())
	cfg.SegmentSize = 1 << 20 // no rotation, whose sealing fsync would count
	l := mustOpen(t, cfg)
	defer l.Close()
	g.started.Store(0)
	a := newAcks(l)
	g.hold.Store(true)
	mustAppendAsync(t, l, 1, a.done, []byte("first"))
	release := <-g.waiting
	const batches = 200
	next := uint64(2)
	var lasts []uint64
	for b := range batches {
		var ps [][]byte
		for j := range 1 + b%3 {
			ps = append(ps, payload(b, j))
		}
		mustAppendAsync(t, l, next, a.done, ps...)
		next += uint64(len(ps))
		lasts = append(lasts, next-1)
	}
	a.none(t, "first fsync held")
	close(release)
	a.expect(t, false, 1)
	release = <-g.waiting
	a.none(t, "second fsync held")
	g.hold.Store(false)
	close(release)
	a.expect(t, false, lasts...)
	if n := g.started.Load(); n != 2 {
		t.Fatalf("%d fsyncs for two rounds, want 2: one fsync covers every batch in flight", n)
	}
	all := readAll(t, l)
	if uint64(len(all)) != next-1 {
		t.Fatalf("%d records, want %d", len(all), next-1)
	}
}

// TestAppendAsyncSyncFailure fails an fsync while batches are in flight,
// in the round being synced and in the round behind it: every callback
// gets ErrFailed wrapping the error, in append order; later appends are
// refused without a callback; nothing is retried. (Under Periodic, the
// batches written before the fsync were acknowledged already.)
func TestAppendAsyncSyncFailure(t *testing.T) {
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			var armed atomic.Bool
			var syncsAfter atomic.Int64
			entered, release := make(chan struct{}), make(chan struct{})
			fs := errorfs.Wrap(vfs.NewCrashableMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
				if op.Kind != errorfs.OpFileSyncData || !strings.HasSuffix(op.Path, segSuffix) || !armed.Load() {
					return nil
				}
				if syncsAfter.Add(1) == 1 {
					entered <- struct{}{}
					<-release
				}
				return errInjected
			}))
			cfg := testConfig(fs, p)
			cfg.SegmentSize = 1 << 20
			l := mustOpen(t, cfg)
			a := newAcks(l)
			periodic := p.Kind == Periodic
			mustAppendAsync(t, l, 1, a.done, payload(0, 1))
			if err := l.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			a.expect(t, periodic, 1)
			var syncErr chan error
			failing := 3 // callbacks that get the error
			if periodic {
				// 2..3 are acknowledged once written; the failure shows at
				// the fsync that Sync (or the interval) starts.
				mustAppendAsync(t, l, 2, a.done, payload(0, 2), payload(0, 3))
				a.expect(t, true, 3)
				armed.Store(true)
				syncErr = make(chan error, 1)
				go func() { syncErr <- l.Sync(context.Background()) }()
				failing = 2
			} else {
				armed.Store(true)
				mustAppendAsync(t, l, 2, a.done, payload(0, 2), payload(0, 3))
			}
			<-entered // the fsync (covering 2..3) has started, and will fail
			mustAppendAsync(t, l, 4, a.done, payload(0, 4))
			mustAppendAsync(t, l, 5, a.done, payload(0, 5), payload(0, 6))
			a.none(t, "failing fsync held")
			close(release)
			if periodic {
				if err := <-syncErr; !errors.Is(err, ErrFailed) || !errors.Is(err, errInjected) {
					t.Fatalf("Sync: %v", err)
				}
			}
			for i := range failing {
				if k := a.next(t); k.last != 0 || !errors.Is(k.err, ErrFailed) || !errors.Is(k.err, errInjected) {
					t.Fatalf("callback %d: (%d, %v), want (0, ErrFailed wrapping the injected error)", i, k.last, k.err)
				}
			}
			called := false
			if _, err := l.AppendAsync([][]byte{[]byte("later")}, func(uint64, error) { called = true }); !errors.Is(err, ErrFailed) {
				t.Fatalf("AppendAsync after the failure: %v", err)
			}
			if _, err := l.Append(context.Background(), []byte("later")); !errors.Is(err, ErrFailed) {
				t.Fatalf("Append after the failure: %v", err)
			}
			if err := l.Close(); !errors.Is(err, ErrFailed) {
				t.Fatalf("Close: %v", err)
			}
			if called {
				t.Fatal("the callback of a refused AppendAsync ran")
			}
			a.none(t, "after Close")
			if n := syncsAfter.Load(); n != 1 {
				t.Fatalf("%d fdatasync calls after the failure; want exactly the one that failed", n)
			}
		})
	}
}

// TestAppendAsyncClose: Close writes and fsyncs batches still pending
// (policies whose waits never end on a clock that never moves) and calls
// every callback before it returns; AppendAsync after Close is refused
// without a callback.
func TestAppendAsyncClose(t *testing.T) {
	for _, p := range []Policy{BatchPolicy(), GroupPolicy(time.Hour), CountPolicy(1000, time.Hour), PeriodicPolicy(time.Hour)} {
		t.Run(p.String(), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			cfg := testConfig(fs, p)
			cfg.Clock = clockwork.NewFakeClockAt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			l := mustOpen(t, cfg)
			var mu sync.Mutex
			var lasts []uint64
			var errs []error
			done := func(last uint64, err error) {
				mu.Lock()
				lasts, errs = append(lasts, last), append(errs, err)
				mu.Unlock()
			}
			const batches = 20
			for b := range batches {
				mustAppendAsync(t, l, uint64(2*b+1), done, payload(b, 0), payload(b, 1))
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			if len(lasts) != batches {
				t.Fatalf("%d callbacks when Close returned, want %d", len(lasts), batches)
			}
			for b := range batches {
				if lasts[b] != uint64(2*b+2) || errs[b] != nil {
					t.Fatalf("callback %d: (%d, %v), want (%d, nil)", b, lasts[b], errs[b], 2*b+2)
				}
			}
			mu.Unlock()
			called := false
			if _, err := l.AppendAsync([][]byte{[]byte("x")}, func(uint64, error) { called = true }); !errors.Is(err, ErrClosed) {
				t.Fatalf("AppendAsync after Close: %v", err)
			}
			if called {
				t.Fatal("the callback of a refused AppendAsync ran")
			}
			// What Close acknowledged is on disk, synced.
			cfg.FS = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			l = mustOpen(t, cfg)
			defer l.Close()
			if got := len(readAll(t, l)); got != 2*batches {
				t.Fatalf("%d records after Close and a crash, want %d", got, 2*batches)
			}
		})
	}
}

// TestAppendAsyncRefusals: an empty batch and a record over the limit are
// refused, and their callbacks never run.
func TestAppendAsyncRefusals(t *testing.T) {
	l := mustOpen(t, testConfig(vfs.NewMem(), BatchPolicy()))
	defer l.Close()
	called := false
	done := func(uint64, error) { called = true }
	if _, err := l.AppendAsync(nil, done); err == nil {
		t.Fatal("empty batch accepted")
	}
	if _, err := l.AppendAsync([][]byte{[]byte("ok"), make([]byte, 2<<10+1)}, done); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized record: %v", err)
	}
	if l.LastIndex() != 0 {
		t.Fatalf("a refused batch took indexes: last %d", l.LastIndex())
	}
	// A nil callback: appended, nothing called.
	if first, err := l.AppendAsync([][]byte{[]byte("quiet")}, nil); err != nil || first != 1 {
		t.Fatalf("AppendAsync with nil done: %d, %v", first, err)
	}
	if err := l.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Fatal("a refused batch's callback ran")
	}
}

// TestAppendAsyncBackpressure: AppendAsync waits while MaxPending bytes
// are pending, like Append, and goes on once a round takes them.
func TestAppendAsyncBackpressure(t *testing.T) {
	g := newGateFS(vfs.NewCrashableMem())
	cfg := testConfig(g, BatchPolicy())
	cfg.MaxPending = 4 << 10
	l := mustOpen(t, cfg)
	defer l.Close()
	a := newAcks(l)
	g.hold.Store(true)
	mustAppendAsync(t, l, 1, a.done, make([]byte, 100))
	release := <-g.waiting // a round is in flight; the queue fills behind it
	for i := range 3 {
		mustAppendAsync(t, l, uint64(2+i), a.done, make([]byte, 1000))
	}
	started := make(chan struct{})
	blocked := make(chan error, 1)
	go func() {
		close(started)
		first, err := l.AppendAsync([][]byte{make([]byte, 2000)}, a.done)
		if err == nil && first != 5 {
			err = fmt.Errorf("first index %d, want 5", first)
		}
		blocked <- err
	}()
	<-started
	// A negative check, so a bounded wait: the append must not get in.
	select {
	case err := <-blocked:
		t.Fatalf("AppendAsync over the pending bound returned (%v), want it to wait", err)
	case <-time.After(30 * time.Millisecond):
	}
	if last := l.LastIndex(); last != 4 {
		t.Fatalf("last index %d while the fifth batch waits for room", last)
	}
	g.hold.Store(false)
	close(release)
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	a.expect(t, false, 1, 2, 3, 4, 5)
}

// TestAppendAsyncConcurrent: appenders mixing Append, AppendBatch and
// AppendAsync (with many batches in flight each), and Sync calls, under
// every policy. Callbacks run one at a time in append order (their last
// indexes strictly increase), each with its batch's last index and after
// an fsync covering it (but under Periodic); every record is where its
// append said, in each writer's order, after a reopen.
func TestAppendAsyncConcurrent(t *testing.T) {
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			l := mustOpen(t, testConfig(fs, p))
			const syncWriters, asyncWriters, each, inFlight = 4, 4, 40, 8
			var mu sync.Mutex
			want := map[uint64][]byte{}   // index → payload
			var order []uint64            // callbacks' last indexes, in call order
			var inCallback atomic.Int32   // callbacks running now
			calls := map[[2]int]uint64{}  // (writer, batch) → last index given to the callback
			firsts := map[[2]int]uint64{} // (writer, batch) → first index AppendAsync returned
			sizes := map[[2]int]int{}
			var wg sync.WaitGroup
			for w := range syncWriters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					prev := uint64(0)
					for s := range each {
						ps := [][]byte{payload(w, s)}
						var idx uint64
						var err error
						if s%3 == 0 {
							ps = append(ps, payload(w, s+1000))
							idx, err = l.AppendBatch(context.Background(), ps)
						} else {
							idx, err = l.Append(context.Background(), ps[0])
						}
						if err != nil {
							t.Error(err)
							return
						}
						if idx <= prev {
							t.Errorf("writer %d: index %d after %d", w, idx, prev)
						}
						prev = idx
						mu.Lock()
						for j, pl := range ps {
							want[idx+uint64(j)] = pl
						}
						mu.Unlock()
					}
				}()
			}
			for w := syncWriters; w < syncWriters+asyncWriters; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					slots := make(chan struct{}, inFlight) // batches in flight
					var mine sync.WaitGroup
					for b := range each {
						var ps [][]byte
						for j := range 1 + (w+b)%4 {
							ps = append(ps, payload(w, 10*b+j))
						}
						key := [2]int{w, b}
						slots <- struct{}{}
						mine.Add(1)
						first, err := l.AppendAsync(ps, func(last uint64, err error) {
							defer mine.Done()
							if inCallback.Add(1) != 1 {
								t.Error("two callbacks at once")
							}
							defer inCallback.Add(-1)
							if err != nil {
								t.Error(err)
							}
							if p.Kind != Periodic && l.DurableIndex() < last {
								t.Errorf("callback for %d before the fsync covering it (durable %d)", last, l.DurableIndex())
							}
							mu.Lock()
							order = append(order, last)
							calls[key] = last
							mu.Unlock()
							<-slots
						})
						if err != nil {
							t.Error(err)
							mine.Done()
							return
						}
						mu.Lock()
						firsts[key], sizes[key] = first, len(ps)
						for j, pl := range ps {
							want[first+uint64(j)] = pl
						}
						mu.Unlock()
						if b%10 == 9 {
							if err := l.Sync(context.Background()); err != nil {
								t.Error(err)
							}
						}
					}
					mine.Wait()
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			for i := 1; i < len(order); i++ {
				if order[i] <= order[i-1] {
					t.Fatalf("callback %d got last index %d after %d: not in append order", i, order[i], order[i-1])
				}
			}
			if len(calls) != asyncWriters*each {
				t.Fatalf("%d callbacks, want %d", len(calls), asyncWriters*each)
			}
			for key, first := range firsts {
				if calls[key] != first+uint64(sizes[key])-1 {
					t.Fatalf("batch %v: first %d, %d records, callback got last %d", key, first, sizes[key], calls[key])
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = mustOpen(t, testConfig(fs, p))
			defer l.Close()
			all := readAll(t, l)
			if len(all) != len(want) {
				t.Fatalf("%d records after reopen, want %d", len(all), len(want))
			}
			for idx, pl := range want {
				if !bytes.Equal(all[idx], pl) {
					t.Fatalf("record %d is %q, want %q", idx, all[idx], pl)
				}
			}
		})
	}
}
