package engine

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jonboulle/clockwork"
)

// LogSink is the engine's log: an ordered sequence of records (records.go)
// that it makes durable. The write-ahead log implements it (openWALSink);
// a Raft group, whose "durable" means committed, fsynced by a majority,
// implements it for replication. Every logger, catalog change and
// checkpoint proposes to the one sink, so a replica that applies its
// records in order (DB.Apply) reaches the same state.
//
// Propose is safe for concurrent use; TruncateFront may run beside it;
// Replay runs before the first Propose.
type LogSink interface {
	// MaxRecordSize is the largest record Propose takes, in bytes.
	MaxRecordSize() int
	// Propose appends records after every record proposed before, in
	// order, and returns without waiting for them to be durable; it must
	// not retain records once it returns. done is called once all of them
	// are durable, with the index of the last, or with the error that
	// failed the sink. Calls of done are made in the order of the
	// proposals, from a goroutine of the sink's, and must not block. An
	// error, returned or given to done, is fatal: the engine stops
	// making commits durable and never retries. Indexes increase by one
	// per record.
	Propose(records [][]byte, done func(last uint64, err error)) error
	// Replay calls fn with every durable record from index from on (from
	// the first kept if from is below it), in order.
	Replay(from uint64, fn func(index uint64, record []byte) error) error
	// TruncateFront discards the records before index, which a checkpoint
	// covers. It may keep them longer.
	TruncateFront(index uint64) error
	// Recovered says what opening the sink cut from its log's tail: a
	// partial write of records never acknowledged. The zero value if
	// nothing was cut.
	Recovered() SinkRecovery
	Close() error
}

// SinkRecovery is what opening a LogSink cut from its tail.
type SinkRecovery struct {
	Bytes  int64  // how many bytes were dropped
	Detail string // where, and why they were taken for a torn write
}

// A buffer record holds one epoch's transactions of one worker:
//
//	buffer = 3 uvarint(epoch) txn*
//	txn    = tid(8 bytes LE) n(4 bytes LE) pwrite*n  (pwrite: see codec.go)
//
// Logs written before writes were packed hold buffers of kind 1, whose
// writes are plain (write in codec.go); recovery still reads them.

// entryHeader is the size of a txn's header in a buffer: its TID and
// write count.
const entryHeader = 12

type logBuf struct {
	epoch uint64
	data  []byte
}

// newBuf returns an empty buffer for epoch e, reusing the one the logger
// wrote last if there is one. The free list is a bounded stack: the buffer
// written last is the likeliest to be in cache still, and a worker filling
// a cold one stalls on a cache miss every few writes (a FIFO channel,
// which handed out the coldest, made write-only loads about 10% slower). A sync.Pool
// would not do: every collection empties it, and reallocating
// half-megabyte buffers feeds the collector.
func (lg *logger) newBuf(epoch uint64) *logBuf {
	size := lg.db.cfg.LogBufferSize
	var b *logBuf
	lg.freeMu.Lock()
	if n := len(lg.free); n > 0 {
		b = lg.free[n-1]
		lg.free[n-1] = nil
		lg.free = lg.free[:n-1]
	}
	lg.freeMu.Unlock()
	if b == nil {
		b = &logBuf{data: make([]byte, 0, size+size/4)}
	}
	b.epoch = epoch
	b.data = append(b.data[:0], recBuffer)
	b.data = binary.AppendUvarint(b.data, epoch)
	return b
}

// maxFree bounds a logger's free list.
const maxFree = 32

// putFree puts written buffers on the free list, the last on top. It drops
// a buffer that a large transaction grew past twice the usual size, and
// the oldest buffers past maxFree.
func (lg *logger) putFree(bufs []*logBuf) {
	lg.freeMu.Lock()
	defer lg.freeMu.Unlock()
	for _, b := range bufs {
		if cap(b.data) <= 2*lg.db.cfg.LogBufferSize {
			lg.free = append(lg.free, b)
		}
	}
	if over := len(lg.free) - maxFree; over > 0 {
		n := copy(lg.free, lg.free[over:])
		clear(lg.free[n:])
		lg.free = lg.free[:n]
	}
}

