package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestEpochCoreSteps drives the epoch core through scripted histories and
// checks E, D, the close request and what each step asks of the engine.
func TestEpochCoreSteps(t *testing.T) {
	type step struct {
		m    epochMsg
		want epochReady
		e, d uint64
		ask  bool // the close request after the step
	}
	tick := func(seen, low uint64) epochMsg { return epochMsg{ev: evTick, seen: seen, low: low} }
	closeAt := func(seen, low uint64) epochMsg { return epochMsg{ev: evClose, seen: seen, low: low} }
	hurry := func(e uint64) epochMsg { return epochMsg{ev: evHurry, epoch: e} }
	mark := func(lg int, x uint64) epochMsg { return epochMsg{ev: evDurable, logger: lg, epoch: x} }
	cases := []struct {
		name    string
		e, d    uint64
		loggers int
		steps   []step
	}{
		{"ticks advance while no worker lags", 5, 4, 1, []step{
			{tick(5, 0), epochReady{advanced: true}, 6, 4, false},
			{tick(6, 6), epochReady{advanced: true}, 7, 4, false},
			{tick(7, 0), epochReady{advanced: true}, 8, 4, false},
		}},
		{"a worker in an older epoch holds the close", 5, 4, 1, []step{
			{tick(5, 4), epochReady{held: true}, 5, 4, false},
			{tick(5, 5), epochReady{advanced: true}, 6, 4, false},
		}},
		{"a scan made at another epoch is stale", 5, 4, 1, []step{
			{tick(4, 0), epochReady{held: true}, 5, 4, false},
			{tick(6, 0), epochReady{held: true}, 5, 4, false},
		}},
		{"an early close needs a request", 5, 4, 1, []step{
			{closeAt(5, 0), epochReady{}, 5, 4, false},
			{hurry(5), epochReady{asked: true}, 5, 4, true},
			{closeAt(5, 0), epochReady{advanced: true}, 6, 4, false},
			{closeAt(6, 0), epochReady{}, 6, 4, false},
		}},
		{"a held early close stays asked for", 5, 4, 1, []step{
			{hurry(5), epochReady{asked: true}, 5, 4, true},
			{closeAt(5, 4), epochReady{held: true}, 5, 4, true},
			{closeAt(5, 0), epochReady{advanced: true}, 6, 4, false},
		}},
		{"a request for a closed epoch is no request", 5, 4, 1, []step{
			{hurry(4), epochReady{}, 5, 4, false},
			{hurry(9), epochReady{asked: true}, 5, 4, true},
		}},
		{"a tick leaves an early close asked for", 5, 4, 1, []step{
			{hurry(5), epochReady{asked: true}, 5, 4, true},
			{tick(5, 0), epochReady{advanced: true}, 6, 4, true},
			{closeAt(6, 0), epochReady{advanced: true}, 7, 4, false},
		}},
		{"D is the least of the loggers' marks", 9, 4, 3, []step{
			{mark(0, 8), epochReady{}, 9, 4, false},
			{mark(2, 7), epochReady{}, 9, 4, false},
			{mark(1, 6), epochReady{durable: true}, 9, 6, false},
			{mark(1, 8), epochReady{durable: true}, 9, 7, false},
			{mark(2, 5), epochReady{}, 9, 7, false}, // marks never go back
			{mark(2, 8), epochReady{durable: true}, 9, 8, false},
		}},
		{"the epoch space ends", MaxEpoch, MaxEpoch - 1, 1, []step{
			{tick(MaxEpoch, 0), epochReady{exhausted: true}, MaxEpoch, MaxEpoch - 1, false},
			{epochMsg{ev: evDrain, seen: MaxEpoch}, epochReady{exhausted: true}, MaxEpoch, MaxEpoch - 1, false},
		}},
		{"a follower follows the records it applied", 1, 0, 1, []step{
			{epochMsg{ev: evApplied, epoch: 3, seen: 6}, epochReady{durable: true}, 6, 3, false},
			{epochMsg{ev: evApplied, epoch: 3, seen: 4}, epochReady{}, 6, 3, false},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var core epochCore
			core.reset(c.e, c.d, c.loggers)
			for i, s := range c.steps {
				got := core.step(s.m)
				if got != s.want || core.e != s.e || core.d != s.d || core.want != s.ask {
					t.Fatalf("step %d %+v: %+v, E %d D %d asked %v; want %+v, E %d D %d asked %v",
						i, s.m, got, core.e, core.d, core.want, s.want, s.e, s.d, s.ask)
				}
			}
		})
	}
}

