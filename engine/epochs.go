package engine

import (
	"slices"
	"time"
)

// epochCore is the engine's epoch bookkeeping as a state machine: the
// global epoch E, the durable epoch D, each logger's durable mark, and the
// committers' requests to close the open epoch early. It reads no clock,
// takes no lock, starts nothing and reads nothing shared: the engine
// feeds it what happened (step) and carries out what the result asks,
// the way raft's RawNode is driven. The engine steps it under DB.wmu and
// publishes E, D and the close request to atomics that the hot paths read
// without a lock (DB.publishLocked).
type epochCore struct {
	e, d uint64
	// marks is each logger's durable epoch: the X of its last mark the
	// log made durable. D is their minimum.
	marks []uint64
	// want is set while a close was asked for and not yet made; wantE is
	// the highest epoch a committer asked to close, hurries how many
	// asked in all (the loggers' linger reads both).
	want    bool
	wantE   uint64
	hurries uint64
}

// epochEvent is what happened, as an epochMsg tells the core.
type epochEvent uint8

const (
	// evTick: the epoch interval passed; close the open epoch.
	evTick epochEvent = iota + 1
	// evDrain: the engine is closing; close the open epoch.
	evDrain
	// evHurry: a committer waits for epoch epoch to be durable and asks
	// for an early close (epoch E, when the epoch's sequence numbers ran
	// out).
	evHurry
	// evClose: a logger makes the early close asked for, if one was.
	evClose
	// evDurable: the log made durable logger logger's mark X = epoch.
	evDurable
	// evApplied: a follower applied the leader's records up to durable
	// epoch epoch; they name epochs below seen, which E stays above.
	evApplied
)

// epochMsg is one input of the core. A close (evTick, evDrain, evClose)
// carries what the caller saw of the workers: low, the lowest epoch a
// worker was committing in (0 if none was), found while E was seen. The
// core does not read the workers itself; a scan made at another E is
// stale and the close is held.
type epochMsg struct {
	ev        epochEvent
	epoch     uint64
	logger    int
	seen, low uint64
}

// epochReady is what a step asks of the engine.
type epochReady struct {
	// advanced: E rose by one; the loggers have a closed epoch to write.
	advanced bool
	// held: a close was due, but a worker still commits in an older epoch
	// (or the scan was stale): ask again once it has moved on.
	held bool
	// exhausted: E is MaxEpoch and can never close.
	exhausted bool
	// asked: an evHurry found the epoch open and recorded the request;
	// the committer counts as waiting for a close.
	asked bool
	// durable: D rose; release the waiters it covers.
	durable bool
}

// reset starts the core at E = e, D = d with loggers loggers, each
// durable to d, and no request.
func (c *epochCore) reset(e, d uint64, loggers int) {
	*c = epochCore{e: e, d: d, marks: make([]uint64, loggers)}
	for i := range c.marks {
		c.marks[i] = d
	}
}

// step applies m.
func (c *epochCore) step(m epochMsg) (r epochReady) {
	switch m.ev {
	case evTick, evDrain:
		return c.advance(m)
	case evClose:
		if !c.want {
			return r
		}
		r = c.advance(m)
		// A close that could not be made stays asked for: the worker in
		// the older epoch is still entering, and pokes again.
		c.want = r.held
	case evHurry:
		if m.epoch < c.e {
			return r // closed already: nothing to hurry
		}
		c.hurries++
		c.wantE = max(c.wantE, m.epoch)
		c.want = true
		r.asked = true
	case evDurable:
		c.marks[m.logger] = max(c.marks[m.logger], m.epoch)
		if d := slices.Min(c.marks); d > c.d {
			c.d = d
			r.durable = true
		}
	case evApplied:
		c.e = max(c.e, m.seen)
		for i := range c.marks {
			c.marks[i] = max(c.marks[i], m.epoch)
		}
		if m.epoch > c.d {
			c.d = m.epoch
			r.durable = true
		}
	}
	return r
}

// advance closes the open epoch unless a worker still commits in an older
// one: no worker falls more than one epoch behind.
func (c *epochCore) advance(m epochMsg) (r epochReady) {
	switch {
	case c.e >= MaxEpoch:
		r.exhausted = true
	case m.seen != c.e || m.low != 0 && m.low < c.e:
		r.held = true
	default:
		c.e++
		r.advanced = true
	}
	return r
}

// ---- the logger's decisions ------------------------------------------------

// cpuState is what the logger's shell knows of the processors when it
// weighs a hold.
type cpuState uint8

const (
	cpuUnknown cpuState = iota // not looked at yet
	cpuIdle                    // no goroutine waits for a processor
	cpuBusy                    // goroutines wait for a processor
)

// lingerIn is what a logger knows when it weighs holding an early close.
type lingerIn struct {
	delay    time.Duration // Config.CommitDelay; negative: never hold
	waiting  int64         // committers waiting for a close now
	peak     int64         // the recent peak of waiting, as last kept
	e, wantE uint64        // E, and the highest epoch asked to close
	pending  int64         // the logger's backlog, in bytes
	bufSize  int64         // Config.LogBufferSize
	roundNs  int64         // the recent round time (write and fsync)
	cpu      cpuState
}

// lingerOut is the decision.
type lingerOut struct {
	// peak is the peak to keep, whatever the decision.
	peak int64
	// askCPU: everything but the processors says hold; look at them and
	// decide again (reading them costs, so only then).
	askCPU bool
	// hold: hold the close until target committers wait, the backlog
	// reaches a buffer, or bound passes.
	hold   bool
	target int64
	bound  time.Duration
}

// decideLinger is the logger's hold decision (see logger.linger for the
// reasons): a pure function of its inputs. The peak decays by at least one
// per decision. It holds only while at most half as many committers wait
// as the peak, the processors are busy, the epoch asked to close is still
// open, and the logger has no backlog of a buffer; it holds for as many as
// the peak, for at most three round times and at most the delay.
func decideLinger(in lingerIn) lingerOut {
	peak := max(in.waiting, in.peak-(in.peak+63)/64)
	out := lingerOut{peak: peak}
	if in.delay < 0 || peak < 2 || 2*in.waiting > peak || in.e > in.wantE || in.pending >= in.bufSize {
		return out
	}
	switch in.cpu {
	case cpuUnknown:
		out.askCPU = true
		return out
	case cpuIdle:
		return out
	}
	out.hold, out.target = true, peak
	out.bound = min(3*time.Duration(in.roundNs), in.delay)
	return out
}

// yieldBeforeLinger: two or more committers asked for a close since the
// logger last looked; some are likely runnable, and one yield lets them
// reach their wait before the logger counts the waiting.
func yieldBeforeLinger(hurriesSince uint64) bool { return hurriesSince >= 2 }

// roundIdle reports whether a round has nothing to do: not a final one
// (all), every closed epoch marked already (proposed is the last mark's
// X), and the backlog below a write batch.
func roundIdle(all bool, proposed, e uint64, pending, batch int64) bool {
	return !all && proposed+1 >= e && pending < batch
}

// markFor is the X of a round's mark: every epoch before both E and the
// lowest epoch a worker commits in (low, E if none does), and never below
// the last mark: marks never go back, recovery takes the last as durable.
func markFor(e, low, proposed uint64) uint64 {
	return max(min(e, low)-1, proposed)
}
