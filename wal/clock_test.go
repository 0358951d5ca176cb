package wal

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
)

// fakeLog is a log on a fake clock, with fsyncs the test can hold
// (gateFS), driven one step at a time. Nothing in it sleeps: the syncer
// acts when a record is appended or when the test advances the clock past
// the timer it waits on, and the test knows the syncer has settled on a
// timer when the clock has a waiter (the log has no other).
type fakeLog struct {
	t     *testing.T
	clock *clockwork.FakeClock
	gate  *gateFS
	l     *Log
	acks  *acks
	next  uint64   // index of the next record
	lasts []uint64 // last index of every batch appended, in order
	acked int      // batches acknowledged so far
}

func newFakeLog(t *testing.T, p Policy) *fakeLog {
	clock := clockwork.NewFakeClockAt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	g := newGateFS(vfs.NewCrashableMem())
	cfg := testConfig(g, p)
	cfg.Clock = clock
	cfg.SegmentSize = 1 << 20 // no rotation: every fsync is a round's
	l := mustOpen(t, cfg)
	t.Cleanup(func() { l.Close() })
	return &fakeLog{t: t, clock: clock, gate: g, l: l, acks: newAcks(l), next: 1}
}

// append appends a batch of n records without waiting.
func (f *fakeLog) append(n int) {
	f.t.Helper()
	ps := make([][]byte, n)
	for i := range ps {
		ps[i] = payload(0, int(f.next)+i)
	}
	mustAppendAsync(f.t, f.l, f.next, f.acks.done, ps...)
	f.next += uint64(n)
	f.lasts = append(f.lasts, f.next-1)
}

// settled waits until the syncer waits on a timer of the clock.
func (f *fakeLog) settled() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a watchdog
	defer cancel()
	if err := f.clock.BlockUntilContext(ctx, 1); err != nil {
		f.t.Fatalf("the syncer never waited on the clock: %v", err)
	}
}

// ackedUpTo waits until k batches in all are acknowledged, in order; then
// checks that the log has made syncs fsyncs since Open.
func (f *fakeLog) ackedUpTo(k int, syncs uint64) {
	f.t.Helper()
	f.acks.expect(f.t, f.l.cfg.Policy.Kind == Periodic, f.lasts[f.acked:k]...)
	f.acked = k
	f.syncs(syncs)
}

// quiet checks that no further batch was acknowledged and the log has made
// syncs fsyncs. It is called only where the syncer cannot be acting: it
// waits on the clock (settled) and the clock has not reached its timer.
func (f *fakeLog) quiet(syncs uint64, why string) {
	f.t.Helper()
	f.acks.none(f.t, why)
	f.syncs(syncs)
}

func (f *fakeLog) syncs(want uint64) {
	f.t.Helper()
	if got := f.l.Stats().Syncs; got != want {
		f.t.Fatalf("%d fsyncs, want %d", got, want)
	}
}

