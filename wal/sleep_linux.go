package wal

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Go's runtime timers wake up to a millisecond late on some Linux machines
// (1.08 ms for a 50 µs timer on the 2-core VMs kiroku is developed on),
// which would stretch a 1 ms group window to 2 ms. The syncer therefore
// locks its OS thread, sets the thread's timer slack to 1 ns, and sleeps
// the last stretch of short, time-driven waits with nanosleep (about 60 µs
// late there).

func lockSyncerThread() {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
}

func preciseSleep(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
