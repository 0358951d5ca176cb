package wal

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
	"golang.org/x/sys/unix"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

// Go's runtime timers wake up to a millisecond late on some Linux machines
// (1.08 ms for a 50 µs timer on the 2-core VMs kiroku is developed on),
// which would stretch a 1 ms group window to 2 ms. The syncer therefore
// locks its OS thread, sets the thread's timer slack to 1 ns, and sleeps
// the last stretch of short, time-driven waits in ppoll on an eventfd
// (about 60 µs late there). A nudge writes the eventfd while the syncer
// sleeps, so a Count policy's threshold, reached mid-sleep, starts the
// round at once instead of when the sleep ends.

func lockSyncerThread() {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
}

// sleeper is the syncer's precise, interruptible sleep. It sleeps in real
// time, so the log has one only with the real clock (Config.Clock), which
// it reads to resume a sleep a signal cut short.
type sleeper struct {
	clock clockwork.Clock
	armed atomic.Bool  // the syncer is in, or about to enter, ppoll
	woken atomic.Int64 // sleeps a nudge ended early (instrumentation: tests read it)
	mu    sync.Mutex   // guards fd against close while a nudger writes it
	fd    int          // eventfd; -1 once closed
}

func newSleeper(clock clockwork.Clock) (*sleeper, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &sleeper{clock: clock, fd: fd}, nil
}

// sleep blocks for d or until interrupt, whichever is first. wake is the
// syncer's nudge channel: a nudge sent before the sleeper was armed is
// taken from it and ends the sleep at once (the syncer looks at its state
// after every sleep, so the token has done its work); one sent after finds
// the sleeper armed and writes the eventfd. Arming before receiving, and
// sending before looking at armed, leaves no order in which both miss.
func (s *sleeper) sleep(d time.Duration, wake chan struct{}) {
	s.armed.Store(true)
	defer s.armed.Store(false)
	select {
	case <-wake:
		s.woken.Add(1)
		return
	default:
	}
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
	ts := unix.NsecToTimespec(int64(d))
	start := s.clock.Now()
	for {
		n, err := unix.Ppoll(fds, &ts, nil)
		if n > 0 {
			s.woken.Add(1)
			break
		}
		if err != unix.EINTR {
			break
		}
		left := d - s.clock.Since(start)
		if left <= 0 {
			break
		}
		ts = unix.NsecToTimespec(int64(left))
	}
	var buf [8]byte
	_, _ = unix.Read(s.fd, buf[:]) // drain; EAGAIN when the timeout ended it
}

// interrupt ends a sleep in progress.
func (s *sleeper) interrupt() {
	if !s.armed.Load() {
		return
	}
	one := [8]byte{1}
	s.mu.Lock()
	if s.fd >= 0 {
		_, _ = unix.Write(s.fd, one[:]) // EAGAIN only if the counter is full: it is already readable
	}
	s.mu.Unlock()
}

func (s *sleeper) close() {
	s.mu.Lock()
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
	s.mu.Unlock()
}

// dropCache asks the kernel to drop a sealed, synced segment's pages
// from the page cache.
func dropCache(f vfs.File) {
	if fd := f.Fd(); fd != vfs.InvalidFd {
		_ = unix.Fadvise(int(fd), 0, 0, unix.FADV_DONTNEED)
	}
}

// newZeros returns n zero bytes (n a multiple of 2 MiB) mapped outside the
// Go heap in 2 MiB-aligned memory advised to use transparent huge pages,
// then made read-only: a write to it faults instead of corrupting every
// later zero-fill. Without huge pages (THP off, or none free) it is still
// zeros in 4 KiB pages; if the mapping fails, it comes from the heap.
func newZeros(n int) []byte {
	const huge = 2 << 20
	m, err := unix.Mmap(-1, 0, n+huge, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return alignedBlocks(n)
	}
	b := vfsutil.Align(m, huge, n)
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	// A write fault allocates the page (a huge one if the advice took);
	// reading alone would map the shared zero page, 4 KiB at a time.
	for i := 0; i < n; i += 4096 {
		b[i] = 0
	}
	if err := unix.Mprotect(b, unix.PROT_READ); err != nil {
		_ = unix.Munmap(m)
		return alignedBlocks(n)
	}
	return b
}