// TestEpochCoreInvariants runs random histories of workers entering and
// leaving epochs, committers asking for closes and loggers' marks
// becoming durable, in the order a fake clock's ticks and a seeded random
// source give them, and checks after every step what the engine relies
// on: E never falls, never passes a committing worker by more than one
// epoch; D never falls and never reaches E; it is the least mark.
func TestEpochCoreInvariants(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			clock := clockwork.NewFakeClock()
			const loggers, workers = 3, 5
			var core epochCore
			core.reset(1, 0, loggers)
			active := make([]uint64, workers) // 0: not committing
			proposed := make([]uint64, loggers)
			nextTick := clock.Now().Add(40 * time.Millisecond)
			for range 5000 {
				clock.Advance(time.Duration(rng.IntN(5)) * time.Millisecond)
				low := uint64(0)
				for _, a := range active {
					if a != 0 && (low == 0 || a < low) {
						low = a
					}
				}
				prevE, prevD := core.e, core.d
				var m epochMsg
				switch k := rng.IntN(6); {
				case !clock.Now().Before(nextTick):
					nextTick = nextTick.Add(40 * time.Millisecond)
					m = epochMsg{ev: evTick, seen: core.e, low: low}
				case k == 0:
					w := rng.IntN(workers)
					if active[w] == 0 {
						active[w] = core.e // enter publishes the current epoch
					} else {
						active[w] = 0
					}
					continue
				case k == 1:
					m = epochMsg{ev: evHurry, epoch: core.e - uint64(rng.IntN(2))}
				case k == 2:
					m = epochMsg{ev: evClose, seen: core.e, low: low}
				default:
					// A logger's round: its mark covers every epoch below E
					// and below the lowest worker's (markFor), and becomes
					// durable.
					lg := rng.IntN(loggers)
					lowOrE := core.e
					if low != 0 {
						lowOrE = min(low, core.e)
					}
					proposed[lg] = markFor(core.e, lowOrE, proposed[lg])
					m = epochMsg{ev: evDurable, logger: lg, epoch: proposed[lg]}
				}
				r := core.step(m)
				switch {
				case core.e < prevE || core.d < prevD:
					t.Fatalf("%+v went back: E %d→%d, D %d→%d", m, prevE, core.e, prevD, core.d)
				case core.d >= core.e:
					t.Fatalf("%+v: D %d reached E %d", m, core.d, core.e)
				case low != 0 && core.e > low+1:
					t.Fatalf("%+v: E %d passed a worker in epoch %d", m, core.e, low)
				case r.advanced != (core.e == prevE+1) || r.durable != (core.d > prevD):
					t.Fatalf("%+v: ready %+v, E %d→%d, D %d→%d", m, r, prevE, core.e, prevD, core.d)
				}
				least := core.marks[0]
				for _, x := range core.marks {
					least = min(least, x)
				}
				if core.d != least {
					t.Fatalf("%+v: D %d, least mark %d", m, core.d, least)
				}
			}
		})
	}
}

