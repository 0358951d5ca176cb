package validator

import (
	"context"
	"errors"
	"sync"

	"github.com/kiroku-db/kiroku/storage"
)

// maxBackoff is the most stamps a committer takes from a scan, after
// failed claims, before it tries to claim an end clock again.
const maxBackoff = 63

// maxGroup is the most callers whose writes one group transaction carries;
// a caller who finds the last waiting group full starts the next one.
const maxGroup = 64

// committer is group commit on the client side: the writes of callers who
// arrive while a transaction of theirs is committing wait, gathered, and go
// in the next transaction together, so that a database whose every commit
// costs a round trip and a WAL flush of its own (PostgreSQL) pays one per
// group rather than one per caller. A caller alone commits at once, as it
// would without it. Every caller's writes are in exactly one committed
// transaction when do returns nil, so a group commit is as durable as the
// callers' own would have been. However many callers wait, one transaction
// of the committer is under way at a time: full groups queue behind it,
// each to commit after the one before, rather than their callers
// committing alone at once. Alone they would contend for the same rows
// (the clock's counters, which every stamp transaction raises), and on
// PostgreSQL the row locks and serialization failures that follow cost
// more than the wait.
//
// If a group's transaction fails, nothing of it was written, except after
// ErrCommitUnknown. The member that committed it then commits each
// member's writes on its own, one after another, so one caller's failed
// condition (a nonce already logged) or bad value fails only that caller,
// and the committer still has one transaction under way. After
// ErrCommitUnknown the members get that error, as a caller alone would.
type committer struct {
	db storage.Beginner
	// clock, if set, makes the committer take a clock for each group, in
	// the group's transaction (see withClock): with ends, the end clock
	// of the transactions whose outcomes it stamps (the stamp committer),
	// otherwise the begin clock of those whose requests it logs (the
	// request committer).
	clock *Clock
	ends  bool
	// skip is how many of the next groups take their clock from a scan
	// without trying to claim one, after claims failed; claimed and
	// scanned count the groups of each kind. Only the member committing
	// touches them, one transaction at a time.
	skip, backoff    int
	claimed, scanned int

	mu   sync.Mutex
	busy bool // a transaction of this committer is under way
	// queue holds the groups waiting, oldest first; only the last one
	// takes more members. Every member is blocked in do, so it holds at
	// most one group per maxGroup callers.
	queue []*group
}

type group struct {
	puts    []*storage.Put
	members []member
	lead    chan struct{} // one token: the member that takes it commits
	done    chan struct{} // closed once end and err (or ends and errs) are set
	end     int64         // the end clock the transaction stamped, if it did
	err     error
	// ends and errs, after a group that failed, are each member's own
	// commit's.
	ends []int64
	errs []error
}

// member is one caller's part of a group: its puts, puts[from:to].
type member struct{ from, to int }

// do commits puts in one transaction, with those of concurrent callers.
// It returns once they are durable, or with the error a transaction of its
// own would have had; and, from a committer with a clock, the clock they
// were stamped with. The puts must stay unchanged until it returns, but
// for that clock, which the committer sets in them (stampBegin,
// stampEnd).
func (c *committer) do(ctx context.Context, puts ...*storage.Put) (int64, error) {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		end, err := c.commit(ctx, puts)
		c.handOn()
		return end, err
	}
	var g *group
	if n := len(c.queue); n > 0 && len(c.queue[n-1].members) < maxGroup {
		g = c.queue[n-1]
	} else {
		g = &group{lead: make(chan struct{}, 1), done: make(chan struct{})}
		c.queue = append(c.queue, g)
	}
	i := len(g.members)
	g.members = append(g.members, member{from: len(g.puts), to: len(g.puts) + len(puts)})
	g.puts = append(g.puts, puts...)
	c.mu.Unlock()
	select {
	case <-g.done:
	case <-g.lead:
		// The group's writes are its members' too: commit them even if
		// this member's context ends.
		c.commitGroup(context.WithoutCancel(ctx), g)
		close(g.done)
		c.handOn()
	}
	if g.errs != nil {
		return g.ends[i], g.errs[i]
	}
	return g.end, g.err
}

