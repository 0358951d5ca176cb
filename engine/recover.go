package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// Recovery (SiloR), on Open:
//
//  1. Load the catalog.
//  2. Load the newest complete full checkpoint and the deltas after it,
//     if any (checkpoint.go): Cs is the newest file's start, Ce the
//     latest end.
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
func (db *DB) recover() error {
	if err := db.loadCatalog(); err != nil {
		return err
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
	type logInfo struct {
		mark, maxSeen, last uint64
		marked              bool
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
			info.last, info.maxSeen, errs[i] = db.replay(i, lg.sink, cs, d, void)
		}()
	}
	wg.Wait()
	maxSeen := max(ce, db.maxVoid())
	for i, err := range errs {
		if err != nil {
			return err
		}
		maxSeen = max(maxSeen, infos[i].maxSeen)
	}
	if maxSeen > d {
		db.cat.mu.Lock()
		db.cat.mu.void = append(db.cat.mu.void, epochRange{d + 1, maxSeen})
		err := db.saveCatalogLocked()
		db.cat.mu.Unlock()
		if err != nil {
			return fmt.Errorf("engine: recording void epochs: %w", err)
		}
		db.cfg.Logf("engine: epochs %d..%d were not durable; their log records are void", d+1, maxSeen)
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

// replay applies logger i's buffers of the epochs in [from, to] that are
// not void, decoding them on every core. It returns the log's last index
// and the largest epoch it holds (a mark X counting as X+1).
func (db *DB) replay(i int, s LogSink, from, to uint64, void []epochRange) (last, maxSeen uint64, err error) {
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
		if e >= from && e <= to && !isVoid(void, e) {
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

// trimVoid forgets void ranges that end before a checkpoint's start: the
// log records they cover are truncated or skipped as older than it.
func (db *DB) trimVoid(cs uint64) {
	db.cat.mu.Lock()
	defer db.cat.mu.Unlock()
	kept := db.cat.mu.void[:0:0]
	for _, r := range db.cat.mu.void {
		if r.To >= cs {
			kept = append(kept, r)
		}
	}
	if len(kept) == len(db.cat.mu.void) {
		return
	}
	old := db.cat.mu.void
	db.cat.mu.void = kept
	// Not saveCatalogOrUndo: a catalog renamed into place but not synced
	// fails a DDL, but here either catalog on disk, with the ranges or
	// without, is safe, so a failed save only keeps the ranges till next
	// time.
	if err := db.saveCatalogLocked(); err != nil {
		db.cat.mu.void = old
		db.cfg.Logf("engine: trimming void epochs from the catalog: %v", err)
	}
}