// stageSize is the most a worker's log stage holds before it moves to the
// worker's buffer (flushStage). A stage this size stays in the core's L1
// cache between transactions; the half-megabyte buffer it moves to does
// not, and a worker that encoded into the buffer directly stalled on a
// cache miss every few writes. A stage of a few KiB made write-only loads
// about 6% faster; 8 KiB did best of 2–64 KiB.
const stageSize = 8 << 10

// log appends a committed transaction's writes to the worker's log for
// epoch e. Entries are encoded into the worker's stage, which moves into
// the worker's buffer when it fills or the epoch changes; the buffer goes
// to the logger when it reaches LogBufferSize or the epoch changes. A
// transaction that fits in a stage is encoded in one pass into the room
// its bound (the sum of its writes' writeBound) reserves, after the stage
// moves on if it lacks that room. A larger one is split over several
// entries with the same TID; recovery applies all of an epoch or none of
// it, so the split does not matter. The worker calls it while it commits
// (enter), which makes the log state its own.
func (w *worker) log(writes []writeEntry, tid, e uint64, bound int) {
	limit := w.stageLimit()
	if w.stageEp != e {
		w.flushStage()
		if w.buf != nil {
			w.lg.handoff(w.buf)
			w.buf = nil
		}
		w.stageEp = e
	}
	if w.heldEp.Load() != e {
		// After the older entries went to the queue, before this one is
		// staged (see logger.collect).
		w.heldEp.Store(e)
	}
	if w.stage == nil {
		w.stage = newStage(limit)
	}
	if len(w.stage)+entryHeader+bound > limit {
		// Move the stage on first rather than split a transaction that
		// fits in one: a split copies the write that overflowed aside.
		w.flushStage()
	}
	if entryHeader+bound <= limit {
		// It fits: encode it in one pass into the room its bound reserves
		// (a stage's capacity is at least limit).
		n := len(w.stage)
		d := w.stage[n : n+entryHeader+bound]
		binary.LittleEndian.PutUint64(d, tid)
		binary.LittleEndian.PutUint32(d[8:], uint32(len(writes)))
		k, prevTable, prevPK := entryHeader, noTable, ""
		for i := range writes {
			wr := &writes[i]
			k += putPackedWrite(d[k:], wr.t.id, wr.pk, wr.ck, wr.out, prevTable, prevPK)
			prevTable, prevPK = wr.t.id, wr.pk
		}
		w.stage = w.stage[:n+k]
	} else {
		w.logSplit(writes, tid, limit)
	}
	if len(w.stage) >= limit {
		w.flushStage()
	}
}

// logSplit encodes a transaction larger than a stage in entries of at most
// limit bytes (one write, if a single write is larger), each moved on as
// it fills. Called by the log state's owner.
func (w *worker) logSplit(writes []writeEntry, tid uint64, limit int) {
	var hdr, count int
	var prev *writeEntry // the entry's last write
	start := func() {
		hdr, count = len(w.stage), 0
		w.stage = binary.LittleEndian.AppendUint64(w.stage, tid)
		w.stage = binary.LittleEndian.AppendUint32(w.stage, 0)
	}
	finish := func() { binary.LittleEndian.PutUint32(w.stage[hdr+8:], uint32(count)) }
	start()
	for i := range writes {
		wr := &writes[i]
		before := len(w.stage)
		w.stage = appendPackedWrite(w.stage, wr, prev)
		if len(w.stage) > limit && before > entryHeader {
			// Move what is staged on and start over with this write,
			// encoded again as the first of a new entry.
			w.stage = w.stage[:before]
			if count > 0 {
				finish()
			} else {
				w.stage = w.stage[:hdr]
			}
			w.flushStage()
			start()
			w.stage = appendPackedWrite(w.stage, wr, nil)
		}
		prev = wr
		count++
	}
	finish()
}

