package ledger

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// gate bounds the Starlark executions a ledger runs at once, so that
// together they cannot take more memory than Limits.MaxTotalMemoryBytes
// nor more goroutines than Limits.MaxConcurrentExecutions. Every execution
// reserves the same MaxMemoryBytes, so the weighted bound is a count:
// min(MaxConcurrentExecutions, MaxTotalMemoryBytes / MaxMemoryBytes)
// slots.
//
// An execution holds its slot only while its Starlark runs — from its
// first Starlark contract to the end of its contract call, nested calls
// included — never while its transaction commits, so the bound costs
// nothing to the commit pipeline. Waiters are served in arrival order (a
// channel's blocked senders are).
//
// A contract's top level runs in a slot too, with a budget of its own: a
// registration's compile takes one (Ledger.RegisterContract); a contract
// prepared rather than compiled (prepareStarlark) runs its top level at
// its first call, in the slot of the execution that calls it if that is
// the execution's first Starlark contract (before the execution has
// allocated anything), or in a second slot, which the execution waits for
// no longer than it may still run (starContract.function). The frozen
// globals a top level leaves are kept with the compiled contract for as
// long as the process keeps it: no slot counts them.
type gate struct {
	slots chan struct{}
	// held and peak count slots in use and the most ever in use at once,
	// for tests and for the invariant below.
	held, peak atomic.Int64
}

func newGate(slots int) *gate {
	if slots < 1 {
		panic(fmt.Sprintf("ledger: gate of %d slots", slots))
	}
	return &gate{slots: make(chan struct{}, slots)}
}

// gateSlots is the number of executions l lets run at once.
func gateSlots(l Limits) int {
	return max(1, min(l.MaxConcurrentExecutions, l.MaxTotalMemoryBytes/l.MaxMemoryBytes))
}

// enter takes a slot, waiting at most wait for one. It fails with ctx's
// error if ctx ends first, or with ErrOverloaded. leave gives the slot
// back; call it exactly once.
func (g *gate) enter(ctx context.Context, wait time.Duration) (leave func(), err error) {
	select {
	case g.slots <- struct{}{}:
		return g.entered(), nil
	default:
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.entered(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return nil, fmt.Errorf("%w: no room for another contract within %v (%d running, the most allowed)", ErrOverloaded, wait, cap(g.slots))
	}
}

func (g *gate) entered() func() {
	n := g.held.Add(1)
	if n > int64(cap(g.slots)) {
		panic(fmt.Sprintf("ledger: %d executions hold a gate of %d slots", n, cap(g.slots)))
	}
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	var left atomic.Bool
	return func() {
		if !left.CompareAndSwap(false, true) {
			panic("ledger: a gate slot left twice")
		}
		g.held.Add(-1)
		<-g.slots
	}
}
