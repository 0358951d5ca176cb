package validator

import (
	"context"
	"errors"
	"sync"

	"github.com/kiroku-db/kiroku/storage"
)

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
	// raise, if set, writes the clock of a transaction's members in it:
	// the highest clock value any of them carries (Clock.raiseIn).
	raise func(ctx context.Context, tx storage.Txn, t int64) error

	mu   sync.Mutex
	busy bool // a transaction of this committer is under way
	// queue holds the groups waiting, oldest first; only the last one
	// takes more members. Every member is blocked in do, so it holds at
	// most one group per maxGroup callers.
	queue []*group
}

type group struct {
	puts    []*storage.Put
	clock   int64 // the highest clock value a member carries
	members []member
	lead    chan struct{} // one token: the member that takes it commits
	done    chan struct{} // closed once err (and errs) are set
	err     error
	// errs, after a group that failed, is each member's own commit's.
	errs []error
}

// member is one caller's part of a group: its clock and its puts,
// puts[from:to].
type member struct {
	clock    int64
	from, to int
}

// do commits puts, which carry the clock value clock (0 for none), in one
// transaction, with those of concurrent callers. It returns once they are
// durable, or with the error a transaction of its own would have had. The
// puts must stay unchanged until it returns.
func (c *committer) do(ctx context.Context, clock int64, puts ...*storage.Put) error {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		err := c.commit(ctx, clock, puts)
		c.handOn()
		return err
	}
	var g *group
	if n := len(c.queue); n > 0 && len(c.queue[n-1].members) < maxGroup {
		g = c.queue[n-1]
	} else {
		g = &group{lead: make(chan struct{}, 1), done: make(chan struct{})}
		c.queue = append(c.queue, g)
	}
	i := len(g.members)
	g.members = append(g.members, member{clock: clock, from: len(g.puts), to: len(g.puts) + len(puts)})
	g.puts = append(g.puts, puts...)
	g.clock = max(g.clock, clock)
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
		return g.errs[i]
	}
	return g.err
}

// commitGroup commits g's writes in one transaction and, if that fails for
// any reason but ErrCommitUnknown, each member's in one of its own.
func (c *committer) commitGroup(ctx context.Context, g *group) {
	g.err = c.commit(ctx, g.clock, g.puts)
	if g.err == nil || len(g.members) == 1 || errors.Is(g.err, storage.ErrCommitUnknown) {
		return
	}
	g.errs = make([]error, len(g.members))
	for i, m := range g.members {
		g.errs[i] = c.commit(ctx, m.clock, g.puts[m.from:m.to])
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

func (c *committer) commit(ctx context.Context, clock int64, puts []*storage.Put) error {
	if c.raise == nil || clock == 0 {
		return commitPuts(ctx, c.db, puts...)
	}
	return storage.Update(ctx, c.db, func(tx storage.Txn) error {
		if err := c.raise(ctx, tx, clock); err != nil {
			return err
		}
		return putAll(ctx, tx, puts)
	})
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