// appendPackedWrite appends wr packed after prev (nil for an entry's first
// write).
func appendPackedWrite(b []byte, wr, prev *writeEntry) []byte {
	bound := writeBound(wr.pk, wr.ck, wr.out)
	if cap(b)-len(b) < bound {
		b = slices.Grow(b, bound)
	}
	prevTable, prevPK := noTable, ""
	if prev != nil {
		prevTable, prevPK = prev.t.id, prev.pk
	}
	n := len(b)
	return b[:n+putPackedWrite(b[n:n+bound], wr.t.id, wr.pk, wr.ck, wr.out, prevTable, prevPK)]
}

// stageLimit is the size at which the stage moves on: at most stageSize
// and LogBufferSize, and small enough that a stage holding entries no
// larger than it (or one entry of one write, which commit bounds by the
// sink's record size less 64) fits one record with its buffer header.
func (w *worker) stageLimit() int {
	return min(stageSize, w.lg.db.cfg.LogBufferSize, w.lg.db.maxRecord-64)
}

// newStage returns an empty stage for a stage limit of limit, with room
// for an entry that passes it by a write.
func newStage(limit int) []byte { return make([]byte, 0, limit+limit/4) }

// flushStage moves the staged entries to the worker's buffer, starting a
// buffer if there is none or the stage would take it past a record, and
// hands the buffer on once it reaches LogBufferSize. Called by the log
// state's owner (see workerState).
func (w *worker) flushStage() {
	if len(w.stage) == 0 {
		return
	}
	if w.buf != nil && len(w.buf.data)+len(w.stage) > w.lg.db.maxRecord {
		w.lg.handoff(w.buf)
		w.buf = nil
	}
	if w.buf == nil {
		w.buf = w.lg.newBuf(w.stageEp)
	}
	w.buf.data = append(w.buf.data, w.stage...)
	if limit := w.stageLimit(); cap(w.stage) > 2*limit {
		// A large transaction grew it: do not keep the room. A stage's
		// capacity never falls below limit (log's one-pass path relies on
		// it), even when this runs part way through a split.
		w.stage = newStage(limit)
	} else {
		w.stage = w.stage[:0]
	}
	if len(w.buf.data) >= w.lg.db.cfg.LogBufferSize {
		w.lg.handoff(w.buf)
		w.buf = nil
	}
}

// logger writes its workers' buffers to its sink and publishes its durable
// epoch after each durable append.
type logger struct {
	db      *DB
	id      int
	workers []*worker
	wake    chan struct{}
	freeMu  sync.Mutex
	free    []*logBuf // written buffers for reuse, a stack (newBuf)
	// hurriesSeen is DB.hurries when run last looked, lingerTimer
	// linger's timer; run's goroutine alone uses them. peakWaiting is the
	// recent most committers waiting at once (see linger; atomic for
	// tests, as is lingers, the holds started).
	hurriesSeen uint64
	lingerTimer clockwork.Timer
	// cpu tells linger whether goroutines wait for a processor; nil
	// reads the scheduler's count of runnable goroutines (runnable).
	cpuProbe    func() cpuState
	runnable    [1]metrics.Sample
	peakWaiting atomic.Int64
	lingers     atomic.Int64
	// roundNs is a moving average of a round's append (write and fsync)
	// in nanoseconds.
	roundNs atomic.Int64

	// pending is the bytes queued or being written. Committers read it
	// without a lock; a throttled one waits on mu.drained, which release
	// broadcasts under mu after lowering it.
	pending atomic.Int64
	mu      struct {
		sync.Mutex
		queue   []*logBuf
		drained *sync.Cond
	}
	// proposed is the X of the last mark proposed, which the next round's
	// may not go below (rounds are run's goroutine's; atomic for tests
	// that run one themselves). inflight counts the
	// rounds proposed and not yet durable, at most
	// Config.LogRoundsInFlight; a round's done signals roundDone.
	proposed  atomic.Uint64
	inflight  atomic.Int64
	roundDone chan struct{}
}