// commitGroup commits g's writes in one transaction and, if that fails for
// any reason but ErrCommitUnknown, each member's in one of its own.
func (c *committer) commitGroup(ctx context.Context, g *group) {
	g.end, g.err = c.commit(ctx, g.puts)
	if g.err == nil || len(g.members) == 1 || errors.Is(g.err, storage.ErrCommitUnknown) {
		return
	}
	g.ends, g.errs = make([]int64, len(g.members)), make([]error, len(g.members))
	for i, m := range g.members {
		g.ends[i], g.errs[i] = c.commit(ctx, g.puts[m.from:m.to])
	}
}

// handOn starts the oldest waiting group's transaction, if there is one, or
// marks the committer idle.
func (c *committer) handOn() {
	c.mu.Lock()
	var g *group
	if len(c.queue) > 0 {
		g = c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
	}
	c.busy = g != nil
	c.mu.Unlock()
	if g != nil {
		g.lead <- struct{}{}
	}
}

func (c *committer) commit(ctx context.Context, puts []*storage.Put) (int64, error) {
	if c.clock == nil {
		return 0, commitPuts(ctx, c.db, puts...)
	}
	return c.withClock(ctx, puts)
}

// withClock commits puts with a clock it takes for them, and returns it.
// A clock must be max + 1 of a read of the counters made after every
// member asked for it: for a begin clock before the requests are sent,
// for an end clock after every reply arrived, and an end clock raised
// into a counter before any member returns (doc.go). The first try needs
// no scan beforehand: it claims s + 1, s the highest value this process
// has seen, in the group's transaction, one round trip in all: an end
// clock by raising every counter to s + 1 on condition that each holds
// less (Clock.claimIn), a begin clock by expecting each to hold less
// (Clock.expectIn), which writes nothing. Only if another process raised
// a counter meanwhile (or a member's own condition fails) does that
// transaction fail; then the clock comes from a scan: an end clock's
// transaction raises one counter to it, Skippable, and a begin clock's
// needs no write.
//
// A failed claim costs a round trip more than a scan would have, so after
// one the committer scans for the next groups, twice as many after each
// failed claim in a row (up to maxBackoff): where other processes raise
// the counters all the time, claims are rarely tried.
func (c *committer) withClock(ctx context.Context, puts []*storage.Put) (int64, error) {
	set, claim := stampBegin, c.clock.expectIn
	if c.ends {
		set, claim = stampEnd, c.clock.claimIn
	}
	if t, ok := c.clock.guess(); ok && c.skip == 0 {
		err := storage.UpdateWith(ctx, c.db, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
			set(puts, t)
			if err := claim(ctx, tx, t); err != nil {
				return err
			}
			return putAll(ctx, tx, puts)
		})
		if err == nil {
			if c.ends {
				c.clock.see(t) // a counter holds it now; a begin clock is in none
			}
			c.claimed, c.backoff = c.claimed+1, 0
			return t, nil
		}
		if !errors.Is(err, storage.ErrConditionNotMet) && !storage.IsRetryable(err) {
			return 0, err
		}
		c.backoff = min(2*c.backoff+1, maxBackoff)
		c.skip = c.backoff
	} else if c.skip > 0 {
		c.skip--
	}
	c.scanned++
	if !c.ends {
		t, err := c.clock.Begin(ctx)
		if err != nil {
			return 0, err
		}
		set(puts, t)
		return t, commitPuts(ctx, c.db, puts...)
	}
	t, err := c.clock.EndUnraised(ctx)
	if err != nil {
		return 0, err
	}
	set(puts, t)
	err = storage.Update(ctx, c.db, func(tx storage.Txn) error {
		if err := c.clock.raiseIn(ctx, tx, t); err != nil {
			return err
		}
		return putAll(ctx, tx, puts)
	})
	if err != nil {
		return 0, err
	}
	c.clock.see(t) // a counter holds it now
	return t, nil
}

// commitPuts commits puts in one transaction.
func commitPuts(ctx context.Context, db storage.Beginner, puts ...*storage.Put) error {
	return storage.Update(ctx, db, func(tx storage.Txn) error { return putAll(ctx, tx, puts) })
}

func putAll(ctx context.Context, tx storage.Txn, puts []*storage.Put) error {
	for _, p := range puts {
		if err := tx.Put(ctx, p); err != nil {
			return err
		}
	}
	return nil
}
