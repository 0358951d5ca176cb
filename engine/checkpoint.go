package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage"
)

// A checkpoint is a file checkpoint-<start epoch> of framed chunks:
//
//	chunk   = u32 LE length | u32 LE CRC-32C of payload | payload
//	payload = 1 entry*                        (a data chunk, ≤ ~1 MiB)
//	        | 2 "kiroku-ckpt" uvarint(Cs) uvarint(Ce) uvarint(rows)   (the trailer, last)
//	entry   = tid (8 bytes LE) write          (write: see codec.go, always a put)
//
// Checkpointing does not stop writers (SiloR). It starts at epoch Cs, once
// every commit of an earlier epoch is installed, walks every table reading
// each record as a transaction would (a stable TID and row), and ends at
// epoch Ce. The rows it saw may be of any epoch up to Ce, so the file is
// renamed to its final name only once the durable epoch reaches Ce. Such a
// fuzzy checkpoint plus the log of the epochs from Cs on reproduces a
// consistent state, because replay keeps, per key, the highest TID. Once
// the file is in place, the log prefix of epochs before Cs is truncated.

const (
	ckptPrefix   = "checkpoint-"
	ckptTmp      = ".tmp"
	ckptChunk    = 1 << 20
	ckptMaxChunk = ckptChunk + maxRowBytes + 1<<10
	ckptMagic    = "kiroku-ckpt"
	chunkData    = 1
	chunkTrailer = 2
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// CorruptionError names a stored file that does not decode.
type CorruptionError struct {
	File   string
	Offset int64
	Err    error
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("engine: corrupt %s at offset %d: %v", e.File, e.Offset, e.Err)
}
func (e *CorruptionError) Unwrap() error { return e.Err }

func ckptName(cs uint64) string { return fmt.Sprintf("%s%020d", ckptPrefix, cs) }

func parseCkptName(name string) (uint64, bool) {
	if !strings.HasPrefix(name, ckptPrefix) || strings.HasSuffix(name, ckptTmp) {
		return 0, false
	}
	cs, err := strconv.ParseUint(name[len(ckptPrefix):], 10, 64)
	return cs, err == nil
}

// CheckpointStats describe one checkpoint.
type CheckpointStats struct {
	Start, End uint64 // epochs Cs and Ce
	Rows       int
	Bytes      int64
	Duration   time.Duration
}

func (db *DB) checkpointLoop() {
	defer db.wg.Done()
	// Closing cancels a checkpoint waiting for its epochs to be durable.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-db.closing; cancel() }() // ends with the engine
	// The log recovery read may call for one at once.
	db.noteLogged(0)
	for {
		select {
		case <-db.closing:
			return
		case <-time.After(db.cfg.CheckpointInterval):
		case <-db.ckptKick:
		}
		st, err := db.Checkpoint(ctx)
		if err != nil {
			db.cfg.Logf("engine: checkpoint: %v", err)
			continue
		}
		db.cfg.Logf("engine: checkpoint of epochs %d..%d: %d rows, %d bytes in %v", st.Start, st.End, st.Rows, st.Bytes, st.Duration)
	}
}

// noteLogged counts n more log bytes, and kicks the checkpoint loop if the
// log since the last checkpoint began has reached CheckpointLogSize.
func (db *DB) noteLogged(n int64) {
	total := db.logged.Add(n)
	if limit := db.cfg.CheckpointLogSize; limit > 0 && total-db.ckptBase.Load() >= limit {
		select {
		case db.ckptKick <- struct{}{}:
		default:
		}
	}
}

// Checkpoint writes a checkpoint now, without stopping writers, and then
// truncates the log it covers. A failure to write or sync the file is
// fatal to the engine, like any fsync failure.
func (db *DB) Checkpoint(ctx context.Context) (CheckpointStats, error) {
	db.ckptMu.Lock()
	defer db.ckptMu.Unlock()
	if err := db.usable("checkpoint"); err != nil {
		return CheckpointStats{}, err
	}
	if db.cfg.Log == LogNone {
		return CheckpointStats{}, &storage.Error{Kind: storage.ErrInvalidArgument, Op: "checkpoint", Detail: "an engine without a log writes no checkpoints"}
	}
	began := time.Now()
	// What is logged from here on counts towards the next one. (Some of
	// it belongs to epochs this one covers: a checkpoint comes early,
	// never late.)
	db.ckptBase.Store(db.logged.Load())
	cs := db.epoch.Load()
	// Every commit of an epoch before cs must be installed before the walk.
	for spins := 0; ; spins++ {
		behind := false
		for _, w := range db.workers {
			if a := w.active.Load(); a != 0 && a < cs {
				behind = true
			}
		}
		if !behind {
			break
		}
		backoff(spins)
	}
	tmp := db.fs.PathJoin(db.cfg.Dir, ckptName(cs)+ckptTmp)
	st, err := db.writeCheckpoint(tmp, cs)
	if err != nil {
		db.fs.Remove(tmp)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return st, err
		}
		db.fail(fmt.Errorf("checkpoint: %w", err))
		return st, err
	}
	if err := db.WaitDurable(ctx, st.End); err != nil {
		db.fs.Remove(tmp)
		return st, err
	}
	if err := db.fs.Rename(tmp, db.fs.PathJoin(db.cfg.Dir, ckptName(cs))); err != nil {
		db.fail(fmt.Errorf("checkpoint: %w", err))
		return st, err
	}
	if err := vfsutil.SyncDir(db.fs, db.cfg.Dir); err != nil {
		db.fail(fmt.Errorf("checkpoint: %w", err))
		return st, err
	}
	// Older checkpoints and the log before cs are no longer needed.
	names, _ := db.fs.List(db.cfg.Dir)
	for _, n := range names {
		if old, ok := parseCkptName(n); ok && old < cs {
			db.fs.Remove(db.fs.PathJoin(db.cfg.Dir, n))
		}
	}
	if db.cfg.Log == LogWAL {
		for _, lg := range db.loggers {
			if err := lg.truncateBefore(cs); err != nil {
				return st, fmt.Errorf("truncating log %d: %w", lg.id, err)
			}
		}
	}
	db.trimVoid(cs)
	st.Duration = time.Since(began)
	return st, nil
}

