package wal

import (
	"time"

	"github.com/jonboulle/clockwork"
)

// deadlineTimer is the syncer's timer, a timer of the log's clock armed for
// one deadline at a time. The syncer decides again after every wake-up, a
// nudge included, and mostly finds the same deadline; arming for the
// deadline the timer already holds leaves it running. So a fake clock
// sees one timer per deadline, registered once: a test that waits for
// the syncer's timer (FakeClock.BlockUntilContext) and then advances the
// clock past the deadline never races a re-registration that would count
// its wait from the later time.
type deadlineTimer struct {
	clock clockwork.Clock
	t     clockwork.Timer // nil until first armed
	at    time.Time       // the deadline it is armed for; zero when disarmed
}

// arm makes the timer fire early before deadline at, unless it is armed
// for at already, and returns its channel. The wait is counted from the
// clock's time now, not from when the syncer read it to decide, so a fake
// clock advanced in between fires it at once.
func (dt *deadlineTimer) arm(at time.Time, early time.Duration) <-chan time.Time {
	if !dt.at.IsZero() && dt.at.Equal(at) {
		return dt.t.Chan()
	}
	dt.disarm()
	d := dt.clock.Until(at) - early
	if dt.t == nil {
		dt.t = dt.clock.NewTimer(d)
	} else {
		dt.t.Reset(d)
	}
	dt.at = at
	return dt.t.Chan()
}

// fired records that the syncer received the timer's tick.
func (dt *deadlineTimer) fired() { dt.at = time.Time{} }

// disarm stops the timer and drops a tick it may have left: a real timer
// leaves none since Go 1.23, a fake one's channel is buffered.
func (dt *deadlineTimer) disarm() {
	if dt.at.IsZero() {
		return
	}
	dt.at = time.Time{}
	if !dt.t.Stop() {
		select {
		case <-dt.t.Chan():
		default:
		}
	}
}