func (lg *logger) poke() {
	select {
	case lg.wake <- struct{}{}:
	default:
	}
}

// handoff queues b for the next round. b belongs to the logger from the
// moment it is queued: a round may write it and hand it to another
// worker's newBuf, so its size is read before.
func (lg *logger) handoff(b *logBuf) {
	n := int64(len(b.data))
	lg.mu.Lock()
	p := lg.pending.Add(n) // before the round that takes it can release it
	lg.mu.queue = append(lg.mu.queue, b)
	lg.mu.Unlock()
	if batch := lg.writeBatch(); p >= batch && p-n < batch {
		lg.poke()
	}
}

// writeBatch is the backlog at which a logger writes the buffers of an
// epoch still open; buffers of a closed epoch are written at once. A round
// costs a log write and an fdatasync, each a notification of the virtual
// disk and an interrupt, and the goroutine switches around them: a round
// per handed-off buffer (512 KiB) made hundreds a second under a
// write-only load, and batching eight cut the logging cost by about a
// sixth. The epoch's close still ends every batch, so the durable epoch
// advances as before.
func (lg *logger) writeBatch() int64 {
	return min(8*int64(lg.db.cfg.LogBufferSize), int64(lg.db.cfg.MaxLogPending)/2)
}

// throttle makes a committer wait, after its commit, while its logger has
// more than MaxLogPending bytes to write.
func (lg *logger) throttle() {
	limit := int64(lg.db.cfg.MaxLogPending)
	if lg.pending.Load() <= limit {
		return
	}
	lg.mu.Lock()
	for lg.pending.Load() > limit && lg.db.failure() == nil && !lg.db.closed.Load() {
		lg.poke()
		lg.mu.drained.Wait()
	}
	lg.mu.Unlock()
}

func (lg *logger) release(n int) {
	lg.pending.Add(-int64(n))
	lg.mu.Lock()
	lg.mu.drained.Broadcast()
	lg.mu.Unlock()
}

func (lg *logger) run() {
	defer lg.db.wg.Done()
	defer lg.release(0) // wake committers throttled on this logger: they see the close
	for {
		select {
		case <-lg.wake:
		case <-lg.db.closing:
			// Every commit is in some buffer: close the epoch, then flush
			// every buffer of the epochs before it.
			for spins := 0; ; spins++ {
				if r := lg.db.tryAdvance(evDrain); !r.held {
					break
				}
				backoff(spins)
			}
			for lg.db.failure() == nil && lg.round(true) {
			}
			lg.waitRounds(0)
			return
		}
		for lg.db.failure() == nil {
			// A close another logger holds back is that logger's to make.
			if !lg.db.want.Load() || lg.linger() {
				lg.close()
			}
			if !lg.round(false) {
				break
			}
		}
	}
}

// close closes the epoch if a committer asked for it, and wakes the other
// loggers to write their buffers of it: one that went idle before the
// close would otherwise hold the durable epoch back until the next tick.
func (lg *logger) close() {
	db := lg.db
	if !db.want.Load() || !db.tryAdvance(evClose).advanced {
		return // not asked for; or a committer still entering pokes again
	}
	for _, o := range db.loggers {
		if o != lg {
			o.poke()
		}
	}
}