func (db *DB) writeCheckpoint(path string, cs uint64) (CheckpointStats, error) {
	st := CheckpointStats{Start: cs}
	f, err := db.fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return st, err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	buf := make([]byte, 8, ckptChunk+64<<10)
	buf = append(buf[:8], chunkData)
	flush := func(kind byte) error {
		payload := buf[8:]
		binary.LittleEndian.PutUint32(buf[0:4], uint32(len(payload)))
		binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(payload, crcTable))
		if _, err := f.Write(buf); err != nil {
			return err
		}
		st.Bytes += int64(len(buf))
		buf = append(buf[:8], kind)
		return nil
	}
	// The walk goes ckptBatch records at a time, in stages (see touchRows).
	batch := make([]ckptRec, 0, ckptBatch)
	var recs []*record
	emit := func(t *table) error {
		for i := range batch {
			c := &batch[i]
			c.tid, c.rw = c.r.readStable()
		}
		touchRows(batch)
		for i := range batch {
			c := &batch[i]
			if c.tid&tidAbsent != 0 {
				continue
			}
			buf = binary.LittleEndian.AppendUint64(buf, tidVersion(c.tid))
			buf = appendWrite(buf, t.id, c.p.pk, c.r.ck, c.rw)
			st.Rows++
			if len(buf) >= ckptChunk {
				if err := flush(chunkData); err != nil {
					return err
				}
			}
		}
		clear(batch)
		batch = batch[:0]
		return nil
	}
	for _, t := range db.cat.tables() {
		var werr error
		add := func(p *partition, r *record) bool {
			batch = append(batch, ckptRec{p: p, r: r})
			if len(batch) == cap(batch) {
				werr = emit(t)
			}
			return werr == nil
		}
		t.rangeParts(func(p *partition) bool {
			if p.cl == nil {
				return add(p, &p.one)
			}
			// The partition's records are listed under its lock, and read
			// (and written out) after it is released.
			recs = recs[:0]
			p.cl.mu.RLock()
			p.cl.tree.Ascend(func(it ckItem) bool { recs = append(recs, it.r); return true })
			p.cl.mu.RUnlock()
			for _, r := range recs {
				if !add(p, r) {
					return false
				}
			}
			return true
		})
		if werr == nil {
			werr = emit(t)
		}
		if werr != nil {
			return st, werr
		}
	}
	if len(buf) > 9 {
		if err := flush(chunkData); err != nil {
			return st, err
		}
	}
	st.End = db.epoch.Load()
	buf = append(buf[:8], chunkTrailer)
	buf = append(buf, ckptMagic...)
	buf = binary.AppendUvarint(buf, cs)
	buf = binary.AppendUvarint(buf, st.End)
	buf = binary.AppendUvarint(buf, uint64(st.Rows))
	if err := flush(0); err != nil {
		return st, err
	}
	if err := f.Sync(); err != nil {
		return st, err
	}
	err = f.Close()
	f = nil
	return st, err
}