// TestPoliciesOnFakeClock drives every policy's windows and waits with a
// fake clock: nothing happens until the clock reaches the boundary, and
// then at once.
func TestPoliciesOnFakeClock(t *testing.T) {
	const ms = time.Millisecond
	cases := []struct {
		p      Policy
		script func(f *fakeLog)
	}{
		{BatchPolicy(), func(f *fakeLog) {
			// No window: every batch goes at once, the clock never moves.
			for i := range 5 {
				f.append(1 + i%2)
				f.ackedUpTo(i+1, uint64(i+1))
			}
		}},
		{GroupPolicy(10 * ms), func(f *fakeLog) {
			f.append(1) // the first round goes at once, at t0
			f.ackedUpTo(1, 1)
			f.append(2) // waits for the next tick, t0+10ms
			f.settled()
			f.quiet(1, "group, before the window ends")
			f.clock.Advance(10*ms - 1)
			f.quiet(1, "group, 1 ns before the window ends")
			f.clock.Advance(1)
			f.ackedUpTo(2, 2)

			// Idle past several ticks: a record waits for the next tick of
			// the cadence (t0+10ms + k·10ms), not a whole window.
			f.clock.Advance(35 * ms) // t0+45ms
			f.append(1)
			f.settled()
			f.clock.Advance(5*ms - 1)
			f.quiet(2, "group, 1 ns before the cadence's tick")
			f.clock.Advance(1) // t0+50ms
			f.ackedUpTo(3, 3)

			// A round that overruns its window: what queued up during it
			// goes at once, without waiting for the clock.
			f.gate.hold.Store(true)
			f.append(1)
			f.settled()
			f.clock.Advance(10 * ms) // t0+60ms: the round starts; its fsync is held
			release := <-f.gate.waiting
			f.append(1)
			f.clock.Advance(25 * ms) // the fsync takes 25 ms
			f.gate.hold.Store(false)
			close(release)
			f.ackedUpTo(5, 5)

			// Sync does not wait for the window.
			f.append(1)
			f.settled()
			if err := f.l.Sync(context.Background()); err != nil {
				f.t.Fatal(err)
			}
			f.ackedUpTo(6, 6)
		}},
		{CountPolicy(4, 10*ms), func(f *fakeLog) {
			// Below the count, records wait for MaxWait from the oldest.
			f.append(1)
			f.append(1)
			f.settled()
			f.clock.Advance(3 * ms)
			f.append(1) // does not move the deadline
			f.settled()
			f.clock.Advance(7*ms - 1)
			f.quiet(0, "count, 1 ns before max wait")
			f.clock.Advance(1)
			f.ackedUpTo(3, 1)

			// The count reached goes at once.
			f.append(2)
			f.settled()
			f.quiet(1, "count, 2 of 4")
			f.append(1)
			f.quiet(1, "count, 3 of 4")
			f.append(1)
			f.ackedUpTo(6, 2)
			f.append(5) // one batch over the count
			f.ackedUpTo(7, 3)
		}},
		{PeriodicPolicy(100 * ms), func(f *fakeLog) {
			// Acknowledged on write; the fsync comes Interval after the last
			// one (Open, at t0).
			f.append(1)
			f.ackedUpTo(1, 0)
			f.clock.Advance(30 * ms)
			f.append(2)
			f.ackedUpTo(2, 0)
			f.settled()
			f.gate.hold.Store(true)
			f.clock.Advance(70*ms - 1)
			if n := f.gate.started.Load(); n != 0 || len(f.gate.waiting) != 0 {
				t.Fatalf("%d fsyncs 1 ns before the interval", n)
			}
			f.clock.Advance(1) // t0+100ms
			close(<-f.gate.waiting)
			f.gate.hold.Store(false)
			if err := f.l.Sync(context.Background()); err != nil { // waits for the round, adds no fsync
				t.Fatal(err)
			}
			f.syncs(1)
			if d := f.l.DurableIndex(); d != 3 {
				t.Fatalf("durable index %d, want 3", d)
			}

			// The next interval counts from that fsync.
			f.clock.Advance(50 * ms)
			f.append(1)
			f.ackedUpTo(3, 1)
			f.settled()
			f.gate.hold.Store(true)
			f.clock.Advance(50*ms - 1)
			if n := f.gate.started.Load(); n != 1 || len(f.gate.waiting) != 0 {
				t.Fatalf("%d fsyncs 1 ns before the second interval", n)
			}
			f.clock.Advance(1) // t0+200ms
			close(<-f.gate.waiting)
			f.gate.hold.Store(false)
			if err := f.l.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			f.syncs(2)
		}},
	}
	for _, c := range cases {
		t.Run(c.p.String(), func(t *testing.T) {
			f := newFakeLog(t, c.p)
			f.gate.started.Store(0) // Open fsyncs the recovered tail
			c.script(f)
		})
	}
}