// linger holds back an early close of the epoch while more committers
// are likely to join it, so that one log write and fsync covers them all.
// An fdatasync costs tens of µs of kernel CPU on a virtual disk, and
// closing at each request made a ledger under 64 clients on two cores
// write one per two commits, its Validator one per two log writes.
//
// It first yields once if two or more committers asked for a close during
// the last round (some are likely runnable now). Then it holds the close
// only if all of these hold:
//
//   - at most half as many committers wait now as the recent peak (the
//     most waiting at once; it decays by at least one each time the logger
//     weighs a hold, and falls to the count reached whenever a hold times
//     out, so a peak that no longer gathers stops holding): the hold can
//     at least double the batch;
//   - goroutines are waiting for a processor: the CPU is what an fsync
//     costs, and with a processor idle holding would only add latency
//     (64 clients committing tiny transactions lost a tenth of their
//     throughput to holds before this check);
//   - the epoch a committer asked to close is still open, and the logger
//     has no backlog to write anyway.
//
// It holds until as many wait as the peak (no more are likely: a closed
// loop of N clients never has more than N waiting) or the bound passes:
// three times the recent round time (write and fsync), at most
// Config.CommitDelay. A lone committer is not held, except once after a
// burst of others, for the bound. One logger holds at a time: linger
// returns false, holding nothing, while another logger holds the close.
func (lg *logger) linger() bool {
	db := lg.db
	h := db.hurries.Load()
	if yieldBeforeLinger(h - lg.hurriesSeen) {
		runtime.Gosched()
	}
	lg.hurriesSeen = h
	if f := db.hooks.linger.Load(); f != nil {
		(*f)()
	}
	in := lingerIn{delay: db.cfg.CommitDelay, waiting: db.waiting.Load(), peak: lg.peakWaiting.Load(),
		e: db.epoch.Load(), wantE: db.wantEpoch.Load(), pending: lg.pending.Load(),
		bufSize: int64(db.cfg.LogBufferSize), roundNs: lg.roundNs.Load()}
	d := decideLinger(in)
	if d.askCPU {
		in.cpu = lg.cpu()
		d = decideLinger(in)
	}
	lg.peakWaiting.Store(d.peak)
	if !d.hold {
		return true
	}
	peak, bound := d.target, d.bound
	// A committer whose arrival reaches the target pokes (see waitDurable:
	// it adds itself before it reads the target, and this stores the
	// target before it reads the count, so one of the two sees the other).
	if !db.holdTarget.CompareAndSwap(0, peak) {
		return false // another logger holds the close
	}
	defer db.holdTarget.Store(0)
	lg.lingers.Add(1)
	if lg.lingerTimer == nil {
		lg.lingerTimer = db.clock.NewTimer(bound)
	} else {
		lg.lingerTimer.Reset(bound)
	}
	defer lg.lingerTimer.Stop()
	for db.waiting.Load() < peak && db.failure() == nil && lg.pending.Load() < int64(db.cfg.LogBufferSize) {
		select {
		case <-lg.wake: // the target was reached, a buffer filled up, or the engine failed
		case <-lg.lingerTimer.Chan():
			lg.peakWaiting.Store(db.waiting.Load())
			return true
		case <-db.closing:
			return true
		}
	}
	return true
}

// cpu reports whether goroutines wait for a processor: when one is idle,
// an fsync now costs idle time, and holding would only add latency. It
// is the one input of linger's decision that comes from outside the
// engine; a simulation sets cpuProbe.
func (lg *logger) cpu() cpuState {
	if lg.cpuProbe != nil {
		return lg.cpuProbe()
	}
	metrics.Read(lg.runnable[:])
	if lg.runnable[0].Value.Kind() == metrics.KindUint64 && lg.runnable[0].Value.Uint64() == 0 {
		return cpuIdle
	}
	return cpuBusy
}