// ckptBatch is how many records a checkpoint's walk reads at once.
const ckptBatch = 32

// ckptRec is a record a checkpoint's walk has reached, with the TID and
// row it read.
type ckptRec struct {
	p   *partition
	r   *record
	tid uint64
	rw  *row
}

// touchSink keeps touchRows's loads from being optimized away.
var touchSink atomic.Uintptr

// touchRows loads a word of each row, then of each row's column array,
// then of each value's bytes, a stage at a time. A row's bytes sit behind
// three pointers (row, columns, each string), each a likely cache miss in
// a large database; encoding the rows one by one waited for every miss in
// turn, while the loads of a stage do not depend on each other, so the
// processor has the misses of a whole batch in flight at once, and the
// encoding that follows finds the lines in cache.
func touchRows(batch []ckptRec) {
	var sum uintptr
	for i := range batch {
		if rw := batch[i].rw; rw != nil {
			sum += uintptr(len(rw.cols))
		}
	}
	for i := range batch {
		if rw := batch[i].rw; rw != nil {
			for j := 0; j < len(rw.cols); j += 2 { // a line holds two values
				sum += uintptr(rw.cols[j].Type())
			}
		}
	}
	for i := range batch {
		if rw := batch[i].rw; rw != nil {
			for j := range rw.cols {
				if s := rw.cols[j].Content(); s != "" {
					sum += uintptr(s[0])
				}
			}
		}
	}
	touchSink.Add(sum)
}

// newestCheckpoint returns the newest complete checkpoint's name, removing
// unfinished temporary files.
func (db *DB) newestCheckpoint() (string, bool, error) {
	names, err := db.fs.List(db.cfg.Dir)
	if err != nil {
		return "", false, err
	}
	sort.Strings(names)
	best := ""
	for _, n := range names {
		if strings.HasPrefix(n, ckptPrefix) && strings.HasSuffix(n, ckptTmp) {
			db.fs.Remove(db.fs.PathJoin(db.cfg.Dir, n))
			continue
		}
		if _, ok := parseCkptName(n); ok {
			best = n
		}
	}
	return best, best != "", nil
}

