package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

const (
	tmpSuffix     = ".tmp"
	lockName      = "LOCK"
	truncateName  = "TRUNCATE"
	truncMarkSize = 12 // index (8) + CRC-32C of it (4)
)

// Errors.
var (
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("wal: log closed")
	// ErrFailed wraps the I/O error (a failed write or fsync) that put the
	// log in its failed state. It is returned to every waiting and every
	// later caller; nothing is retried (an fsync that failed may have
	// dropped the very pages it was to write, so no later fsync can vouch
	// for them).
	ErrFailed = errors.New("wal: log failed")
	// ErrTooLarge is returned for a record over Config.MaxRecordSize.
	ErrTooLarge = errors.New("wal: record too large")
	// ErrOutOfRange is returned for an index outside the log.
	ErrOutOfRange = errors.New("wal: index out of range")
)

// Recovery is what Open found.
type Recovery struct {
	Segments   int
	FirstIndex uint64
	LastIndex  uint64    // 0 if the log is empty
	TornTail   *TornTail // non-nil if a partial write was truncated
	// Truncated is set if a suffix truncation interrupted by a crash was
	// completed: records after this index were removed.
	Truncated *uint64
}

// Stats are counters since Open.
type Stats struct {
	Appends uint64 // records acknowledged or pending
	Writes  uint64 // write calls to segment files
	Syncs   uint64 // fdatasync calls on segment files
	Bytes   uint64 // record bytes written
	// Recycled counts segments made from a file TruncateFront kept
	// (Config.RecycleSegments) rather than created.
	Recycled uint64
}

// round is one write (and, except under Periodic, fsync) of the pending
// records. Appenders take the current round under Log.mu when they append;
// the syncer swaps in a fresh round under the same lock when it takes the
// pending records, so a waiter is always registered on the round that
// covers its record before that round's target is read: no lost wakeups.
//
// A round ends once, in the syncer (finish): err is set, done is closed
// for the appenders that wait (Append, AppendBatch), then the callbacks of
// AppendAsync run in the order their batches were appended. Rounds end in
// the order they were taken, so callbacks run in append order across
// rounds too.
type round struct {
	done  chan struct{}
	err   error
	calls []asyncCall // appended under Log.mu while the round is current
}

// asyncCall is one AppendAsync batch's callback and its last index.
type asyncCall struct {
	last uint64
	fn   func(last uint64, err error)
}

func newRound() *round { return &round{done: make(chan struct{})} }

// finish ends the round with err (nil: its records are acknowledged). The
// syncer calls it once the round is no longer current, so no appender
// touches calls any more.
func (r *round) finish(err error) {
	r.err = err
	close(r.done)
	for _, c := range r.calls {
		if err != nil {
			c.fn(0, err)
		} else {
			c.fn(c.last, nil)
		}
	}
	r.calls = nil
}

// chunk is encoded frames bound for one segment at one offset. It starts
// on a block boundary: its first head bytes repeat what the segment holds
// already from there (Log.mu.tail).
type chunk struct {
	seg  uint64 // first index of the segment
	off  int64  // a multiple of blockSize
	head int
	data []byte
}

// Log is a segmented write-ahead log. Append is safe for concurrent use;
// TruncateAfter must not race with Append (it makes appends wait).
type Log struct {
	cfg      Config
	fs       vfs.FS
	clock    clockwork.Clock // Config.Clock: every reading of time and every wait
	lock     io.Closer
	dir      vfs.File
	recovery Recovery
	direct   bool // segment files use direct I/O (Config.BufferedIO)

	// Owned by the syncer goroutine (and by Open before it starts).
	active    vfs.File
	activeSeg uint64
	lastStart time.Time
	lastEnd   time.Time
	lastSync  time.Time
	dirty     bool

	closeOnce sync.Once
	closeErr  error

	wake     chan struct{} // capacity 1: a nudge for the syncer
	sleeper  *sleeper      // the syncer's precise sleep; nil under Batch, which never waits, and with a clock other than the real one
	stop     chan struct{} // closed by Close
	done     chan struct{} // closed when the syncer has exited
	prep     chan prepared // zero-filled segment files, ready to use
	prepNeed chan struct{} // capacity 1: the syncer asks for the next segment
	// sealed carries segments the syncer has finished with, synced, to the
	// preparer, which drops their pages from the page cache and closes
	// them (see release).
	sealed   chan vfs.File
	prepStop chan struct{}
	prepDone chan struct{}
	truncReq chan truncRequest

	writes, syncs, bytes, recycledN atomic.Uint64

	// recycled holds the paths of segment files TruncateFront kept for
	// the preparer, each durably renamed to a temporary name, at most
	// Config.RecycleSegments.
	recycleMu sync.Mutex
	recycled  []string
	// scanMu is held shared by Scan while it reads segment files, and by
	// TruncateFront to rename one for reuse: a file the preparer will
	// overwrite is never one a Scan is reading.
	scanMu sync.RWMutex

	// truncMu serializes TruncateFront and TruncateAfter: both change the
	// segment list outside mu while they remove files.
	truncMu sync.Mutex

	mu struct {
		sync.Mutex
		cond           *sync.Cond // pending shrank, log failed or closed, truncation ended
		closing        bool
		failed         error
		segs           []segment // every segment; appends go to the last
		next           uint64    // index of the next record
		off            int64     // offset in the last segment for the next frame
		pending        []chunk
		pendingBytes   int
		pendingCount   int
		firstPendingAt time.Time
		round          *round
		written        uint64 // last index handed to the OS
		durable        uint64 // last index covered by an fsync
		appends        uint64
		truncating     bool
		forced         []chan error // Sync calls waiting
		spare          [][]byte     // chunk buffers for reuse, at most maxSpare
		// tail is the last segment's bytes from the block boundary before
		// off up to off, while no pending chunk is for that segment: a
		// chunk begins with it, so that it is written in whole blocks.
		tail []byte
	}
}

