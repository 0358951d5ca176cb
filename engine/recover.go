package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
)

// Recovery (SiloR), on Open:
//
//  1. Load the catalog. A data directory that holds anything but its lock
//     and no catalog lost it, and is refused.
//  2. Load the newest complete full checkpoint and the deltas after it,
//     if any (checkpoint.go): Cs is the newest file's start, Ce the
//     latest end. The logs were last truncated for a checkpoint that
//     started at the catalog's log floor F, so records of epochs before F
//     may be gone: Cs < F means a checkpoint file is missing, and the
//     engine refuses (ErrLogGap) rather than serve the gap.
//  3. Find each logger's last mark X_l, the durable epoch it had
//     published, by reading back from the end of its log. The recovered durable epoch is
//     D = min over loggers of X_l (a logger without marks counts as Ce): no
//     commit of a later epoch was ever acknowledged, and some may be only
//     partly logged.
//  4. Replay every logger's log in parallel, applying buffers whose epoch e
//     has Cs ≤ e ≤ D and is not void; per key the highest TID wins, so the
//     order of application does not matter.
//  5. Epochs above D that appear in the logs (maxSeen) are recorded as void
//     in the catalog before anything new is logged, and the epoch restarts
//     above them: those records stay in the log files but are never
//     applied, even once later epochs pass them.
//
// What recovery dropped — torn tails the sinks cut, records of void epochs
// — is in DB.Recovery and reported through Config.Logf.
func (db *DB) recover() error {
	found, err := db.loadCatalog()
	if err != nil {
		return err
	}
	if !found {
		if err := db.checkFresh(); err != nil {
			return err
		}
	}
	db.cat.mu.Lock()
	switch had := db.cat.mu.loggers; {
	case had == 0:
		db.cat.mu.loggers = db.cfg.Loggers
		err := db.saveCatalogLocked()
		db.cat.mu.Unlock()
		if err != nil {
			return err
		}
	case had != db.cfg.Loggers:
		db.cat.mu.Unlock()
		return fmt.Errorf("%w: the data was written with %d loggers, Config.Loggers is %d", ErrLoggers, had, db.cfg.Loggers)
	default:
		db.cat.mu.Unlock()
	}
	if db.cfg.Log == LogNone {
		db.epoch.Store(db.maxVoid() + 1)
		return nil
	}
	chain, err := db.findChain()
	if err != nil {
		return err
	}
	cs, ce, err := db.loadChain(chain)
	if err != nil {
		return err
	}
	db.cat.mu.RLock()
	floor := db.cat.mu.logFloor
	db.cat.mu.RUnlock()
	if cs < floor {
		newest := "none"
		if len(chain) > 0 {
			newest = chain[len(chain)-1].name()
		}
		return fmt.Errorf("%w: the logs were truncated for a checkpoint that started at epoch %d, but the newest checkpoint here (%s) starts at epoch %d: the records of epochs %d..%d are in a checkpoint file that is missing",
			ErrLogGap, floor, newest, cs, cs, floor-1)
	}
	db.recovery.Checkpoints = len(chain)
	type logInfo struct {
		mark, maxSeen, last uint64
		marked              bool
		counts              replayCounts
	}
	infos := make([]logInfo, len(db.loggers))
	for i, lg := range db.loggers {
		s, err := db.cfg.OpenSink(db.fs, db.cfg.Dir, i)
		if err != nil {
			return fmt.Errorf("engine: opening log %d: %w", i, err)
		}
		lg.sink = s
		lg.maxRecord = s.MaxRecordSize()
		if lg.maxRecord < 4<<10 {
			return fmt.Errorf("engine: log %d takes records of at most %d bytes", i, lg.maxRecord)
		}
		if torn := s.Recovered(); torn.Bytes > 0 {
			db.recovery.TornTails = append(db.recovery.TornTails, TornTail{Log: i, Bytes: torn.Bytes, Detail: torn.Detail})
			db.cfg.Logf("engine: log %d: dropped a torn tail of %d bytes, never acknowledged: %s", i, torn.Bytes, torn.Detail)
		}
		if infos[i].mark, infos[i].marked, err = lastMark(s); err != nil {
			return fmt.Errorf("engine: log %d: %w", i, err)
		}
	}
	d := ^uint64(0)
	for i, info := range infos {
		m := info.mark
		if !info.marked {
			m = ce
		}
		if m < ce {
			return fmt.Errorf("engine: log %d is durable only to epoch %d, before the checkpoint's end %d: log files are missing", i, m, ce)
		}
		d = min(d, m)
	}
	void := db.cat.voidRanges()
	var wg sync.WaitGroup
	errs := make([]error, len(db.loggers))
	for i, lg := range db.loggers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info := &infos[i]
			info.last, info.maxSeen, errs[i] = db.replay(i, lg.sink, cs, d, void, &info.counts)
		}()
	}
	wg.Wait()
	maxSeen := max(ce, db.maxVoid())
	for i, err := range errs {
		if err != nil {
			return err
		}
		maxSeen = max(maxSeen, infos[i].maxSeen)
		db.recovery.Records += infos[i].counts.applied
		db.recovery.VoidRecords += infos[i].counts.void
		db.recovery.VoidBytes += infos[i].counts.voidBytes
	}
	if maxSeen > d {
		db.cat.mu.Lock()
		db.cat.mu.void = append(db.cat.mu.void, epochRange{d + 1, maxSeen})
		err := db.saveCatalogLocked()
		db.cat.mu.Unlock()
		if err != nil {
			return fmt.Errorf("engine: recording void epochs: %w", err)
		}
		db.recovery.VoidFrom, db.recovery.VoidTo = d+1, maxSeen
		if db.recovery.VoidRecords > 0 {
			db.cfg.Logf("engine: epochs %d..%d were not durable, never acknowledged; their %d log records (%d bytes) are void",
				d+1, maxSeen, db.recovery.VoidRecords, db.recovery.VoidBytes)
		}
	}
	for i, lg := range db.loggers {
		lg.durable.Store(d)
		lg.maxEp = maxSeen
		if infos[i].last > 0 {
			lg.spans = []logSpan{{last: infos[i].last, maxEpoch: maxSeen}}
		}
	}
	db.durable.Store(d)
	db.epoch.Store(maxSeen + 1)
	return nil
}