// loadCheckpoint reads a checkpoint and applies its rows, decoding chunks
// on every core. It returns the trailer's epochs.
func (db *DB) loadCheckpoint(name string) (cs, ce uint64, rows int, err error) {
	f, err := db.fs.Open(db.fs.PathJoin(db.cfg.Dir, name))
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	corrupt := func(off int64, format string, args ...any) error {
		return &CorruptionError{File: name, Offset: off, Err: malformed(format, args...)}
	}
	var counted atomic.Int64
	p := startPool(runtime.GOMAXPROCS(0), func(off int64, payload []byte) error {
		n, err := db.applyEntries(payload[1:], 0)
		counted.Add(int64(n))
		if err != nil {
			return &CorruptionError{File: name, Offset: off, Err: err}
		}
		return nil
	})
	var off int64
	hdr := make([]byte, 8)
	trailer := false
	for err == nil {
		if _, rerr := io.ReadFull(f, hdr); rerr != nil {
			if rerr == io.EOF && trailer {
				break
			}
			err = corrupt(off, "truncated chunk header (%v)", rerr)
			break
		}
		n := binary.LittleEndian.Uint32(hdr[0:4])
		if n == 0 || n > ckptMaxChunk || trailer {
			err = corrupt(off, "chunk of %d bytes", n)
			break
		}
		payload := make([]byte, n)
		if _, rerr := io.ReadFull(f, payload); rerr != nil {
			err = corrupt(off, "truncated chunk (%v)", rerr)
			break
		}
		if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(hdr[4:8]) {
			err = corrupt(off, "checksum mismatch")
			break
		}
		switch payload[0] {
		case chunkData:
			p.submit(off, payload)
		case chunkTrailer:
			d := decoder{b: payload[1:]}
			if string(d.bytes(uint64(len(ckptMagic)), "magic")) != ckptMagic {
				err = corrupt(off, "bad trailer")
				break
			}
			cs, ce = d.uvarint("start epoch"), d.uvarint("end epoch")
			rows = int(d.uvarint("rows"))
			named, _ := parseCkptName(name)
			if d.err != nil || len(d.b) != 0 || cs != named || cs > ce || ce > MaxEpoch || rows < 0 {
				err = corrupt(off, "bad trailer")
			}
			trailer = true
		default:
			err = corrupt(off, "chunk kind %d", payload[0])
		}
		off += 8 + int64(n)
	}
	if perr := p.wait(); err == nil {
		err = perr
	}
	if err != nil {
		return 0, 0, 0, err
	}
	if total := int(counted.Load()); total != rows {
		return 0, 0, 0, corrupt(off, "trailer counts %d rows, chunks hold %d", rows, total)
	}
	return cs, ce, rows, nil
}

// applyEntries applies checkpoint entries (tid, write), keeping per key the
// highest TID. If epoch is non-zero every TID must be of that epoch.
func (db *DB) applyEntries(b []byte, epoch uint64) (int, error) {
	d := decoder{b: b}
	n := 0
	for len(d.b) > 0 {
		tid := d.u64("tid")
		w, t, ok := d.write(db.cat.byID)
		if d.err != nil {
			return n, d.err
		}
		if err := checkTID(tid, epoch); err != nil {
			return n, err
		}
		n++
		if !ok {
			continue
		}
		if err := apply(t, w, tid); err != nil {
			return n, err
		}
	}
	return n, nil
}

func checkTID(tid, epoch uint64) error {
	if tid&tidStatusMask != 0 || tidEpoch(tid) == 0 || (epoch != 0 && tidEpoch(tid) != epoch) {
		return malformed("TID %#x (epoch %d)", tid, epoch)
	}
	return nil
}

// apply installs a recovered write unless the record already holds a
// higher TID.
func apply(t *table, w logWrite, tid uint64) error {
	h := t.hash(w.pk)
	p := t.shardOf(h).find(h, w.pk)
	if p == nil { // a key not seen yet: check it decodes before it is kept
		if _, err := t.decodePartition(w.pk); err != nil {
			return malformed("partition key: %v", err)
		}
		p, _, _ = t.makePartition(h, w.pk)
	}
	if t.clustered() {
		if _, err := t.decodeClustering(w.ck); err != nil {
			return malformed("clustering key: %v", err)
		}
	}
	r, _, _ := p.makeRecord(w.ck)
	for spins := 0; ; spins++ {
		cur := r.tid.Load()
		if cur&tidLock == 0 && r.tid.CompareAndSwap(cur, cur|tidLock) {
			if tidVersion(cur) >= tid {
				r.tid.Store(cur)
				return nil
			}
			status := tidLatest
			if w.del {
				status |= tidAbsent
				r.row.Store(nil)
			} else {
				r.row.Store(&row{cols: w.cols})
			}
			r.tid.Store(tid | status)
			return nil
		}
		backoff(spins)
	}
}
