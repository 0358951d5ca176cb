package wal

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestDecide(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cases := []struct {
		name string
		p    Policy
		s    syncState
		want action
	}{
		{"batch idle", BatchPolicy(), syncState{now: at(0)}, action{}},
		{"batch pending", BatchPolicy(), syncState{now: at(0), pending: 1}, action{write: true, sync: true}},
		{"forced with nothing", BatchPolicy(), syncState{now: at(0), forced: true}, action{sync: true}},
		{"group first round", GroupPolicy(10 * ms), syncState{now: at(0), pending: 1}, action{write: true, sync: true}},
		{"group within window", GroupPolicy(10 * ms), syncState{now: at(4 * ms), pending: 3, firstPendingAt: at(2 * ms), lastStart: at(0), lastEnd: at(1 * ms)},
			action{wait: 6 * ms}},
		{"group at tick", GroupPolicy(10 * ms), syncState{now: at(10 * ms), pending: 3, firstPendingAt: at(5 * ms), lastStart: at(0), lastEnd: at(1 * ms)},
			action{write: true, sync: true}},
		{"group timer fired late", GroupPolicy(10 * ms), syncState{now: at(10*ms + 300*time.Microsecond), pending: 3, firstPendingAt: at(5 * ms), lastStart: at(0), lastEnd: at(1 * ms)},
			action{write: true, sync: true}},
		{"group overran", GroupPolicy(10 * ms), syncState{now: at(13 * ms), pending: 3, firstPendingAt: at(5 * ms), lastStart: at(0), lastEnd: at(12 * ms)},
			action{write: true, sync: true}},
		{"group idle: next tick of the cadence", GroupPolicy(10 * ms), syncState{now: at(43 * ms), pending: 1, firstPendingAt: at(43 * ms), lastStart: at(0), lastEnd: at(1 * ms)},
			action{wait: 7 * ms}},
		{"group nothing pending", GroupPolicy(10 * ms), syncState{now: at(50 * ms), lastStart: at(0)}, action{}},
		{"count below", CountPolicy(5, 10*ms), syncState{now: at(2 * ms), pending: 4, firstPendingAt: at(0)}, action{wait: 8 * ms}},
		{"count reached", CountPolicy(5, 10*ms), syncState{now: at(2 * ms), pending: 5, firstPendingAt: at(0)}, action{write: true, sync: true}},
		{"count max wait", CountPolicy(5, 10*ms), syncState{now: at(10 * ms), pending: 1, firstPendingAt: at(0)}, action{write: true, sync: true}},
		{"periodic write now, sync later", PeriodicPolicy(100 * ms), syncState{now: at(10 * ms), pending: 2, lastSync: at(0)}, action{write: true}},
		{"periodic dirty waits", PeriodicPolicy(100 * ms), syncState{now: at(10 * ms), dirty: true, lastSync: at(0)}, action{wait: 90 * ms}},
		{"periodic sync due", PeriodicPolicy(100 * ms), syncState{now: at(100 * ms), dirty: true, lastSync: at(0)}, action{sync: true}},
		{"periodic clean", PeriodicPolicy(100 * ms), syncState{now: at(500 * ms), lastSync: at(0)}, action{}},

		// Boundaries, to the nanosecond.
		{"batch ignores the time", BatchPolicy(), syncState{now: at(0), pending: 3, firstPendingAt: at(-time.Hour), lastStart: at(time.Hour)},
			action{write: true, sync: true}},
		{"group 1 ns before the tick", GroupPolicy(10 * ms), syncState{now: at(10*ms - 1), pending: 1, firstPendingAt: at(5 * ms), lastStart: at(0), lastEnd: at(1 * ms)},
			action{wait: 1}},
		{"group pending since just after a tick waits a whole window", GroupPolicy(10 * ms), syncState{now: at(20*ms + 1), pending: 1, firstPendingAt: at(20*ms + 1), lastStart: at(0), lastEnd: at(1 * ms)},
			action{wait: 10*ms - 1}},
		{"group pending since a tick exactly goes at once", GroupPolicy(10 * ms), syncState{now: at(20 * ms), pending: 1, firstPendingAt: at(20 * ms), lastStart: at(0), lastEnd: at(1 * ms)},
			action{write: true, sync: true}},
		{"group round that lasted exactly the window", GroupPolicy(10 * ms), syncState{now: at(10 * ms), pending: 1, firstPendingAt: at(5 * ms), lastStart: at(0), lastEnd: at(10 * ms)},
			action{write: true, sync: true}},
		{"group round 1 ns shorter than the window", GroupPolicy(10 * ms), syncState{now: at(10*ms - 1), pending: 1, firstPendingAt: at(5 * ms), lastStart: at(0), lastEnd: at(10*ms - 1)},
			action{wait: 1}},
		{"group pending from before the round started", GroupPolicy(10 * ms), syncState{now: at(3 * ms), pending: 1, firstPendingAt: at(-1), lastStart: at(0), lastEnd: at(1 * ms)},
			action{wait: 7 * ms}},
		{"count one below", CountPolicy(5, 10*ms), syncState{now: at(10*ms - 1), pending: 4, firstPendingAt: at(0)}, action{wait: 1}},
		{"count over", CountPolicy(5, 10*ms), syncState{now: at(0), pending: 50, firstPendingAt: at(0)}, action{write: true, sync: true}},
		{"count nothing pending", CountPolicy(5, 10*ms), syncState{now: at(time.Hour), dirty: true}, action{}},
		{"count max wait from the oldest", CountPolicy(5, 10*ms), syncState{now: at(12 * ms), pending: 2, firstPendingAt: at(3 * ms), lastStart: at(11 * ms)},
			action{wait: 1 * ms}},
		{"periodic 1 ns before the interval", PeriodicPolicy(100 * ms), syncState{now: at(100*ms - 1), dirty: true, lastSync: at(0)}, action{wait: 1}},
		{"periodic write and sync due", PeriodicPolicy(100 * ms), syncState{now: at(100 * ms), pending: 1, lastSync: at(0)}, action{write: true, sync: true}},
		{"periodic pending, sync not due", PeriodicPolicy(100 * ms), syncState{now: at(100*ms - 1), pending: 1, dirty: true, lastSync: at(0)}, action{write: true}},
		{"periodic long overdue", PeriodicPolicy(100 * ms), syncState{now: at(time.Hour), dirty: true, lastSync: at(0)}, action{sync: true}},
		{"forced group mid-window", GroupPolicy(10 * ms), syncState{now: at(1 * ms), pending: 2, firstPendingAt: at(1 * ms), lastStart: at(0), lastEnd: at(1 * ms), forced: true},
			action{write: true, sync: true}},
		{"forced count below", CountPolicy(5, 10*ms), syncState{now: at(0), pending: 1, firstPendingAt: at(0), forced: true}, action{write: true, sync: true}},
		{"forced periodic clean", PeriodicPolicy(100 * ms), syncState{now: at(0), lastSync: at(0), forced: true}, action{sync: true}},
	}
	for _, c := range cases {
		if got := decide(c.p, c.s); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestDecideWaitIsExact: for random states of every policy, a wait decide
// asks for ends exactly at the boundary: the same state 1 ns before it
// still waits (1 ns), at it the syncer acts. The times come from a fake
// clock; decide sees only its arguments, so the same state always gets
// the same answer.
func TestDecideWaitIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clock := clockwork.NewFakeClockAt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	ms := time.Millisecond
	span := func(max time.Duration) time.Duration { return time.Duration(rng.Int64N(int64(max))) }
	waits := 0
	for i := range 20000 {
		var p Policy
		switch i % 4 {
		case 0:
			p = BatchPolicy()
		case 1:
			p = GroupPolicy(1 + span(20*ms))
		case 2:
			p = CountPolicy(1+rng.IntN(10), 1+span(20*ms))
		case 3:
			p = PeriodicPolicy(1 + span(200*ms))
		}
		// A history in the order the syncer lives it: a round starts and
		// ends, records arrive (perhaps during the round), time passes.
		clock.Advance(span(50 * ms))
		var s syncState
		if rng.IntN(4) > 0 {
			s.lastStart = clock.Now()
			clock.Advance(span(30 * ms))
			s.lastEnd = clock.Now()
			s.lastSync = s.lastEnd
		} else {
			s.lastSync = clock.Now() // Open
		}
		s.dirty = p.Kind == Periodic && rng.IntN(2) == 0
		if rng.IntN(5) > 0 {
			s.pending = 1 + rng.IntN(12)
			s.firstPendingAt = s.lastEnd.Add(-span(10 * ms))
			if s.lastEnd.IsZero() {
				s.firstPendingAt = clock.Now()
			}
		}
		clock.Advance(span(40 * ms))
		s.now = clock.Now()
		a := decide(p, s)
		if again := decide(p, s); again != a {
			t.Fatalf("%v %+v: %+v, then %+v", p, s, a, again)
		}
		if a.wait < 0 || a.wait > 0 && (a.write || a.sync) {
			t.Fatalf("%v %+v: %+v", p, s, a)
		}
		if a.wait == 0 {
			continue
		}
		waits++
		before, at := s, s
		before.now = s.now.Add(a.wait - 1)
		at.now = s.now.Add(a.wait)
		if got := decide(p, before); got != (action{wait: 1}) {
			t.Fatalf("%v %+v waits %v; 1 ns before that: %+v", p, s, a.wait, got)
		}
		if got := decide(p, at); !got.write && !got.sync {
			t.Fatalf("%v %+v waits %v; then: %+v", p, s, a.wait, got)
		}
	}
	if waits < 500 {
		t.Fatalf("only %d of the states waited: the test did not exercise the waits", waits)
	}
}