type prepared struct {
	path string
	err  error
}

type truncRequest struct {
	index uint64
	done  chan error
}

// Open opens the log in cfg.Dir, creating it if needed, and recovers it:
// every record of every segment is verified. A partial write at the tail is
// truncated and reported in Recovery().TornTail; a bad record anywhere else
// is a *CorruptionError, and the log does not open.
func Open(cfg Config) (*Log, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	fs := cfg.FS
	if err := fs.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	// The directory's own entry must be durable, or a crash can lose the
	// whole log however well its files were synced.
	if err := vfsutil.SyncDir(fs, fs.PathDir(cfg.Dir)); err != nil {
		return nil, fmt.Errorf("wal: sync parent directory: %w", err)
	}
	lock, err := fs.Lock(fs.PathJoin(cfg.Dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("wal: lock %s: %w", cfg.Dir, err)
	}
	l := &Log{cfg: cfg, fs: fs, clock: cfg.Clock, lock: lock, direct: !cfg.BufferedIO && cfg.SegmentSize%blockSize == 0,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		prep: make(chan prepared), prepNeed: make(chan struct{}, 1), sealed: make(chan vfs.File, maxSealed), prepStop: make(chan struct{}), prepDone: make(chan struct{}),
		truncReq: make(chan truncRequest)}
	l.mu.cond = sync.NewCond(&l.mu.Mutex)
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	if cfg.Policy.Kind != Batch && preciseClock(cfg.Clock) {
		if l.sleeper, err = newSleeper(cfg.Clock); err != nil {
			l.closeFiles()
			return nil, fmt.Errorf("wal: %w", err)
		}
	}
	l.mu.round = newRound()
	l.lastSync = l.clock.Now() // Periodic counts its interval from here
	go l.prepareLoop()
	go l.syncLoop()
	return l, nil
}

func (l *Log) path(name string) string { return l.fs.PathJoin(l.cfg.Dir, name) }

func (l *Log) closeFiles() {
	if l.active != nil {
		l.active.Close()
	}
	if l.dir != nil {
		l.dir.Close()
	}
	l.lock.Close()
}

func (l *Log) recover() error {
	var err error
	if l.dir, err = l.fs.OpenDir(l.cfg.Dir); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	firsts, err := listSegments(l.fs, l.cfg.Dir, true)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if len(firsts) == 0 {
		if err := l.createSegment(1); err != nil {
			return err
		}
		firsts = []uint64{1}
	}
	mark, hasMark, err := l.readTruncateMark()
	if err != nil {
		return err
	}
	// Segments past an interrupted truncation's target are removed by
	// finishTruncate below; recovery does not read them.
	beyondMark := func(i int) bool { return hasMark && i > 0 && firsts[i] > mark+1 }
	var segs []segment
	var tailEnd int64 // offset just past the last record of the last segment
	var tailBuf []byte
	var prevSize int64
	for i, first := range firsts {
		name := segName(first)
		if beyondMark(i) {
			break
		}
		if i > 0 && first != segs[i-1].last+1 {
			return &CorruptionError{Segment: name, Index: segs[i-1].last + 1,
				Reason: fmt.Sprintf("segment starts at index %d; the one before ended at %d", first, segs[i-1].last)}
		}
		buf, err := readSegment(l.fs, l.path(name))
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		res := scanSegment(buf, first)
		sealed := i < len(firsts)-1 && !beyondMark(i+1)
		// Every segment file is made at full size before it gets its name,
		// so none is shorter after a crash. The last one may be of an
		// earlier SegmentSize, like the segment before it.
		if size := int64(len(buf)); !sealed && size < l.cfg.SegmentSize && (i == 0 || size != prevSize) {
			return &CorruptionError{Segment: name, Offset: size, Index: res.last + 1,
				Reason: fmt.Sprintf("the file is %d bytes, but segments are made %d bytes long: it was cut short, and records past its end may be lost", size, l.cfg.SegmentSize)}
		}
		prevSize = int64(len(buf))
		seg := segment{first: first, last: res.last}
		tailEnd, tailBuf = res.end, buf
		switch {
		case hasMark && res.last >= mark:
			// The interrupted truncation's target: whatever follows mark is
			// half-zeroed and is cut by finishTruncate below.
		case res.badErr == nil:
		case sealed || res.corrupt:
			return &CorruptionError{Segment: name, Offset: res.end, Index: res.last + 1, Reason: res.badErr.Error()}
		default:
			torn := &TornTail{Segment: name, Offset: res.end, Bytes: res.dirty - res.end, Reason: res.badErr.Error()}
			if err := l.zeroRange(name, res.end, res.dirty); err != nil {
				return err
			}
			l.recovery.TornTail = torn
			l.cfg.Logf("wal: truncated a torn tail in %s at offset %d (%d bytes): %s", name, torn.Offset, torn.Bytes, torn.Reason)
		}
		if sealed && seg.last < seg.first {
			return &CorruptionError{Segment: name, Index: first, Reason: "sealed segment holds no record"}
		}
		segs = append(segs, seg)
	}
	l.mu.segs = segs
	l.setTailLocked(tailBuf, tailEnd)
	if hasMark { // finishTruncate cuts the log, and sets off, at mark
		if err := l.finishTruncate(mark, false); err != nil {
			return err
		}
		l.recovery.Truncated = &mark
	}
	last := l.mu.segs[len(l.mu.segs)-1]
	if l.active, err = l.openSegment(last.first); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	// The records read back may sit only in the page cache: a process that
	// died between a write and its fdatasync left them there. They count
	// as durable from here on (and the segment may be sealed without
	// another fsync), so make them so. Every earlier segment was fsynced
	// before the next one was installed.
	if err := l.active.SyncData(); err != nil {
		return fmt.Errorf("wal: sync the recovered tail: %w", err)
	}
	l.mu.next = last.last + 1
	l.mu.written = last.last
	l.mu.durable = last.last
	l.activeSeg = last.first
	l.recovery.Segments = len(l.mu.segs)
	l.recovery.FirstIndex = l.mu.segs[0].first
	l.recovery.LastIndex = last.last
	return nil
}

// Recovery returns what Open found.
func (l *Log) Recovery() Recovery { return l.recovery }

// createSegment makes a zero-filled segment for first, durably named.
func (l *Log) createSegment(first uint64) error {
	tmp := l.path(segName(first) + tmpSuffix)
	if err := zeroFill(l.fs, tmp, l.cfg.SegmentSize, l.direct); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	return l.install(tmp, first)
}

// openSegment opens the segment of first for writing, with direct I/O
// unless Config.BufferedIO.
func (l *Log) openSegment(first uint64) (vfs.File, error) {
	f, err := l.fs.OpenReadWrite(l.path(segName(first)), vfs.WriteCategoryUnspecified)
	if err == nil && l.direct {
		vfsutil.SetDirect(f, true)
	}
	return f, err
}

// setTailLocked sets off to end and tail to the bytes of buf, the last
// segment, from the block boundary before end up to it.
func (l *Log) setTailLocked(buf []byte, end int64) {
	l.mu.off = end
	l.mu.tail = append(l.mu.tail[:0], buf[end&^(blockSize-1):end]...)
}

// install renames a prepared file to the segment of first and syncs the
// directory, so the segment exists durably before any record is put in it.
func (l *Log) install(tmp string, first uint64) error {
	if err := l.fs.Rename(tmp, l.path(segName(first))); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := l.dir.Sync(); err != nil {
		return fmt.Errorf("wal: sync directory: %w", err)
	}
	return nil
}

// zeroRange zeroes [from, to) of a segment and syncs it.
func (l *Log) zeroRange(name string, from, to int64) error {
	if to <= from {
		return nil
	}
	f, err := l.fs.OpenReadWrite(l.path(name), vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	if err := writeZeros(f, from, to); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := f.SyncData(); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	return nil
}

// ---- appending ----------------------------------------------------------

// Append appends one record and returns its index once it is acknowledged
// under the log's policy: durable (an fdatasync that began after the record
// was written has returned) for Batch, Group and Count; written to the
// operating system for Periodic. ctx bounds only the wait for queue space
// (backpressure); once the record is accepted, Append waits for its outcome,
// so it never returns without saying whether the record is in the log.
// The log does not retain payload.
func (l *Log) Append(ctx context.Context, payload []byte) (uint64, error) {
	one := [1][]byte{payload}
	return l.await(l.enqueue(ctx, one[:], nil))
}

// AppendBatch appends several records with consecutive indexes, atomically
// with respect to other appends, and returns the first index once all are
// acknowledged.
func (l *Log) AppendBatch(ctx context.Context, payloads [][]byte) (uint64, error) {
	if len(payloads) == 0 {
		return 0, errEmptyBatch
	}
	return l.await(l.enqueue(ctx, payloads, nil))
}

// AppendAsync appends payloads after every record appended before, in
// order, and returns the index of the first without waiting for them to be
// written; done is called once all of them are durable under the log's
// policy (under Periodic: written) with the index of the last, or with
// the error that failed the log (and index 0). Calls of done are made in
// append order, from the log's own goroutine; done must not block (hand
// off to a channel or goroutine of your own). Like Append it waits while
// MaxPending bytes are pending (backpressure), and refuses records over
// MaxRecordSize, after Close or after a failure, without calling done.
//
// Batches appended without waiting share rounds: however many are in
// flight, one fsync covers all that were written before it began. done
// may run before AppendAsync returns. It may call the log's methods that
// do not wait for the syncer (LastIndex, DurableIndex, Stats, Read, Scan),
// never Append, AppendBatch, AppendAsync (which may wait for room), Sync,
// TruncateAfter or Close. Every done has been called when Close returns.
// A nil done is allowed: the batch is appended and nothing is called. The
// log does not retain payloads. An empty batch is refused.
func (l *Log) AppendAsync(payloads [][]byte, done func(last uint64, err error)) (first uint64, err error) {
	if len(payloads) == 0 {
		return 0, errEmptyBatch
	}
	first, _, err = l.enqueue(context.Background(), payloads, done)
	return first, err
}

var errEmptyBatch = errors.New("wal: empty batch")

// await waits for the round an append was registered on, and returns the
// append's first index once the round acknowledged it.
func (l *Log) await(first uint64, r *round, err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	<-r.done
	if r.err != nil {
		return 0, r.err
	}
	return first, nil
}

// enqueue is every append: it checks the records, waits for room (ctx
// bounds only that wait), assigns their indexes, encodes them into the
// pending chunks and registers the batch on the current round, with done
// as its callback if not nil. It returns the first index and the round
// that will acknowledge the batch; the caller waits on the round's done
// channel or leaves it to call done.
func (l *Log) enqueue(ctx context.Context, payloads [][]byte, done func(uint64, error)) (uint64, *round, error) {
	total := 0
	for _, p := range payloads {
		if len(p) > l.cfg.MaxRecordSize {
			return 0, nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(p), l.cfg.MaxRecordSize)
		}
		total += frameSize(len(p))
	}
	l.mu.Lock()
	if l.mu.failed == nil && !l.mu.closing && (l.mu.truncating || l.overLimitLocked(total)) {
		stop := func() bool { return false }
		if ctx.Done() != nil {
			stop = context.AfterFunc(ctx, func() { l.mu.Lock(); l.mu.cond.Broadcast(); l.mu.Unlock() })
		}
		for l.mu.failed == nil && !l.mu.closing && ctx.Err() == nil && (l.mu.truncating || l.overLimitLocked(total)) {
			l.mu.cond.Wait()
		}
		stop()
	}
	switch {
	case l.mu.failed != nil:
		err := l.mu.failed
		l.mu.Unlock()
		return 0, nil, err
	case l.mu.closing:
		l.mu.Unlock()
		return 0, nil, ErrClosed
	case ctx.Err() != nil:
		l.mu.Unlock()
		return 0, nil, ctx.Err()
	}
	first := l.mu.next
	wasIdle := l.mu.pendingCount == 0
	for _, p := range payloads {
		l.appendLocked(p, total)
		total -= frameSize(len(p))
	}
	if wasIdle {
		l.mu.firstPendingAt = l.clock.Now()
	}
	l.mu.appends += uint64(len(payloads))
	r := l.mu.round
	if done != nil {
		r.calls = append(r.calls, asyncCall{last: l.mu.next - 1, fn: done})
	}
	nudge := wasIdle || l.cfg.Policy.Kind == Count && l.mu.pendingCount >= l.cfg.Policy.Count
	l.mu.Unlock()
	if nudge {
		l.nudge()
	}
	return first, r, nil
}

// overLimitLocked: would total more bytes overflow the pending bound? A
// record larger than the bound is let in alone.
func (l *Log) overLimitLocked(total int) bool {
	return l.mu.pendingBytes > 0 && l.mu.pendingBytes+total > l.cfg.MaxPending
}

// appendLocked assigns the next index and encodes the frame into the
// pending chunk for its segment, starting a new segment when it does not
// fit. rest is the bytes of this frame and those after it in the batch:
// the chunk grows once for all that fit the segment, not by doubling.
func (l *Log) appendLocked(payload []byte, rest int) {
	n := int64(frameSize(len(payload)))
	segs := l.mu.segs
	if l.mu.off+n > l.cfg.SegmentSize && l.mu.off > 0 {
		l.mu.segs = append(segs, segment{first: l.mu.next, last: l.mu.next - 1})
		segs = l.mu.segs
		l.mu.off = 0
		l.mu.tail = l.mu.tail[:0]
	}
	seg := &segs[len(segs)-1]
	need := int(min(int64(rest), l.cfg.SegmentSize-l.mu.off))
	if k := len(l.mu.pending); k == 0 || l.mu.pending[k-1].seg != seg.first {
		var buf []byte
		if s := len(l.mu.spare); s > 0 {
			buf, l.mu.spare = l.mu.spare[s-1][:0], l.mu.spare[:s-1]
		}
		head := len(l.mu.tail)
		buf = append(growBlocks(buf, head+need), l.mu.tail...)
		l.mu.pending = append(l.mu.pending, chunk{seg: seg.first, off: l.mu.off - int64(head), head: head, data: buf})
	}
	c := &l.mu.pending[len(l.mu.pending)-1]
	c.data = growBlocks(c.data, need) // room already, for a chunk just started
	// What an fsync has covered is a fact about records before this one;
	// recovery holds a damaged record that a later frame vouches for as
	// corruption, not a tear (scanSegment).
	c.data = appendFrame(c.data, l.mu.next, min(l.mu.durable, l.mu.next-1), payload)
	seg.last = l.mu.next
	l.mu.off += n
	l.mu.next++
	l.mu.pendingBytes += int(n)
	l.mu.pendingCount++
}

// failFromOutside puts the log in the failed state from a goroutine other
// than the syncer, which then fails the pending round and stops.
func (l *Log) failFromOutside(err error) error {
	l.mu.Lock()
	ferr := l.setFailedLocked(err)
	l.mu.Unlock()
	l.nudge()
	return ferr
}

// setFailedLocked records err as the log's failure unless one is recorded
// already, wakes every waiter, and returns the failure recorded.
func (l *Log) setFailedLocked(err error) error {
	if l.mu.failed == nil {
		l.mu.failed = fmt.Errorf("%w: %w", ErrFailed, err)
	}
	l.mu.cond.Broadcast()
	return l.mu.failed
}

func (l *Log) nudge() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
	if l.sleeper != nil {
		l.sleeper.interrupt()
	}
}

