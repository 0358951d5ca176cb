package wal

import "time"

// syncState is what the syncer knows when it decides what to do next.
type syncState struct {
	now            time.Time
	pending        int       // records appended, not yet written
	firstPendingAt time.Time // when the oldest of them was appended
	dirty          bool      // written but not yet fsynced
	lastStart      time.Time // when the last round started
	lastEnd        time.Time // when it ended
	lastSync       time.Time // when the last fsync ended
	forced         bool      // Sync or Close is waiting
}

// action is the syncer's decision: write the pending records, fsync, or
// look again after wait (0: only when nudged).
type action struct {
	write, sync bool
	wait        time.Duration
}

// decide is the sync policy as a pure function of the syncer's state; the
// syncer goroutine only carries it out.
func decide(p Policy, s syncState) action {
	if s.forced {
		// Sync or Close: write and fsync what there is; with nothing to do
		// the round still runs, to answer the callers.
		return action{write: s.pending > 0, sync: true}
	}
	switch p.Kind {
	case Batch:
		if s.pending > 0 {
			return action{write: true, sync: true}
		}
	case Group:
		if s.pending == 0 {
			return action{}
		}
		next := s.lastStart.Add(p.Window)
		if s.lastStart.IsZero() || !s.lastEnd.Before(next) {
			// The first round, or the last one took longer than the window:
			// the records that queued up during it go now.
			return action{write: true, sync: true}
		}
		// The cadence ticks at lastStart + k·Window; the round is due at the
		// first tick at or after the oldest pending record arrived.
		due := next
		if s.firstPendingAt.After(next) {
			k := (s.firstPendingAt.Sub(s.lastStart) + p.Window - 1) / p.Window
			due = s.lastStart.Add(k * p.Window)
		}
		if !due.After(s.now) {
			return action{write: true, sync: true}
		}
		return action{wait: due.Sub(s.now)}
	case Count:
		if s.pending >= p.Count {
			return action{write: true, sync: true}
		}
		if s.pending == 0 {
			return action{}
		}
		deadline := s.firstPendingAt.Add(p.MaxWait)
		if !deadline.After(s.now) {
			return action{write: true, sync: true}
		}
		return action{wait: deadline.Sub(s.now)}
	case Periodic:
		a := action{write: s.pending > 0}
		if s.dirty || s.pending > 0 {
			next := s.lastSync.Add(p.Interval)
			if !next.After(s.now) {
				a.sync = true
			} else if !a.write {
				a.wait = next.Sub(s.now)
			}
		}
		return a
	}
	return action{}
}