// TestDecideLinger: the logger's hold decision, case by case.
func TestDecideLinger(t *testing.T) {
	base := lingerIn{delay: 2 * time.Millisecond, waiting: 1, peak: 8, e: 5, wantE: 5,
		pending: 0, bufSize: 512 << 10, roundNs: 200_000, cpu: cpuBusy}
	with := func(f func(*lingerIn)) lingerIn { in := base; f(&in); return in }
	cases := []struct {
		name string
		in   lingerIn
		want lingerOut
	}{
		{"holds for the peak, three round times", base, lingerOut{peak: 7, hold: true, target: 7, bound: 600 * time.Microsecond}},
		{"the bound is at most the delay", with(func(in *lingerIn) { in.roundNs = 5e6 }), lingerOut{peak: 7, hold: true, target: 7, bound: 2 * time.Millisecond}},
		{"a delay below zero never holds", with(func(in *lingerIn) { in.delay = -1 }), lingerOut{peak: 7}},
		{"no peak to wait for", with(func(in *lingerIn) { in.peak = 1 }), lingerOut{peak: 1}},
		{"more than half the peak waits already", with(func(in *lingerIn) { in.waiting = 5 }), lingerOut{peak: 7}},
		{"waiting above the peak raises it", with(func(in *lingerIn) { in.waiting = 12 }), lingerOut{peak: 12}},
		{"the epoch asked for is closed", with(func(in *lingerIn) { in.wantE = 4 }), lingerOut{peak: 7}},
		{"a backlog of a buffer writes anyway", with(func(in *lingerIn) { in.pending = 512 << 10 }), lingerOut{peak: 7}},
		{"processors not looked at", with(func(in *lingerIn) { in.cpu = cpuUnknown }), lingerOut{peak: 7, askCPU: true}},
		{"a processor idle", with(func(in *lingerIn) { in.cpu = cpuIdle }), lingerOut{peak: 7}},
		{"a large peak decays by a 64th", with(func(in *lingerIn) { in.peak = 640 }), lingerOut{peak: 630, hold: true, target: 630, bound: 600 * time.Microsecond}},
	}
	for _, c := range cases {
		if got := decideLinger(c.in); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// The peak falls to nothing, one decision at a time, with nobody
	// waiting: a burst that is over stops holding.
	in := with(func(in *lingerIn) { in.waiting = 0; in.peak = 64 })
	for n := 0; ; n++ {
		out := decideLinger(in)
		if !out.hold {
			if in.peak > 2 {
				t.Fatalf("stopped holding at peak %d", in.peak)
			}
			break
		}
		if n > 64 {
			t.Fatal("the peak does not decay")
		}
		in.peak = out.peak
	}
	if yieldBeforeLinger(1) || !yieldBeforeLinger(2) {
		t.Fatal("yield: want it for two requests since the last look, not one")
	}
}

// TestRoundDecisions: whether a round has work, and its mark.
func TestRoundDecisions(t *testing.T) {
	idle := []struct {
		all         bool
		proposed, e uint64
		pending     int64
		want        bool
	}{
		{false, 4, 5, 0, true},     // every closed epoch is marked
		{false, 3, 5, 0, false},    // epoch 4 closed, not marked
		{false, 4, 5, 100, false},  // a batch of backlog
		{false, 4, 5, 99, true},    // below a batch
		{true, 4, 5, 0, false},     // a final round always writes
		{false, 10, 5, 0, true},    // marked past E (a worker held E back once)
		{false, 0, 1, 100, false},  // the first epoch's batch
		{false, 0, 2, 0, false},    // epoch 1 closed
		{false, 1, 2, 0, true},     // and marked
		{false, 1, 2, 150, false},  // a batch and more
		{true, 10, 5, 1000, false}, // final
	}
	for _, c := range idle {
		if got := roundIdle(c.all, c.proposed, c.e, c.pending, 100); got != c.want {
			t.Errorf("roundIdle(%v, %d, %d, %d): %v", c.all, c.proposed, c.e, c.pending, got)
		}
	}
	marks := []struct{ e, low, proposed, want uint64 }{
		{5, 5, 0, 4}, // no worker behind: every epoch before E
		{5, 4, 0, 3}, // a worker still in 4
		{5, 4, 4, 4}, // never below the last mark
		{5, 9, 2, 4}, // low above E counts as E
		{1, 1, 0, 0},
	}
	for _, c := range marks {
		if got := markFor(c.e, c.low, c.proposed); got != c.want {
			t.Errorf("markFor(%d, %d, %d) = %d, want %d", c.e, c.low, c.proposed, got, c.want)
		}
	}
}
