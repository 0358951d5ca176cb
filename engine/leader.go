package engine

import (
	"fmt"

	"github.com/kiroku-db/kiroku/storage"
)

// LeadershipLostError is how a replicated sink reports that another node
// now leads the log: it fails the proposals it cannot vouch for (done, or
// Propose's error) with it, and the engine's owner may tell the engine at
// once (DB.LeadershipLost). Term is the term of the new leadership, as
// far as the sink knows it. It is a storage.ErrNotLeader.
type LeadershipLostError struct {
	Term uint64
}

func (e *LeadershipLostError) Error() string {
	return fmt.Sprintf("engine: another node leads the log (term %d)", e.Term)
}

// Is makes a LeadershipLostError a storage.ErrNotLeader.
func (e *LeadershipLostError) Is(target error) bool { return target == storage.ErrNotLeader }

// LeadershipLost stops a leading engine whose log another node now leads
// (term is its term). Records it proposed and the log has not made
// durable may still become durable under the new leader, or never, so
// every commit waiting for durability fails with ErrCommitUnknown. Its
// memory may hold commits of epochs the new leader makes void, so later
// reads, writes and catalog changes fail with ErrNotLeader: the owner
// closes it and opens it again as a follower of the new leader's log. Calling it on a
// follower, or again, does nothing.
func (db *DB) LeadershipLost(term uint64) {
	if db.following.Load() {
		return
	}
	db.fail(&LeadershipLostError{Term: term})
}

// Promote makes a follower (Config.Follow) the leader of the log it
// follows: sink is that log from now on, and must hold every record the
// follower applied and none it did not (a Raft node promotes once it has
// applied all its log commits). As recovery does at Open, it makes void
// the epochs above the durable one that the records name — their commits
// were never acknowledged, and now never will be — starts an era of its
// loggers above them, and only then takes writes. An error leaves the
// engine failed.
func (db *DB) Promote(sink LogSink) error {
	if err := db.usable("promote"); err != nil {
		return err
	}
	db.followMu.Lock()
	defer db.followMu.Unlock()
	if !db.following.Load() {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "promote", Detail: "the engine leads already"}
	}
	if db.cfg.Log != LogWAL {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "promote", Detail: "an engine without a log cannot lead one"}
	}
	if n := sink.MaxRecordSize(); n < 4<<10 {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "promote", Detail: fmt.Sprintf("the log takes records of at most %d bytes", n)}
	}
	sm := db.follower
	if err := db.followApply.barrier(); err != nil {
		return err
	}
	db.sink, db.maxRecord = sink, sink.MaxRecordSize()
	db.logLast.Store(sm.last)
	if err := db.lead(sm); err != nil {
		db.fail(fmt.Errorf("promoting: %w", err))
		return err
	}
	db.follower, db.followApply = nil, nil
	db.following.Store(false)
	db.start()
	return nil
}