// round writes what its workers handed off plus their buffers of closed
// epochs, then a mark, and publishes the logger's durable epoch. It
// reports whether it wrote anything. Unless all, a round while every
// closed epoch is durable writes only a backlog of writeBatch bytes. (A
// round that finds a closed epoch not yet durable, a worker still
// committing into it, writes what it has and the logger rounds again: no
// committer of a closed epoch wakes it.)
//
// The mark's X is min(E, epochs of committing workers) − 1, with E and the
// workers' epochs read before the buffers are collected. A worker that
// commits into an epoch ≤ X entered before those reads, so either it is
// still committing (and holds X below its epoch) or its writes are in a
// buffer that the collection finds. Buffers of epochs < E left in workers
// are collected too, so an idle worker never holds D back.
func (lg *logger) round(all bool) bool {
	db := lg.db
	// Rounds in flight are bounded: a round waits for an earlier one to be
	// durable before it proposes.
	lg.waitRounds(int64(db.cfg.LogRoundsInFlight) - 1)
	if db.failure() != nil {
		return false
	}
	eNow := db.epoch.Load()
	if roundIdle(all, lg.proposed.Load(), eNow, lg.pending.Load(), lg.writeBatch()) {
		// Every closed epoch is marked: only the open one's buffers wait.
		return false
	}
	low := eNow
	for _, w := range lg.workers {
		if a := w.active.Load(); a != 0 && a < low {
			low = a
		}
	}
	// A worker caught in enter between publishing an older epoch and
	// rechecking it can hold low below an X this logger already marked
	// (markFor keeps the last).
	x := markFor(eNow, low, lg.proposed.Load())
	// Walk the workers before taking the queue: a buffer of an epoch
	// before eNow is then either collected from its worker, or was handed
	// off before the walk passed the worker and so is in the queue taken
	// after.
	var bufs []*logBuf
	for _, w := range lg.workers {
		bufs = lg.collect(w, eNow, bufs)
	}
	lg.mu.Lock()
	bufs = append(bufs, lg.mu.queue...)
	lg.mu.queue = nil
	lg.mu.Unlock()
	if len(bufs) == 0 && x <= lg.proposed.Load() {
		return false
	}
	recs := make([][]byte, 0, len(bufs)+1)
	size, maxEp := 0, x+1
	for _, b := range bufs {
		recs = append(recs, b.data)
		size += len(b.data)
		maxEp = max(maxEp, b.epoch)
	}
	recs = append(recs, markRecord(lg.id, x))
	start := db.clock.Now()
	lg.inflight.Add(1)
	err := db.propose(recs, maxEp, func(_ uint64, err error) {
		avg := lg.roundNs.Load()
		lg.roundNs.Store(avg + (int64(db.clock.Since(start))-avg)/8)
		if err != nil {
			db.fail(fmt.Errorf("logger %d: %w", lg.id, err))
		} else {
			db.noteLogged(int64(size))
			db.markDurable(lg.id, x)
		}
		lg.release(size)
		lg.inflight.Add(-1)
		select {
		case lg.roundDone <- struct{}{}:
		default:
		}
	})
	// The sink keeps nothing of the records once Propose returns.
	lg.putFree(bufs)
	if err != nil {
		db.fail(fmt.Errorf("logger %d: %w", lg.id, err))
		lg.release(size)
		lg.inflight.Add(-1)
		return false
	}
	lg.proposed.Store(x)
	return true
}

// waitRounds waits until at most n of the logger's rounds are in flight,
// or the engine fails.
func (lg *logger) waitRounds(n int64) {
	for lg.inflight.Load() > max(n, 0) && lg.db.failure() == nil {
		<-lg.roundDone
	}
}

// collect appends w's buffers of epochs before eNow to bufs, its staged
// entries of such an epoch moved into a buffer first. It claims the
// worker's log state between two of its commits (active from 0 to
// logClaimed, which enter waits out). While the worker commits, it waits
// only if the worker holds entries of an epoch before eNow (heldEp); the
// commit then either hands them off itself, if it logs, or leaves them
// for the claim once it ends. heldEp is raised only after the older
// entries are in the queue, so a worker passed over for a heldEp of eNow
// or more has them there. The wait is a commit's length at most: a
// commit never waits on its logger (a throttled committer waits after
// its commit).
func (lg *logger) collect(w *worker, eNow uint64, bufs []*logBuf) []*logBuf {
	for spins := 0; !w.active.CompareAndSwap(0, logClaimed); spins++ {
		if h := w.heldEp.Load(); h == 0 || h >= eNow {
			return bufs
		}
		backoff(spins)
	}
	if w.stageEp < eNow {
		w.flushStage()
	}
	if b := w.buf; b != nil && b.epoch < eNow {
		bufs = append(bufs, b)
		lg.pending.Add(int64(len(b.data)))
		w.buf = nil
	}
	if len(w.stage) == 0 && w.buf == nil {
		w.heldEp.Store(0)
	}
	w.active.Store(0)
	return bufs
}
