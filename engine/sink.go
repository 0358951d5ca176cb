package engine

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/wal"
)

// logSpan records, per durable proposal, the index of its last record and
// the largest epoch any record up to it counts as (record.spanEpoch): the
// log before a checkpoint's start Cs is truncated only where every record
// counts below Cs.
type logSpan struct{ last, maxEpoch uint64 }

const maxSpans = 4096

// propose hands records to the sink. maxEpoch is the largest epoch they
// count as for truncation; done, if not nil, runs once they are durable
// (see LogSink.Propose), after the span is recorded.
func (db *DB) propose(recs [][]byte, maxEpoch uint64, done func(last uint64, err error)) error {
	return db.sink.Propose(recs, func(last uint64, err error) {
		if err == nil {
			db.logLast.Store(last)
			db.spanMu.Lock()
			db.spanMax = max(db.spanMax, maxEpoch)
			db.addSpanLocked(logSpan{last: last, maxEpoch: db.spanMax})
			db.spanMu.Unlock()
		}
		if done != nil {
			done(last, err)
		}
	})
}

// logNow proposes one record that is not a buffer or a mark (a catalog
// change, a void range, an era, a floor) and waits until it is durable.
// A failure fails the engine.
func (db *DB) logNow(rec []byte) error {
	r, err := decodeRecord(rec)
	if err != nil {
		return err
	}
	ch := make(chan error, 1)
	if err := db.propose([][]byte{rec}, r.spanEpoch(), func(_ uint64, err error) { ch <- err }); err != nil {
		db.fail(fmt.Errorf("logging %v: %w", r, err))
		return err
	}
	if err := <-ch; err != nil {
		db.fail(fmt.Errorf("logging %v: %w", r, err))
		return err
	}
	return nil
}

// logDDL logs a catalog change. Called with the catalog's lock held: a
// checkpoint that snapshots the catalog after a change's epoch began waits
// for the change (see Checkpoint).
func (db *DB) logDDL(rec []byte) error {
	if err := db.failure(); err != nil {
		return err
	}
	return db.logNow(rec)
}

// addSpanLocked records a durable proposal. A span whose running maximum
// epoch equals the previous one's replaces it, and past maxSpans every
// other span is dropped: fewer spans only make truncation cut less, never
// more, and a log whose checkpoints are off keeps a bounded list.
func (db *DB) addSpanLocked(sp logSpan) {
	if n := len(db.spans); n > 0 && db.spans[n-1].maxEpoch == sp.maxEpoch {
		db.spans[n-1] = sp
		return
	}
	if len(db.spans) >= maxSpans {
		kept := db.spans[:0]
		for i := 1; i < len(db.spans); i += 2 {
			kept = append(kept, db.spans[i])
		}
		db.spans = kept
	}
	db.spans = append(db.spans, sp)
}

// truncateBefore drops the log prefix whose records all count below epoch
// from (a checkpoint that started at from covers them), and returns the
// index of the first record kept, or 0 if it dropped nothing.
func (db *DB) truncateBefore(from uint64) (uint64, error) {
	db.spanMu.Lock()
	cut := -1
	for i, s := range db.spans {
		if s.maxEpoch >= from {
			break
		}
		cut = i
	}
	var index uint64
	if cut >= 0 {
		index = db.spans[cut].last + 1
		db.spans = append(db.spans[:0], db.spans[cut+1:]...)
	}
	db.spanMu.Unlock()
	if index == 0 {
		return 0, nil
	}
	return index, db.sink.TruncateFront(index)
}

// ---- the write-ahead log as a sink -------------------------------------------

// walSink is the write-ahead log as the engine's sink: a proposal is an
// asynchronous append. The log's syncer reports each durable append in
// append order; the sink's own goroutine (deliver) runs the engine's
// callbacks, so that the syncer starts its next fsync while they release
// the committers (run on the syncer, they delayed every fsync by the
// wake-ups of the waiting clients: 64 of them lost a tenth of their
// throughput).
type walSink struct {
	l     *wal.Log
	max   int
	calls chan sinkCall
	done  chan struct{}
	once  sync.Once
}

type sinkCall struct {
	fn   func(uint64, error)
	last uint64
	err  error
}

// sinkCalls bounds the callbacks waiting for the sink's goroutine; the
// rounds in flight (loggers times LogRoundsInFlight, plus single records)
// stay far below it, and past it the syncer waits.
const sinkCalls = 1024

func (s *walSink) deliver() {
	defer close(s.done)
	for c := range s.calls {
		c.fn(c.last, c.err)
	}
}

// openWALSink opens the engine's write-ahead log in dir/log with the batch
// policy: what is proposed while an fsync runs shares the next one. The
// log keeps up to recycle segments that a checkpoint truncated, to reuse.
func openWALSink(fs vfs.FS, dir string, segSize int64, recycle int) (LogSink, error) {
	cfg := wal.Config{Dir: fs.PathJoin(dir, logDir), FS: fs, Policy: wal.BatchPolicy(), SegmentSize: segSize,
		MaxRecordSize: int(min(segSize-64, 64<<20)), MaxPending: 128 << 20, RecycleSegments: recycle}
	l, err := wal.Open(cfg)
	if err != nil {
		return nil, err
	}
	s := &walSink{l: l, max: cfg.MaxRecordSize, calls: make(chan sinkCall, sinkCalls), done: make(chan struct{})}
	go s.deliver()
	return s, nil
}

// logDir is the directory of the engine's log inside its data directory.
const logDir = "log"

// recycleSegments is how many truncated segments the log keeps for reuse:
// as many as a checkpoint's truncation frees in steady state (the log
// written between two checkpoints, ckptLog bytes), plus one. A new segment
// is a new file of fresh page-cache pages; reusing one overwrites cached
// pages and blocks already allocated. Zero-filling new files once took a
// seventh of the processors under a write-only load. (The log now writes
// with direct I/O, which bypasses the page cache; reuse still spares the
// block allocation.) With checkpoints left to time alone (ckptLog
// negative) the log between two of them has no bound, and a few are kept.
func recycleSegments(ckptLog int64, seg int64) int {
	if ckptLog <= 0 {
		return 4
	}
	return int(min((ckptLog+seg-1)/seg+1, 64))
}

func (s *walSink) MaxRecordSize() int { return s.max }

func (s *walSink) Propose(recs [][]byte, done func(uint64, error)) error {
	_, err := s.l.AppendAsync(recs, func(last uint64, err error) { s.calls <- sinkCall{done, last, err} })
	return err
}

func (s *walSink) Replay(from uint64, fn func(uint64, []byte) error) error {
	from = max(from, s.l.FirstIndex())
	if s.l.LastIndex() < from {
		return nil
	}
	return s.l.Scan(from, fn)
}

func (s *walSink) TruncateFront(index uint64) error { return s.l.TruncateFront(index) }

func (s *walSink) Recovered() SinkRecovery {
	t := s.l.Recovery().TornTail
	if t == nil {
		return SinkRecovery{}
	}
	return SinkRecovery{Bytes: t.Bytes, Detail: fmt.Sprintf("%s at offset %d: %s", t.Segment, t.Offset, t.Reason)}
}

// Close closes the log, which reports every append, and waits for the
// callbacks.
func (s *walSink) Close() error {
	err := s.l.Close()
	s.once.Do(func() { close(s.calls) })
	<-s.done
	return err
}
