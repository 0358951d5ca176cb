package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage"
)

// LogMode says whether commits are logged.
type LogMode uint8

const (
	// LogWAL logs every commit through the loggers' sinks (the default).
	LogWAL LogMode = iota
	// LogNone logs nothing: a commit counts as durable at once, and a
	// restart loses everything but the catalog. It writes no checkpoints
	// and loads none (a checkpoint is fuzzy: only the log makes it
	// consistent). For benchmarks.
	LogNone
)

// Config configures an engine. Zero fields take the defaults named.
type Config struct {
	// Dir holds the catalog, the checkpoints and (for the default sink)
	// each logger's write-ahead log. Required.
	Dir string
	// FS is the filesystem; nil means the operating system's.
	FS vfs.FS
	// Log is LogWAL or LogNone.
	Log LogMode
	// OpenSink opens the engine's log; nil opens a wal.Log with the batch
	// policy in Dir/log. A Raft-backed sink plugs in here.
	OpenSink func(fs vfs.FS, dir string) (LogSink, error)
	// LogSegmentSize is the segment size of the default sink's log, in
	// bytes. 0 means 64 MiB.
	LogSegmentSize int64
	// Loggers is the number of logger goroutines, each collecting the
	// buffers of its share of the workers and proposing them to the log.
	// 0 means 1.
	Loggers int
	// LogRoundsInFlight bounds the rounds one logger has proposed to the
	// log and not yet seen durable: with more than one, a logger collects
	// and proposes the next round while the log makes the last durable.
	// 0 means 1.
	LogRoundsInFlight int
	// Clock is the engine's time: the epoch ticker, checkpoint intervals,
	// the logger's hold (linger). nil means the real clock.
	Clock clockwork.Clock
	// Follow makes the engine a follower: it has no log of its own and
	// takes no writes (ErrNotLeader) and no catalog changes; its state is
	// what the leader's log records, handed to Apply in log order, make
	// it. Reads see what is durable. Its data lives in memory.
	Follow bool
	// Workers bounds the transactions committing at once; each worker has
	// its own log buffer. 0 means DefaultWorkers().
	Workers int
	// EpochInterval is how often the epoch advances. 0 means 40 ms.
	EpochInterval time.Duration
	// CommitDelay bounds how long a commit waiting for durability may be
	// held, while other commits are arriving and the processors are busy,
	// so that they share its log write and fsync (group commit; see
	// logger.linger). The delay is at most three times the recent
	// write-and-fsync time, and none for a lone committer (but once
	// right after a burst of others). 0 means 2 ms; negative turns the
	// delay off.
	CommitDelay time.Duration
	// LogBufferSize is the size, in bytes, at which a worker hands a log
	// buffer to its logger before the epoch ends. 0 means 512 KiB.
	LogBufferSize int
	// MaxLogPending bounds the bytes of buffers handed to one logger and not
	// yet durable; a committer that finds it exceeded waits after its
	// commit (backpressure). 0 means 64 MiB.
	MaxLogPending int
	// CheckpointInterval is the time between the end of one checkpoint and
	// the start of the next. 0 means 1 minute; negative disables periodic
	// checkpoints (Checkpoint can still be called).
	CheckpointInterval time.Duration
	// CheckpointLogSize bounds the log between periodic checkpoints: once
	// this many bytes were logged since the last checkpoint began
	// (counting, at Open, the whole log recovery read), the next one
	// starts without waiting for CheckpointInterval, and the log it
	// covers is truncated. It keeps both the disk the log takes and the
	// replay at Open bounded when the engine writes fast, or is opened
	// many times for less than CheckpointInterval each. 0 means 1 GiB;
	// negative leaves checkpoints to time alone. Without periodic
	// checkpoints it does nothing.
	CheckpointLogSize int64
	// CheckpointDeltaShare decides between full and delta checkpoints. A
	// delta holds only the records written since the checkpoint before it
	// began (deletes as tombstones), and recovery loads the last full
	// checkpoint and every delta after it. A checkpoint is a delta while
	// the deltas since the last full one add up to less than this share
	// of its bytes, and full otherwise, which bounds what recovery reads
	// to 1+share times a full checkpoint. A full checkpoint rewrites
	// every row; in a database that keeps every version (the ledger's
	// history), that grows with the history while the writes between two
	// checkpoints do not. 0 means 1; negative makes every checkpoint full.
	CheckpointDeltaShare float64
	// Limits are the storage size limits.
	Limits storage.Limits
	// Logf reports recovery and checkpoint events; nil discards them.
	Logf func(format string, args ...any)

	// hooks, set only by the package's tests, run at points a test needs
	// to stop at; nil means none. They belong to one engine.
	hooks *testHooks
}

