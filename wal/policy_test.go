package wal

import (
	"testing"
	"time"
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
	}
	for _, c := range cases {
		if got := decide(c.p, c.s); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}