// ErrLogGap is the cause Open reports when the logs do not reach back to
// where the checkpoints end: a checkpoint file the logs were truncated for
// is missing, and opening would serve the state without the records in it.
var ErrLogGap = errors.New("engine: the log does not reach the checkpoints")

// RecoveryStats say what Open recovered and what it dropped.
type RecoveryStats struct {
	// Checkpoints is how many checkpoint files were loaded.
	Checkpoints int
	// Records is how many log records (buffers) were applied.
	Records int64
	// VoidFrom..VoidTo is the range of epochs found in the logs past the
	// durable epoch, made void at this Open: their commits were never
	// acknowledged. 0..0 if there were none. (A clean stop leaves such a
	// range too, without records: the last marks name epochs beyond what
	// any buffer holds.)
	VoidFrom, VoidTo uint64
	// VoidRecords and VoidBytes count the log records of Void, skipped.
	VoidRecords, VoidBytes int64
	// TornTails are the partial writes the logs cut from their tails.
	TornTails []TornTail
}

// Dropped reports whether recovery dropped anything.
func (r RecoveryStats) Dropped() bool { return r.VoidRecords > 0 || len(r.TornTails) > 0 }

// TornTail is a partial write a log cut from its tail at Open: records
// being written when the process or machine stopped, never acknowledged.
type TornTail struct {
	Log    int
	Bytes  int64
	Detail string
}

// Recovery returns what Open recovered and dropped.
func (db *DB) Recovery() RecoveryStats { return db.recovery }

// checkFresh refuses a data directory without a catalog that holds
// anything but its lock and temporary files: the catalog is the first file
// an engine writes, so data without one means it was lost.
func (db *DB) checkFresh() error {
	names, err := db.fs.List(db.cfg.Dir)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	for _, n := range names {
		if n != lockFile && !strings.HasSuffix(n, ".tmp") {
			return &CorruptionError{File: catalogName, Offset: -1, Err: fmt.Errorf("missing, but the data directory holds %s: it is not new, and without its catalog the data cannot be read", n)}
		}
	}
	return nil
}

func (db *DB) maxVoid() uint64 {
	var m uint64
	for _, r := range db.cat.voidRanges() {
		m = max(m, r.To)
	}
	return m
}

// ErrLoggers is returned by Open when Config.Loggers differs from the
// number of logs the data directory was written with.
var ErrLoggers = errors.New("engine: logger count mismatch")

