package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
)

// Recovery (SiloR), on Open:
//
//  1. Load the newest complete full checkpoint and the deltas after it,
//     if any (checkpoint.go): the catalog from the newest file, then every
//     file's rows. Cs is the newest file's start, Ce the latest end: every
//     epoch up to Ce was durable when the files were written.
//  2. Apply the log, from its first record, with the state machine every
//     replica applies it with (apply.go): buffers of epochs from Cs on once
//     marks make them durable, catalog changes, void ranges, eras. D
//     starts at Ce. Records of epochs below Cs are in the checkpoints.
//  3. The log's floor records say which epochs it may have lost to
//     truncation: a chain that starts below the highest floor F lacks a
//     checkpoint file the log was truncated for, and the engine refuses
//     (ErrLogGap) rather than serve the gap.
//  4. Epochs above the final D that records name were never durable, so
//     none of their commits was acknowledged: a void record makes them
//     so for every later reader of the log, and an era record starts this
//     run's loggers above them. Both are durable before anything new is
//     logged.
//
// What recovery dropped — a torn tail the log cut, records of void epochs
// — is in DB.Recovery and reported through Config.Logf.
func (db *DB) recover() error {
	if db.cfg.Log == LogNone {
		db.resetEpochs(1, 0)
		return nil
	}
	s, err := db.cfg.OpenSink(db.fs, db.cfg.Dir)
	if err != nil {
		return fmt.Errorf("engine: opening the log: %w", err)
	}
	db.sink = s
	if db.maxRecord = s.MaxRecordSize(); db.maxRecord < 4<<10 {
		return fmt.Errorf("engine: the log takes records of at most %d bytes", db.maxRecord)
	}
	if torn := s.Recovered(); torn.Bytes > 0 {
		db.recovery.TornTails = append(db.recovery.TornTails, TornTail(torn))
		db.cfg.Logf("engine: the log dropped a torn tail of %d bytes, never acknowledged: %s", torn.Bytes, torn.Detail)
	}
	chain, err := db.findChain()
	if err != nil {
		return err
	}
	cs, ce, loggers, err := db.loadChain(chain)
	if err != nil {
		return err
	}
	if len(chain) == 0 {
		loggers = db.cfg.Loggers
	}
	db.recovery.Checkpoints = len(chain)

	pa := newPoolApply(db, max(1, runtime.GOMAXPROCS(0)))
	sm := newStateMachine(db, cs, ce, loggers, pa.apply, pa.barrier)
	var read int64 // counts towards CheckpointLogSize
	err = s.Replay(0, func(index uint64, rec []byte) error {
		read += int64(len(rec))
		return sm.step(index, rec)
	})
	if perr := pa.close(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	db.logged.Add(read)
	if cs < sm.floor {
		newest := "none"
		if len(chain) > 0 {
			newest = chain[len(chain)-1].name()
		}
		return fmt.Errorf("%w: the log was truncated for a checkpoint that started at epoch %d, but the newest checkpoint here (%s) starts at epoch %d: the records of epochs %d..%d are in a checkpoint file that is missing",
			ErrLogGap, sm.floor, newest, cs, cs, sm.floor-1)
	}
	db.recovery.Records, db.recovery.VoidRecords, db.recovery.VoidBytes = sm.applied, sm.voidRecords, sm.voidBytes
	return db.lead(sm)
}

// lead takes over the log sm has applied, as recovery does at Open and a
// follower does when promoted: epochs above D that records name can never
// become durable, so a void record makes them so for every reader of the
// log, and an era record starts this engine's loggers above them. Both
// are durable before anything new is logged.
func (db *DB) lead(sm *stateMachine) error {
	if v, ok := sm.undecided(); ok {
		pending := sm.voidRecords
		if err := sm.step(sm.last+1, voidRecord(v)); err != nil {
			return err
		}
		if err := db.logNow(voidRecord(v)); err != nil {
			return fmt.Errorf("engine: recording void epochs: %w", err)
		}
		db.recovery.VoidFrom, db.recovery.VoidTo = v.From, v.To
		db.recovery.VoidRecords, db.recovery.VoidBytes = sm.voidRecords, sm.voidBytes
		if n := sm.voidRecords - pending; n > 0 {
			db.cfg.Logf("engine: epochs %d..%d were not durable, never acknowledged; their %d log records (%d bytes) are void",
				v.From, v.To, sm.voidRecords, sm.voidBytes)
		}
	}
	first := sm.maxSeen + 1
	if err := db.logNow(eraRecord(db.cfg.Loggers, first)); err != nil {
		return fmt.Errorf("engine: starting the log's era: %w", err)
	}
	for _, lg := range db.loggers {
		lg.proposed.Store(first - 1)
	}
	db.resetEpochs(first, first-1)
	return nil
}

// ErrLogGap is the cause Open reports when the log does not reach back to
// where the checkpoints end: a checkpoint file the log was truncated for
// is missing, and opening would serve the state without the records in it.
var ErrLogGap = errors.New("engine: the log does not reach the checkpoints")

// ErrOldLayout is the cause Open reports for a data directory written by
// an older version of the engine, which kept the catalog in catalog.json
// and a log per logger (log-0, log-1, ...). This version keeps one log,
// with the catalog in it and in the checkpoints, and does not read those.
var ErrOldLayout = errors.New("engine: the data directory is of an older format")

// checkLayout refuses a data directory of the older format.
func (db *DB) checkLayout() error {
	names, err := db.fs.List(db.cfg.Dir)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	for _, n := range names {
		if n == "catalog.json" || strings.HasPrefix(n, "log-") {
			return fmt.Errorf("%w: %s holds %s; open it with the version that wrote it", ErrOldLayout, db.cfg.Dir, n)
		}
	}
	return nil
}

// RecoveryStats say what Open recovered and what it dropped.
type RecoveryStats struct {
	// Checkpoints is how many checkpoint files were loaded.
	Checkpoints int
	// Records is how many log records (buffers) were applied.
	Records int64
	// VoidFrom..VoidTo is the range of epochs found in the log past the
	// durable epoch, made void at this Open: their commits were never
	// acknowledged. 0..0 if there were none. (A clean stop leaves such a
	// range too, without records: the last marks name epochs beyond what
	// any buffer holds.)
	VoidFrom, VoidTo uint64
	// VoidRecords and VoidBytes count the log records of void epochs, at
	// this Open or recorded as void before, skipped.
	VoidRecords, VoidBytes int64
	// TornTails are the partial writes the log cut from its tail.
	TornTails []TornTail
}

// Dropped reports whether recovery dropped anything.
func (r RecoveryStats) Dropped() bool { return r.VoidRecords > 0 || len(r.TornTails) > 0 }

// TornTail is a partial write the log cut from its tail at Open: records
// being written when the process or machine stopped, never acknowledged.
type TornTail struct {
	Bytes  int64
	Detail string
}

// Recovery returns what Open recovered and dropped.
func (db *DB) Recovery() RecoveryStats { return db.recovery }

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