// testHooks are functions an engine runs at points its tests stop at.
// Each is nil unless a test stored one.
type testHooks struct {
	// checkpointBegin runs in Checkpoint before it moves ckptBase.
	checkpointBegin atomic.Pointer[func()]
	// linger runs in logger.linger before it reads the committers waiting.
	linger atomic.Pointer[func()]
	// partitionCreated runs when a commit has just created a partition,
	// before it inserts its records.
	partitionCreated atomic.Pointer[func()]
}

func (c *Config) validate() error {
	if c.Dir == "" {
		return errors.New("engine: Config.Dir is empty")
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.Log != LogWAL && c.Log != LogNone {
		return fmt.Errorf("engine: unknown log mode %d", c.Log)
	}
	if c.LogSegmentSize == 0 {
		c.LogSegmentSize = 64 << 20
	}
	if c.Loggers == 0 {
		c.Loggers = 1
	}
	if c.LogRoundsInFlight == 0 {
		c.LogRoundsInFlight = 1
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers()
	}
	if c.EpochInterval == 0 {
		c.EpochInterval = 40 * time.Millisecond
	}
	if c.CommitDelay == 0 {
		c.CommitDelay = 2 * time.Millisecond
	}
	if c.LogBufferSize == 0 {
		c.LogBufferSize = 512 << 10
	}
	if c.MaxLogPending == 0 {
		c.MaxLogPending = 64 << 20
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = time.Minute
	}
	if c.CheckpointLogSize == 0 {
		c.CheckpointLogSize = 1 << 30
	}
	if c.CheckpointDeltaShare == 0 {
		c.CheckpointDeltaShare = 1
	}
	if c.CheckpointDeltaShare != c.CheckpointDeltaShare {
		return errors.New("engine: Config.CheckpointDeltaShare is NaN")
	}
	if c.OpenSink == nil {
		seg, recycle := c.LogSegmentSize, recycleSegments(c.CheckpointLogSize, c.LogSegmentSize)
		c.OpenSink = func(fs vfs.FS, dir string) (LogSink, error) { return openWALSink(fs, dir, seg, recycle) }
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.hooks == nil {
		c.hooks = new(testHooks)
	}
	switch {
	case c.Loggers < 1 || c.Loggers > maxLoggers:
		return fmt.Errorf("engine: Loggers %d outside 1..%d", c.Loggers, maxLoggers)
	case c.LogRoundsInFlight < 1 || c.LogRoundsInFlight > 64:
		return fmt.Errorf("engine: LogRoundsInFlight %d outside 1..64", c.LogRoundsInFlight)
	case c.Workers < c.Loggers || c.Workers > 4096:
		return fmt.Errorf("engine: Workers %d outside Loggers..4096", c.Workers)
	case c.EpochInterval < 100*time.Microsecond || c.EpochInterval > time.Minute:
		return fmt.Errorf("engine: EpochInterval %v outside 100µs..1m", c.EpochInterval)
	case c.LogBufferSize < 4<<10 || c.LogBufferSize > 64<<20:
		return fmt.Errorf("engine: LogBufferSize %d outside 4 KiB..64 MiB", c.LogBufferSize)
	case c.MaxLogPending < 2*c.LogBufferSize:
		return fmt.Errorf("engine: MaxLogPending %d below twice LogBufferSize", c.MaxLogPending)
	}
	lim, err := c.Limits.WithDefaults()
	if err != nil {
		return err
	}
	c.Limits = lim
	return nil
}

// ErrLocked is the cause Open reports when the data directory is open
// already, in this process or another: an engine's files have one owner at
// a time (see lockDir).
var ErrLocked = errors.New("engine: the data directory is in use")

// lockFile is the file in the data directory whose lock an open engine
// holds.
const lockFile = "LOCK"

// lockDir takes the data directory's lock: an advisory lock on Dir/LOCK
// (fcntl on Unix) that excludes other processes, and, within this process,
// another open engine on the same path (the filesystem's own registry; the
// operating system's filesystem gets the absolute path, so a relative name
// of the same directory is refused too). Two engines on one directory
// would each replay, log and truncate the same files.
func lockDir(fs vfs.FS, dir string) (io.Closer, error) {
	name := fs.PathJoin(dir, lockFile)
	if fs == vfs.Default {
		abs, err := filepath.Abs(name)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		name = abs
	}
	l, err := fs.Lock(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrLocked, dir, err)
	}
	return l, nil
}

// DefaultWorkers is Config.Workers when left 0: twice the processors Go
// uses, at least 4.
func DefaultWorkers() int { return max(4, 2*runtime.GOMAXPROCS(0)) }

// ErrFailed is the cause reported once the engine's log failed (an fsync
// error, say): commits can no longer become durable, so every waiting and
// later commit fails. Reopen the engine to recover from what is durable.
var ErrFailed = errors.New("engine: log failed")

// ErrNotLeader is the kind of the error a write or a catalog change gets
// on a follower (Config.Follow): they go to the leader, whose log it
// applies. It is storage.ErrNotLeader.
var ErrNotLeader = storage.ErrNotLeader

// DB is an open engine. It is safe for concurrent use.
type DB struct {
	cfg   Config
	fs    vfs.FS
	hooks *testHooks // cfg.hooks

	// core is the epoch bookkeeping (epochs.go), stepped under wmu. What
	// the hot paths read of it without a lock is published here after
	// every step: the global epoch E, the global durable epoch D, whether
	// a committer waiting on the open epoch asked the next idle logger to
	// close it early (want), how many asked in all (hurries), and the
	// highest epoch one asked to close (wantEpoch).
	core      epochCore
	epoch     atomic.Uint64
	durable   atomic.Uint64
	want      atomic.Bool
	hurries   atomic.Uint64
	wantEpoch atomic.Uint64
	// holdTarget is, while a logger holds a close (linger), the count of
	// waiting committers it waits for, else 0: committers poke a holding
	// logger only once the count is reached, not at every arrival.
	holdTarget atomic.Int64
	// waiting is the committers in WaitDurable that asked for a close and
	// whose epoch is not durable yet (the sum of the waiters' n); the
	// loggers' linger reads it.
	waiting atomic.Int64

	workers []*worker
	slots   chan *worker
	loggers []*logger

	cat catalog
	// recovery is what Open recovered and dropped; set before Open returns.
	recovery RecoveryStats
	clock    clockwork.Clock

	// sink is the log (nil with LogNone); maxRecord the largest record it
	// takes.
	sink      LogSink
	maxRecord int
	// spans are the durable proposals, for truncation (truncateBefore);
	// spanMax is the largest epoch any durable record counts as.
	spanMu  sync.Mutex
	spans   []logSpan
	spanMax uint64
	// logLast is the index of the last durable record proposed.
	logLast atomic.Uint64
	// following is set while the engine follows another's log (Config.Follow,
	// until Promote). follower is its state machine, guarded by followMu.
	following   atomic.Bool
	followMu    sync.Mutex
	follower    *stateMachine
	followApply *inlineApply

	// wmu guards core and waiters.
	wmu     sync.Mutex
	waiters map[uint64]*waitSet
	failErr atomic.Pointer[error]

	ckptMu      sync.Mutex  // one checkpoint at a time
	ckptRunning atomic.Bool // set while Checkpoint holds ckptMu
	// chain is the checkpoints recovery would load now: the last full one
	// and the deltas after it. Guarded by ckptMu (and set by recovery
	// before the checkpoint loop starts).
	chain ckptChain
	// logged counts the log bytes appended since Open, plus those recovery
	// read; ckptBase is its value when the last checkpoint began. A logger
	// that finds them CheckpointLogSize apart kicks the checkpoint loop.
	logged   atomic.Int64
	ckptBase atomic.Int64
	ckptKick chan struct{}

	// lock is the data directory's lock (lockDir), released by Close
	// once the logs are closed.
	lock io.Closer
	// shared holds the values Shared hands out.
	shared sync.Map

	closing  chan struct{}
	stopped  chan struct{} // closed once the loggers have exited
	closed   atomic.Bool
	wg       sync.WaitGroup
	stopOnce sync.Once
	closeErr error
}

// worker is a commit slot: its log buffer, its last TID, and the epoch it
// may commit into while committing (0 when not, logClaimed while its
// logger collects its log).
//
// It is padded to workerSize, a size class whose objects the allocator
// places on cache-line boundaries. Unpadded (40 bytes, in the 48-byte
// class) two workers shared a cache line, so two processors committing on
// two workers took the line from each other at every epoch publication,
// log update and buffer update; the pad took about a tenth off a
// write-only transaction's CPU.
type worker struct {
	workerState
	_ [workerSize - unsafe.Sizeof(workerState{})]byte
}

const workerSize = 128

type workerState struct {
	// active is the epoch the worker entered its commit in (enter), 0
	// between commits, or logClaimed while its logger holds its log state
	// (logger.collect). Whoever set it owns the log state below.
	active  atomic.Uint64
	lastTID uint64
	lg      *logger

	// The log state: the worker fills it while it commits, and its
	// logger's round takes what belongs to closed epochs while it has
	// claimed the worker between commits. Neither takes a lock: the mutex
	// every commit's entry took cost about 35 ns of the 2.3 µs of CPU a
	// ycsb-wo transaction takes with the log (see logger.collect).
	buf *logBuf
	// stage holds the newest log entries of epoch stageEp, encoded there
	// first and moved into buf in blocks (see worker.log).
	stage   []byte
	stageEp uint64
	// heldEp is the epoch of the entries in stage and buf, or 0 once a
	// logger has taken them all; it may be higher than that while they are
	// empty. The logger reads it without a claim.
	heldEp atomic.Uint64
}

// logClaimed is what a worker's active holds while its logger has claimed
// it: above every epoch, so that the epoch advancer, checkpoints and
// rounds, which wait on workers in older epochs, pass over it.
const logClaimed = ^uint64(0)

// Open opens or creates the engine in cfg.Dir, recovering what is durable.
func Open(cfg Config) (*DB, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db := &DB{cfg: cfg, fs: cfg.FS, hooks: cfg.hooks, clock: cfg.Clock, waiters: make(map[uint64]*waitSet), closing: make(chan struct{}), stopped: make(chan struct{}),
		ckptKick: make(chan struct{}, 1), maxRecord: 64 << 20}
	db.cat.init()
	if err := db.fs.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if err := vfsutil.SyncDir(db.fs, db.fs.PathDir(cfg.Dir)); err != nil {
		return nil, err
	}
	lock, err := lockDir(db.fs, cfg.Dir)
	if err != nil {
		return nil, err
	}
	db.lock = lock
	if err := db.checkLayout(); err != nil {
		db.lock.Close()
		return nil, err
	}
	for i := 0; i < cfg.Loggers; i++ {
		lg := &logger{db: db, id: i, wake: make(chan struct{}, 1), roundDone: make(chan struct{}, 1)}
		lg.runnable[0].Name = "/sched/goroutines/runnable:goroutines"
		lg.mu.drained = sync.NewCond(&lg.mu.Mutex)
		db.loggers = append(db.loggers, lg)
	}
	db.slots = make(chan *worker, cfg.Workers)
	for i := 0; i < cfg.Workers; i++ {
		w := &worker{workerState: workerState{lg: db.loggers[i%cfg.Loggers]}}
		w.lg.workers = append(w.lg.workers, w)
		db.workers = append(db.workers, w)
		db.slots <- w
	}
	if cfg.Follow {
		db.follow()
		return db, nil
	}
	if err := db.recover(); err != nil {
		db.closeSinks()
		db.lock.Close()
		return nil, err
	}
	db.start()
	return db, nil
}

// start starts a leader's goroutines: the epoch ticker, the loggers and
// the checkpoint loop.
func (db *DB) start() {
	db.wg.Add(1)
	go db.advanceLoop()
	if db.cfg.Log == LogWAL {
		for _, lg := range db.loggers {
			db.wg.Add(1)
			go lg.run()
		}
	}
	if db.cfg.CheckpointInterval > 0 && db.cfg.Log == LogWAL {
		db.wg.Add(1)
		go db.checkpointLoop()
	}
}

// Close stops the engine: it waits for the loggers to make everything
// committed durable, then closes the logs. Transactions must be finished.
func (db *DB) Close() error {
	db.stopOnce.Do(func() {
		db.closed.Store(true)
		close(db.closing)
		db.wg.Wait()
		close(db.stopped)
		db.closeErr = db.closeSinks()
		if err := db.failure(); err != nil && db.closeErr == nil {
			db.closeErr = err
		}
		if err := db.lock.Close(); err != nil && db.closeErr == nil {
			db.closeErr = fmt.Errorf("engine: releasing the directory lock: %w", err)
		}
	})
	return db.closeErr
}

func (db *DB) closeSinks() error {
	if db.sink == nil {
		return nil
	}
	return db.sink.Close()
}

// Epoch returns the current global epoch.
func (db *DB) Epoch() uint64 { return db.epoch.Load() }

// DurableEpoch returns the global durable epoch: every commit of this or
// an earlier epoch is durable.
func (db *DB) DurableEpoch() uint64 { return db.durable.Load() }

func (db *DB) failure() error {
	if p := db.failErr.Load(); p != nil {
		return *p
	}
	return nil
}

// fail puts the engine in the failed state and wakes every waiter.
func (db *DB) fail(err error) {
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	if !db.failErr.CompareAndSwap(nil, &err) {
		return
	}
	db.cfg.Logf("engine: failed: %v", err)
	db.wmu.Lock()
	for e, ws := range db.waiters {
		db.release(e, ws)
	}
	db.wmu.Unlock()
	db.wakeLoggers() // one lingering stops at once
	for _, lg := range db.loggers {
		lg.release(0) // committers throttled on a logger that no longer drains
	}
}

// ---- epochs ------------------------------------------------------------

// resetEpochs starts the epoch bookkeeping at E = e, D = d.
func (db *DB) resetEpochs(e, d uint64) {
	db.wmu.Lock()
	db.core.reset(e, d, len(db.loggers))
	db.publishLocked()
	db.wmu.Unlock()
}

// stepLocked steps the epoch core and publishes what it changed. Called
// with wmu held.
func (db *DB) stepLocked(m epochMsg) epochReady {
	r := db.core.step(m)
	db.publishLocked()
	if r.durable {
		d := db.core.d
		for e, ws := range db.waiters {
			if e <= d {
				db.release(e, ws)
			}
		}
	}
	return r
}

// publishLocked copies the core's state to the atomics read without wmu.
// It stores only what changed: every commit reads the epoch's cache line,
// and a store, even of the same value, takes the line from every other
// processor (storing all five at every request cost 64 waiting clients
// about a tenth of their throughput).
func (db *DB) publishLocked() {
	c := &db.core
	d := c.d
	if db.cfg.Log == LogNone {
		d = ^uint64(0) // every commit is durable at once
	}
	storeIfChanged(&db.epoch, c.e)
	storeIfChanged(&db.durable, d)
	storeIfChanged(&db.wantEpoch, c.wantE)
	storeIfChanged(&db.hurries, c.hurries)
	if db.want.Load() != c.want {
		db.want.Store(c.want)
	}
}

func storeIfChanged(a *atomic.Uint64, v uint64) {
	if a.Load() != v {
		a.Store(v)
	}
}

// tryAdvance asks the core to close the open epoch (ev is evTick, evDrain
// or evClose), telling it the lowest epoch a committing worker is in.
func (db *DB) tryAdvance(ev epochEvent) epochReady {
	seen := db.epoch.Load()
	low := uint64(0)
	for _, w := range db.workers {
		if a := w.active.Load(); a != 0 && (low == 0 || a < low) {
			low = a
		}
	}
	db.wmu.Lock()
	r := db.stepLocked(epochMsg{ev: ev, seen: seen, low: low})
	db.wmu.Unlock()
	return r
}

// advanceLoop advances the epoch every EpochInterval and wakes the loggers.
func (db *DB) advanceLoop() {
	defer db.wg.Done()
	t := db.clock.NewTicker(db.cfg.EpochInterval)
	defer t.Stop()
	for {
		select {
		case <-db.closing:
			return
		case <-t.Chan():
		}
		for spins := 0; ; spins++ {
			r := db.tryAdvance(evTick)
			if r.advanced {
				break
			}
			if r.exhausted {
				db.fail(errors.New("epoch space exhausted"))
				return
			}
			backoff(spins)
		}
		db.wakeLoggers()
	}
}

func (db *DB) wakeLoggers() {
	for _, lg := range db.loggers {
		lg.poke()
	}
}

// enter marks w as committing from the current epoch. It returns once the
// epoch it published is still current, so a worker enters at most one
// epoch behind. The first publication waits out a logger that claimed
// the worker's log state.
func (w *worker) enter(db *DB) {
	e := db.epoch.Load()
	for spins := 0; !w.active.CompareAndSwap(0, e); spins++ {
		backoff(spins)
		e = db.epoch.Load()
	}
	for {
		now := db.epoch.Load()
		if now == e {
			return
		}
		e = now
		w.active.Store(e)
	}
}

// ---- durability ------------------------------------------------------------

// markDurable records that logger's mark x is durable, raising D to the
// minimum of the loggers' marks and releasing the waiters it covers.
func (db *DB) markDurable(logger int, x uint64) {
	db.wmu.Lock()
	db.stepLocked(epochMsg{ev: evDurable, logger: logger, epoch: x})
	db.wmu.Unlock()
}

// raise sets a to v if v is larger, and reports whether it did.
func raise(a *atomic.Uint64, v uint64) bool {
	for {
		cur := a.Load()
		if v <= cur {
			return false
		}
		if a.CompareAndSwap(cur, v) {
			return true
		}
	}
}

// waitSet is the committers waiting for one epoch: ch is closed when it
// is durable (or the engine fails), and n of them asked for an early close.
type waitSet struct {
	ch chan struct{}
	n  int64
}

// release wakes the waiters of epoch e. Called with wmu held.
func (db *DB) release(e uint64, ws *waitSet) {
	db.waiting.Add(-ws.n) // before the waiters run: one may commit and wait again
	close(ws.ch)
	delete(db.waiters, e)
}

// WaitDurable returns once every commit of epoch e is durable. If ctx ends
// first it returns ErrCommitUnknown: the commit is installed and will most
// likely become durable, but this call cannot say so.
func (db *DB) WaitDurable(ctx context.Context, e uint64) error { return db.waitDurable(ctx, e, true) }

// WatchDurable is WaitDurable without asking the loggers to close the
// epoch early: it waits for the epoch to end on its own.
func (db *DB) WatchDurable(ctx context.Context, e uint64) error { return db.waitDurable(ctx, e, false) }

func (db *DB) waitDurable(ctx context.Context, e uint64, hurry bool) error {
	if db.durable.Load() >= e {
		return nil
	}
	db.wmu.Lock()
	if db.durable.Load() >= e {
		db.wmu.Unlock()
		return nil
	}
	if err := db.failure(); err != nil {
		db.wmu.Unlock()
		return commitUnknown(err)
	}
	ws := db.waiters[e]
	if ws == nil {
		ws = &waitSet{ch: make(chan struct{})}
		db.waiters[e] = ws
	}
	// If the epoch is still open, ask an idle logger to close it now
	// rather than at the next tick.
	asks := hurry && db.stepLocked(epochMsg{ev: evHurry, epoch: e}).asked
	var nw int64
	if asks {
		ws.n++
		nw = db.waiting.Add(1)
	}
	db.wmu.Unlock()
	if asks {
		if t := db.holdTarget.Load(); t == 0 || nw >= t {
			db.wakeLoggers()
		}
	}
	// Leaving before the epoch is durable: no longer counted as waiting.
	leave := func() {
		if !asks {
			return
		}
		db.wmu.Lock()
		if db.waiters[e] == ws {
			ws.n--
			db.waiting.Add(-1)
		}
		db.wmu.Unlock()
	}
	select {
	case <-ws.ch:
		if db.durable.Load() >= e {
			return nil
		}
		return commitUnknown(db.failure())
	case <-db.stopped:
		leave()
		if db.durable.Load() >= e {
			return nil
		}
		return commitUnknown(&storage.Error{Kind: storage.ErrClosed, Op: "commit", Detail: "closed while the commit was being logged"})
	case <-ctx.Done():
		leave()
		return commitUnknown(ctx.Err())
	}
}

func commitUnknown(cause error) error {
	return &storage.Error{Kind: storage.ErrCommitUnknown, Op: "commit", Detail: "committed in memory but not known to be durable", Cause: cause}
}

func backoff(spins int) {
	if spins < 64 {
		return
	}
	if spins < 1024 {
		runtime.Gosched()
		return
	}
	time.Sleep(50 * time.Microsecond)
}