// Sync makes every record appended so far durable, whatever the policy,
// and returns once it is (or the log failed).
func (l *Log) Sync(ctx context.Context) error {
	l.mu.Lock()
	if l.mu.failed != nil {
		err := l.mu.failed
		l.mu.Unlock()
		return err
	}
	if l.mu.closing {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.mu.pendingCount == 0 && l.mu.durable == l.mu.next-1 {
		l.mu.Unlock()
		return nil
	}
	done := make(chan error, 1)
	l.mu.forced = append(l.mu.forced, done)
	l.mu.Unlock()
	l.nudge()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ---- the syncer ----------------------------------------------------------

// With the real clock, waits shorter than preciseWait are slept precisely
// (sleeper.sleep), in chunks of at most pollChunk, looking for work between
// chunks; longer ones block on the channels with a timer that ends
// preciseWait early. With another clock every wait is a timer of that clock
// for the whole wait.
const (
	preciseWait = 1500 * time.Microsecond
	pollChunk   = 500 * time.Microsecond
)

func (l *Log) syncLoop() {
	defer close(l.done)
	if l.sleeper != nil {
		defer l.sleeper.close()
	}
	if l.sleeper != nil && (l.cfg.Policy.Kind == Group || l.cfg.Policy.Kind == Count) {
		lockSyncerThread() // their windows are short; Periodic's are not
	}
	timer := deadlineTimer{clock: l.clock}
	defer timer.disarm()
	expired := make(chan time.Time)
	close(expired)
	for {
		l.mu.Lock()
		if failed := l.mu.failed; failed != nil {
			l.mu.Unlock()
			l.fail(failed, newRound(), nil) // failed outside the syncer (failFromOutside)
			return
		}
		st := syncState{now: l.clock.Now(), pending: l.mu.pendingCount, firstPendingAt: l.mu.firstPendingAt,
			dirty: l.dirty, lastStart: l.lastStart, lastEnd: l.lastEnd, lastSync: l.lastSync, forced: len(l.mu.forced) > 0}
		l.mu.Unlock()
		a := decide(l.cfg.Policy, st)
		if a.write || a.sync {
			timer.disarm()
			if !l.round(a.sync) {
				return
			}
			continue
		}
		var tc <-chan time.Time
		switch {
		case a.wait <= 0:
			timer.disarm() // only a nudge or a request wakes the syncer
		case l.sleeper != nil && a.wait <= preciseWait:
			// Sleep precisely, until a nudge at the latest, then look for
			// requests and decide again.
			timer.disarm()
			l.sleeper.sleep(min(a.wait, pollChunk), l.wake)
			tc = expired
		case l.sleeper != nil:
			tc = timer.arm(st.now.Add(a.wait), preciseWait)
		default:
			tc = timer.arm(st.now.Add(a.wait), 0)
		}
		select {
		case <-l.wake:
		case <-tc:
			if tc != expired {
				timer.fired()
			}
		case req := <-l.truncReq:
			if !l.serveTruncate(req) {
				return
			}
		case <-l.stop:
			l.finalRound()
			return
		}
	}
}

func (l *Log) serveTruncate(req truncRequest) bool {
	err := l.truncate(req.index)
	req.done <- err
	return err == nil
}

// finalRound, at Close, writes and syncs whatever is left, under every policy.
func (l *Log) finalRound() { l.round(true) }

// maxSpare bounds the chunk buffers kept for reuse.
const maxSpare = 8

// maxSpareSize is the largest chunk buffer kept for reuse. A round of the
// engine's loggers writes what they handed over while the last round
// wrote: under a write-only load about 0.7 MiB on average but several MiB
// at times, as a direct write lasts as long as the device takes. A buffer
// dropped is a new one allocated, and the kernel zeroes each of its pages
// on first touch, which a smaller bound made cost more than twice the CPU.
// A round has a chunk per segment it writes to, so few buffers are ever
// kept.
const maxSpareSize = 16 << 20

// round writes the pending records and, if doSync, fdatasyncs. It returns
// false if the log failed.
func (l *Log) round(doSync bool) bool {
	l.mu.Lock()
	chunks, r := l.mu.pending, l.mu.round
	last := l.mu.next - 1
	// Sync callers are answered only by a round that fsyncs: one may have
	// registered after the syncer decided on a write-only round (Periodic).
	var forced []chan error
	if doSync {
		forced, l.mu.forced = l.mu.forced, nil
	}
	if n := len(chunks); n > 0 {
		// The last chunk is the last segment's: its final partial block
		// starts the next chunk.
		d := chunks[n-1].data
		l.mu.tail = append(l.mu.tail[:0], d[len(d)&^(blockSize-1):]...)
	}
	l.mu.pending, l.mu.pendingBytes, l.mu.pendingCount = nil, 0, 0
	l.mu.round = newRound()
	l.mu.cond.Broadcast() // room for blocked appenders
	l.mu.Unlock()

	l.lastStart = l.clock.Now()
	err := l.writeChunks(chunks)
	if err == nil && len(chunks) > 0 {
		l.dirty = true
		l.mu.Lock()
		l.mu.written = last
		for _, c := range chunks {
			if cap(c.data) <= maxSpareSize && len(l.mu.spare) < maxSpare {
				l.mu.spare = append(l.mu.spare, c.data)
			}
		}
		l.mu.Unlock()
	}
	if err == nil && doSync && l.dirty {
		err = l.active.SyncData()
		l.syncs.Add(1)
		if err == nil {
			l.dirty = false
			l.lastSync = l.clock.Now()
			l.mu.Lock()
			l.mu.durable = last
			l.mu.Unlock()
		}
	}
	l.lastEnd = l.clock.Now()
	if err != nil {
		l.fail(err, r, forced)
		return false
	}
	if !doSync && l.cfg.Policy.Kind != Periodic {
		// decide pairs every write with an fsync but under Periodic.
		panic("wal: invariant broken: a round without fsync under " + l.cfg.Policy.String())
	}
	r.finish(nil)
	for _, f := range forced {
		f <- nil
	}
	return true
}

// writeChunks writes frames to their segments. Before the first byte goes
// to a new segment, the previous one is fsynced (sealed) and the new one is
// installed, so after a crash every segment but the last is whole.
func (l *Log) writeChunks(chunks []chunk) error {
	for _, c := range chunks {
		if c.seg != l.activeSeg {
			if l.dirty {
				if err := l.active.SyncData(); err != nil {
					return err
				}
				l.syncs.Add(1)
				l.dirty = false
			}
			l.askPrepare()
			p := <-l.prep
			if p.err != nil {
				return p.err
			}
			if err := l.install(p.path, c.seg); err != nil {
				return err
			}
			f, err := l.openSegment(c.seg)
			if err != nil {
				return err
			}
			l.seal(l.active)
			l.active, l.activeSeg = f, c.seg
		}
		// Pad to the next block with the zeros the segment holds there.
		data := c.data
		end := min((c.off+int64(len(data))+blockSize-1)&^(blockSize-1), l.cfg.SegmentSize)
		data = append(data, zeros()[:end-c.off-int64(len(data))]...)
		if _, err := l.active.WriteAt(data, c.off); err != nil {
			return err
		}
		if c.off+int64(len(c.data)) > l.cfg.SegmentSize/2 {
			l.askPrepare()
		}
		l.dirty = true
		l.writes.Add(1)
		l.bytes.Add(uint64(len(c.data) - c.head))
	}
	return nil
}

// fail puts the log in its failed state: the round in flight, the round
// later appenders registered on, Sync callers and every later call get the
// error. Nothing is retried. Once failed is set no appender registers on
// a round, so next takes no callback after it is read here; r's callbacks
// run before next's, in append order.
func (l *Log) fail(err error, r *round, forced []chan error) {
	l.mu.Lock()
	ferr := l.setFailedLocked(err)
	next := l.mu.round
	forced = append(forced, l.mu.forced...)
	l.mu.forced = nil
	l.mu.Unlock()
	r.finish(ferr)
	next.finish(ferr)
	for _, f := range forced {
		f <- ferr
	}
}

// prepareLoop zero-fills the next segment when the syncer asks (the active
// one is half full), so rotation rarely waits for a preallocation and an
// idle or young log does not write a whole spare segment. It overwrites a
// kept segment file if TruncateFront left one, and creates a file if not.
func (l *Log) prepareLoop() {
	defer close(l.prepDone)
	for i := 0; ; {
		select {
		case <-l.prepNeed:
		case f := <-l.sealed:
			release(f)
			continue
		case <-l.prepStop:
			return
		}
		path, err := l.takeRecycled(), error(nil)
		if path != "" {
			err = overwriteZeros(l.fs, path, l.cfg.SegmentSize, l.direct)
			l.recycledN.Add(1)
		} else {
			path = l.path(fmt.Sprintf("prepared-%d%s", i, tmpSuffix))
			i++
			err = zeroFill(l.fs, path, l.cfg.SegmentSize, l.direct)
		}
		// The segment usually waits here for the next rotation, which
		// hands over the segment it seals meanwhile.
		for sent := false; !sent; {
			select {
			case l.prep <- prepared{path: path, err: err}:
				if err != nil {
					return
				}
				sent = true
			case f := <-l.sealed:
				release(f)
			case <-l.prepStop:
				_ = l.fs.Remove(path)
				return
			}
		}
	}
}

// maxSealed is how many sealed segments may wait for the preparer; the
// syncer releases one itself when that many do.
const maxSealed = 4

// seal hands the segment the syncer has just left, fully synced, to the
// preparer to release.
func (l *Log) seal(f vfs.File) {
	select {
	case l.sealed <- f:
	default:
		release(f)
	}
}

// release drops a sealed segment's pages from the page cache and closes
// it. The writer never reads a sealed segment (a Scan reads it from disk
// again), and a page left cached is one the kernel must find anew for the
// next segment. A page freed just before is cheap to reuse; fresh memory
// is not on a virtual machine, where a first touch of memory the guest
// has not used for a while costs about ten times a copy. The pages are
// clean, so dropping them changes nothing on disk.
func release(f vfs.File) {
	dropCache(f)
	f.Close()
}

// askPrepare asks the preparer for the next segment; asks coalesce.
func (l *Log) askPrepare() {
	select {
	case l.prepNeed <- struct{}{}:
	default:
	}
}

// Close writes and fsyncs every pending record (under every policy), stops
// the log's goroutines and closes its files. It returns the error that
// failed the log, if one did.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.truncMu.Lock() // let a truncation in progress finish
		defer l.truncMu.Unlock()
		l.mu.Lock()
		l.mu.closing = true
		l.mu.cond.Broadcast()
		l.mu.Unlock()
		close(l.stop)
		<-l.done
		close(l.prepStop)
		<-l.prepDone
		for len(l.sealed) > 0 {
			(<-l.sealed).Close()
		}
		l.closeFiles()
		l.mu.Lock()
		l.closeErr = l.mu.failed
		l.mu.Unlock()
	})
	return l.closeErr
}