// recordHeader decodes a log record's kind and epoch (a buffer's epoch or
// a mark's X).
func recordHeader(rec []byte) (byte, uint64, error) {
	if len(rec) == 0 {
		return 0, 0, malformed("empty log record")
	}
	e, n := binary.Uvarint(rec[1:])
	if n <= 0 {
		return 0, 0, malformed("bad epoch")
	}
	switch rec[0] {
	case recBuffer, recPlainBuffer:
		if e == 0 || e > MaxEpoch {
			return 0, 0, malformed("buffer of epoch %d", e)
		}
	case recMark:
		if n+1 != len(rec) || e >= MaxEpoch {
			return 0, 0, malformed("mark of %d bytes, epoch %d", len(rec), e)
		}
	default:
		return 0, 0, malformed("record kind %d", rec[0])
	}
	return rec[0], e, nil
}

// lastMark returns the last mark in a log. Each logger round ends with a
// mark, so it reads back from the end in growing steps rather than the
// whole log.
func lastMark(s LogSink) (mark uint64, found bool, err error) {
	last := s.LastIndex()
	for back := uint64(256); ; back *= 4 {
		from := uint64(0)
		if last > back {
			from = last - back
		}
		err := s.Replay(from, func(_ uint64, rec []byte) error {
			// A malformed record is reported by the replay that follows.
			if kind, e, err := recordHeader(rec); err == nil && kind == recMark {
				mark, found = e, true
			}
			return nil
		})
		if err != nil || found || from == 0 {
			return mark, found, err
		}
	}
}

// replayCounts count what one log's replay applied and skipped.
type replayCounts struct {
	applied, void, voidBytes int64
}

// replay applies logger i's buffers of the epochs in [from, to] that are
// not void, decoding them on every core. It returns the log's last index
// and the largest epoch it holds (a mark X counting as X+1).
func (db *DB) replay(i int, s LogSink, from, to uint64, void []epochRange, counts *replayCounts) (last, maxSeen uint64, err error) {
	name := fmt.Sprintf("log-%d", i)
	p := startPool(max(1, runtime.GOMAXPROCS(0)/len(db.loggers)), func(index int64, rec []byte) error {
		if err := db.applyBuffer(rec); err != nil {
			return &CorruptionError{File: name, Offset: index, Err: err}
		}
		return nil
	})
	var read int64 // counts towards CheckpointLogSize
	err = s.Replay(0, func(index uint64, rec []byte) error {
		last = index
		read += int64(len(rec))
		kind, e, err := recordHeader(rec)
		if err != nil {
			return &CorruptionError{File: name, Offset: int64(index), Err: err}
		}
		if kind == recMark {
			maxSeen = max(maxSeen, e+1)
			return nil
		}
		maxSeen = max(maxSeen, e)
		switch {
		case e > to && !isVoid(void, e):
			counts.void++
			counts.voidBytes += int64(len(rec))
		case e >= from && e <= to && !isVoid(void, e):
			counts.applied++
			p.submit(int64(index), append([]byte(nil), rec...))
		}
		return nil
	})
	db.logged.Add(read)
	if perr := p.wait(); err == nil {
		err = perr
	}
	return last, maxSeen, err
}

func isVoid(void []epochRange, e uint64) bool {
	for _, r := range void {
		if e >= r.From && e <= r.To {
			return true
		}
	}
	return false
}

// applyBuffer applies one logged buffer: transactions of (tid, writes).
func (db *DB) applyBuffer(rec []byte) error {
	d := decoder{b: rec[1:]}
	epoch := d.uvarint("epoch")
	for len(d.b) > 0 && d.err == nil {
		tid := d.u64("tid")
		nb := d.bytes(4, "write count")
		if d.err != nil {
			break
		}
		n := uint64(binary.LittleEndian.Uint32(nb))
		if err := checkTID(tid, epoch); err != nil {
			return err
		}
		if n == 0 || n > uint64(len(d.b)) {
			return malformed("transaction of %d writes in %d bytes", n, len(d.b))
		}
		var prev logWrite
		for i := range n {
			var w logWrite
			var t *table
			var ok bool
			switch {
			case rec[0] == recPlainBuffer:
				w, t, ok = d.write(db.cat.byID)
			case i == 0:
				w, t, ok = d.packedWrite(nil, db.cat.byID)
			default:
				w, t, ok = d.packedWrite(&prev, db.cat.byID)
			}
			if d.err != nil {
				return d.err
			}
			if ok {
				if err := apply(t, w, tid); err != nil {
					return err
				}
			}
			prev = w
		}
	}
	return d.err
}