// ---- reading ------------------------------------------------------------

// FirstIndex is the index of the oldest record kept. After TruncateFront it
// may be lower than asked: whole segments are removed, not parts.
func (l *Log) FirstIndex() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.segs[0].first
}

// LastIndex is the index of the last record appended (acknowledged or not);
// 0 when the log has none.
func (l *Log) LastIndex() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.next - 1
}

// DurableIndex is the last index covered by an fsync.
func (l *Log) DurableIndex() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.durable
}

// Stats returns counters since Open.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	appends := l.mu.appends
	l.mu.Unlock()
	return Stats{Appends: appends, Writes: l.writes.Load(), Syncs: l.syncs.Load(), Bytes: l.bytes.Load(),
		Recycled: l.recycledN.Load()}
}

// Scan calls fn for every record from index from on that has been written
// to the operating system, in order. payload is valid only during the call,
// and fn must not call TruncateFront.
func (l *Log) Scan(from uint64, fn func(index uint64, payload []byte) error) error {
	l.scanMu.RLock()
	defer l.scanMu.RUnlock()
	l.mu.Lock()
	segs := append([]segment(nil), l.mu.segs...)
	written := l.mu.written
	l.mu.Unlock()
	if from < segs[0].first {
		return fmt.Errorf("%w: %d is before the first index %d", ErrOutOfRange, from, segs[0].first)
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].first > from }) - 1
	for ; i < len(segs) && segs[i].first <= written; i++ {
		buf, err := readSegment(l.fs, l.path(segName(segs[i].first)))
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		_, err = walkFrames(buf, segName(segs[i].first), segs[i].first, min(segs[i].last, written),
			func(idx uint64, payload []byte, _ int) error {
				if idx < from {
					return nil
				}
				return fn(idx, payload)
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// Read returns a copy of the record at index.
func (l *Log) Read(index uint64) ([]byte, error) {
	var out []byte
	found := false
	stop := errors.New("stop")
	err := l.Scan(index, func(i uint64, p []byte) error {
		out, found = append([]byte(nil), p...), true
		return stop
	})
	if err != nil && err != stop {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: %d is not written", ErrOutOfRange, index)
	}
	return out, nil
}

// ---- truncation -----------------------------------------------------------

// TruncateFront removes the segments whose records all precede index (the
// last segment is always kept). It is for discarding a prefix covered by a
// checkpoint; FirstIndex tells what remains.
func (l *Log) TruncateFront(index uint64) error {
	l.truncMu.Lock()
	defer l.truncMu.Unlock()
	for {
		l.mu.Lock()
		switch {
		case l.mu.failed != nil:
			err := l.mu.failed
			l.mu.Unlock()
			return err
		case l.mu.closing:
			l.mu.Unlock()
			return ErrClosed
		case len(l.mu.segs) < 2 || l.mu.segs[1].first > index || l.mu.segs[1].first > l.mu.written:
			// Keep the segment before one whose file the syncer has not
			// installed yet: it may be the last one on disk.
			l.mu.Unlock()
			return nil
		}
		first := l.mu.segs[0].first
		l.mu.segs = l.mu.segs[1:]
		l.mu.Unlock()
		// Oldest first, each removal durable before the next, so a crash
		// never leaves a gap between segments. A failure is fatal: the
		// segment is gone from the list, and a later sync must not pass
		// for having made its removal durable.
		kept, err := l.removeSegment(first)
		if err != nil {
			return l.failFromOutside(err)
		}
		if err := l.dir.Sync(); err != nil {
			return l.failFromOutside(fmt.Errorf("sync directory: %w", err))
		}
		// Only a durable rename hands the file on: the preparer must not
		// overwrite what a crash could bring back under its segment name.
		if kept != "" {
			l.recycleMu.Lock()
			l.recycled = append(l.recycled, kept)
			l.recycleMu.Unlock()
		}
	}
}

// removeSegment removes the segment of first, or, while fewer than
// Config.RecycleSegments are kept, renames it to a temporary name for
// reuse and returns that path. Only a file of the segment size is kept:
// one from an Open with another SegmentSize would not be overwritten
// whole.
func (l *Log) removeSegment(first uint64) (kept string, err error) {
	path := l.path(segName(first))
	l.recycleMu.Lock()
	room := len(l.recycled) < l.cfg.RecycleSegments
	l.recycleMu.Unlock()
	if room {
		if st, err := l.fs.Stat(path); err == nil && st.Size() == l.cfg.SegmentSize {
			kept = l.path(fmt.Sprintf("recycled-%d%s", first, tmpSuffix))
			l.scanMu.Lock()
			err = l.fs.Rename(path, kept)
			l.scanMu.Unlock()
			if err != nil {
				return "", err
			}
			return kept, nil
		}
	}
	return "", l.fs.Remove(path)
}

// takeRecycled returns a kept segment file for the preparer, or "".
func (l *Log) takeRecycled() string {
	l.recycleMu.Lock()
	defer l.recycleMu.Unlock()
	n := len(l.recycled)
	if n == 0 {
		return ""
	}
	path := l.recycled[n-1]
	l.recycled = l.recycled[:n-1]
	return path
}

// TruncateAfter removes every record after index (Raft overwriting an
// uncommitted tail); the next append gets index+1. Appends wait while it
// runs. It is durable when it returns: a durable marker records the intent
// first, so a crash part way is finished at the next Open instead of being
// mistaken for corruption.
func (l *Log) TruncateAfter(ctx context.Context, index uint64) error {
	l.truncMu.Lock()
	defer l.truncMu.Unlock()
	l.mu.Lock()
	if l.mu.failed != nil || l.mu.closing {
		err := l.mu.failed
		if err == nil {
			err = ErrClosed
		}
		l.mu.Unlock()
		return err
	}
	if index+1 < l.mu.segs[0].first || index > l.mu.next-1 {
		err := fmt.Errorf("%w: cannot truncate after %d; the log holds %d..%d", ErrOutOfRange, index, l.mu.segs[0].first, l.mu.next-1)
		l.mu.Unlock()
		return err
	}
	l.mu.truncating = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.mu.truncating = false
		l.mu.cond.Broadcast()
		l.mu.Unlock()
	}()
	if err := l.Sync(ctx); err != nil {
		return err
	}
	req := truncRequest{index: index, done: make(chan error, 1)}
	select {
	case l.truncReq <- req:
	case <-l.done:
		// The syncer stopped: at Close, or on a failure, which the caller
		// must see rather than a plain close.
		l.mu.Lock()
		err := l.mu.failed
		l.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return err
	}
	return <-req.done
}

// truncate runs in the syncer, with nothing pending.
func (l *Log) truncate(index uint64) error {
	if err := l.writeTruncateMark(index); err != nil {
		l.fail(err, newRound(), nil)
		return err
	}
	if err := l.finishTruncate(index, true); err != nil {
		l.fail(err, newRound(), nil)
		return err
	}
	return nil
}

// finishTruncate cuts the log after index, given the marker is durable:
// removes later segments, zeroes the tail of the one holding index+1, and
// removes the marker. It is idempotent, so recovery can run it again.
// running says whether the syncer calls it (and the target must be left
// open as the active segment) or recovery does.
func (l *Log) finishTruncate(index uint64, running bool) error {
	l.mu.Lock()
	segs := l.mu.segs
	l.mu.Unlock()
	k := sort.Search(len(segs), func(i int) bool { return segs[i].first > index+1 }) - 1
	if k < 0 {
		k = 0
	}
	target := segs[k]
	// Remove later segments, including files recovery did not list.
	firsts, err := listSegments(l.fs, l.cfg.Dir, false)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	removed := false
	for _, first := range firsts {
		if first > target.first {
			if err := l.fs.Remove(l.path(segName(first))); err != nil {
				return fmt.Errorf("wal: %w", err)
			}
			removed = true
		}
	}
	// The removals must be durable before the marker's removal can be:
	// nothing orders two directory changes made between the same pair of
	// syncs, and a marker gone beside a later segment still present would
	// bring the truncated records back.
	if removed {
		if err := l.dir.Sync(); err != nil {
			return fmt.Errorf("wal: sync directory: %w", err)
		}
	}
	name := segName(target.first)
	buf, err := readSegment(l.fs, l.path(name))
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	off, err := walkFrames(buf, name, target.first, index, nil)
	if err != nil {
		return err
	}
	end := int64(len(buf))
	for end > int64(off) && buf[end-1] == 0 {
		end--
	}
	if l.active != nil && l.activeSeg != target.first {
		l.active.Close()
		l.active = nil
	}
	if err := l.zeroRange(name, int64(off), end); err != nil {
		return err
	}
	if err := l.fs.Remove(l.path(truncateName)); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := l.dir.Sync(); err != nil {
		return fmt.Errorf("wal: sync directory: %w", err)
	}
	if running && l.active == nil {
		if l.active, err = l.openSegment(target.first); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		l.activeSeg = target.first
	}
	l.mu.Lock()
	target.last = index
	l.mu.segs = append(segs[:k:k], target)
	l.mu.next = index + 1
	l.setTailLocked(buf, int64(off))
	if l.mu.written > index {
		l.mu.written = index
	}
	if l.mu.durable > index {
		l.mu.durable = index
	}
	l.mu.Unlock()
	l.dirty = false
	return nil
}

func (l *Log) writeTruncateMark(index uint64) error {
	var b [truncMarkSize]byte
	binary.LittleEndian.PutUint64(b[:8], index)
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli))
	return vfsutil.WriteFileAtomic(l.fs, l.cfg.Dir, truncateName, b[:], l.dir)
}

func (l *Log) readTruncateMark() (uint64, bool, error) {
	f, err := l.fs.Open(l.path(truncateName))
	if err != nil {
		if oserror.IsNotExist(err) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	var b [truncMarkSize]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return 0, false, &CorruptionError{Segment: truncateName, Reason: "short truncation marker"}
	}
	if crc32.Checksum(b[:8], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return 0, false, &CorruptionError{Segment: truncateName, Reason: "truncation marker checksum mismatch"}
	}
	return binary.LittleEndian.Uint64(b[:8]), true, nil
}
