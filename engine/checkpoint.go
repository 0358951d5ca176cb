package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage"
)

// A checkpoint is a file of framed chunks, full or delta:
//
//	checkpoint-<Cs>        full: every record present
//	delta-<Cs>-<B>         delta: every record whose TID is of an epoch ≥ B,
//	                       the start of the checkpoint before it; a deleted
//	                       record as a tombstone
//
//	chunk   = u32 LE length | u32 LE CRC-32C of payload | payload
//	payload = 3 json(catalogSnapshot)                     (the catalog, first)
//	        | 1 entry*                                    (a data chunk, ≤ ~1 MiB)
//	        | 2 magic uvarint(Cs) uvarint(Ce) uvarint(rows) [uvarint(B)]  (the trailer, last)
//	magic   = "kiroku-ckpt" (full) | "kiroku-delta" (delta, with B)
//	entry   = tid (8 bytes LE) write          (write: see codec.go; a delete only in a delta)
//
// Checkpointing does not stop writers (SiloR). It starts at epoch Cs, once
// every commit of an earlier epoch is installed, walks every table reading
// each record as a transaction would (a stable TID and row), and ends at
// epoch Ce. The rows it saw may be of any epoch up to Ce, so the file is
// renamed to its final name only once the durable epoch reaches Ce. Such a
// fuzzy checkpoint plus the log of the epochs from Cs on reproduces a
// consistent state, because replay keeps, per key, the highest TID. Once
// the file is in place, the log prefix of epochs before Cs is truncated.
//
// A chain is a full checkpoint and the deltas after it, each delta's B
// the Cs of the file before it. Loading every file of a chain, highest
// TID winning, gives for each record a version at least as new as the
// last one of an epoch before the newest Cs, which is all the log from
// that Cs on needs. By induction over the chain: for a record whose last
// version before Cs_k is of an epoch ≥ B = Cs_(k−1), the walk of delta k,
// which begins once that version is installed, writes it or a newer one;
// for one whose last version before Cs_k is older than B, that is also
// its last version before Cs_(k−1), which the chain up to k−1 holds.
// Records are never unlinked from their tables, so a delete is a record
// with a newer TID, and the walk finds it.

const (
	ckptPrefix   = "checkpoint-"
	deltaPrefix  = "delta-"
	ckptTmp      = ".tmp"
	ckptChunk    = 1 << 20
	ckptMaxChunk = ckptChunk + maxRowBytes + 1<<10
	ckptMagic    = "kiroku-ckpt"
	deltaMagic   = "kiroku-delta"
	chunkData    = 1
	chunkTrailer = 2
	chunkCatalog = 3
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// CorruptionError names a stored file that does not decode.
type CorruptionError struct {
	File   string
	Offset int64 // where in File; -1 if the file as a whole is wrong
	Err    error
}

func (e *CorruptionError) Error() string {
	if e.Offset < 0 {
		return fmt.Sprintf("engine: corrupt %s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("engine: corrupt %s at offset %d: %v", e.File, e.Offset, e.Err)
}
func (e *CorruptionError) Unwrap() error { return e.Err }

// ckptFile names a checkpoint: full if base is 0, else a delta over the
// checkpoint that began at epoch base.
type ckptFile struct {
	cs, base uint64
}

func (f ckptFile) delta() bool { return f.base != 0 }

func (f ckptFile) name() string {
	if f.delta() {
		return fmt.Sprintf("%s%020d-%020d", deltaPrefix, f.cs, f.base)
	}
	return fmt.Sprintf("%s%020d", ckptPrefix, f.cs)
}

// parseCkptName parses a complete checkpoint's name, full or delta.
func parseCkptName(name string) (ckptFile, bool) {
	if strings.HasSuffix(name, ckptTmp) {
		return ckptFile{}, false
	}
	if rest, ok := strings.CutPrefix(name, ckptPrefix); ok {
		cs, err := strconv.ParseUint(rest, 10, 64)
		return ckptFile{cs: cs}, err == nil && cs != 0
	}
	if rest, ok := strings.CutPrefix(name, deltaPrefix); ok {
		a, b, found := strings.Cut(rest, "-")
		cs, err1 := strconv.ParseUint(a, 10, 64)
		base, err2 := strconv.ParseUint(b, 10, 64)
		return ckptFile{cs: cs, base: base}, found && err1 == nil && err2 == nil && base != 0 && base < cs
	}
	return ckptFile{}, false
}

// ckptChain is what recovery would load: the last full checkpoint and the
// deltas after it.
type ckptChain struct {
	last       uint64 // Cs of the chain's newest file; 0 if there is none
	fullBytes  int64  // the size of its full checkpoint
	deltaBytes int64  // the sizes of its deltas, summed
	// logFrom is the first log index the chain needs replayed: the log
	// before it was truncated for the chain's checkpoints. 0 if unknown
	// (the whole log kept is needed).
	logFrom uint64
}

// CheckpointStats describe one checkpoint.
type CheckpointStats struct {
	Start, End uint64 // epochs Cs and Ce
	// Base is, for a delta, the start of the checkpoint it follows: it
	// holds the records written from that epoch on. 0 for a full one.
	Base     uint64
	Rows     int
	Bytes    int64
	Duration time.Duration
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
		case <-db.clock.After(db.cfg.CheckpointInterval):
		case <-db.ckptKick:
			if !db.ckptDue() {
				// A logger kicked again before the checkpoint just
				// written began and moved ckptBase: under uniform
				// updates, a delta right after a full checkpoint holds
				// nearly every row again (ycsb-wo: 866,474 of a
				// million).
				continue
			}
		}
		st, err := db.Checkpoint(ctx)
		if err != nil {
			db.cfg.Logf("engine: checkpoint: %v", err)
			continue
		}
		kind := "full"
		if st.Base != 0 {
			kind = fmt.Sprintf("delta since epoch %d", st.Base)
		}
		db.cfg.Logf("engine: checkpoint of epochs %d..%d (%s): %d rows, %d bytes in %v", st.Start, st.End, kind, st.Rows, st.Bytes, st.Duration)
	}
}

// CheckpointBusy reports whether a checkpoint is being written, or is due
// (CheckpointLogSize bytes logged since the last one began) and about to
// start. A benchmark that alternates this engine with another waits for
// it to be false, so that no checkpoint of this engine runs in the
// other's time.
func (db *DB) CheckpointBusy() bool {
	return db.ckptRunning.Load() ||
		db.cfg.Log == LogWAL && db.cfg.CheckpointInterval > 0 && db.ckptDue() && db.failure() == nil && !db.closed.Load()
}

// ckptDue reports whether the log since the last checkpoint began has
// reached CheckpointLogSize.
func (db *DB) ckptDue() bool {
	limit := db.cfg.CheckpointLogSize
	return limit > 0 && db.logged.Load()-db.ckptBase.Load() >= limit
}

// noteLogged counts n more log bytes, and kicks the checkpoint loop if the
// log since the last checkpoint began has reached CheckpointLogSize.
func (db *DB) noteLogged(n int64) {
	db.logged.Add(n)
	if db.ckptDue() {
		select {
		case db.ckptKick <- struct{}{}:
		default:
		}
	}
}

// Checkpoint writes a checkpoint now, without stopping writers, and then
// truncates the log it covers. It is a delta or a full one as
// Config.CheckpointDeltaShare decides (CheckpointStats.Base tells). A failure to write or sync the file is
// fatal to the engine, like any fsync failure.
func (db *DB) Checkpoint(ctx context.Context) (CheckpointStats, error) {
	db.ckptMu.Lock()
	defer db.ckptMu.Unlock()
	db.ckptRunning.Store(true)
	defer db.ckptRunning.Store(false)
	if err := db.usable("checkpoint"); err != nil {
		return CheckpointStats{}, err
	}
	if db.cfg.Log == LogNone {
		return CheckpointStats{}, &storage.Error{Kind: storage.ErrInvalidArgument, Op: "checkpoint", Detail: "an engine without a log writes no checkpoints"}
	}
	began := db.clock.Now()
	if f := db.hooks.checkpointBegin.Load(); f != nil {
		(*f)()
	}
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
	// A delta follows the chain's newest file; it needs a later start.
	file := ckptFile{cs: cs}
	if ch := db.chain; ch.last != 0 && ch.last < cs && float64(ch.deltaBytes) < db.cfg.CheckpointDeltaShare*float64(ch.fullBytes) {
		file.base = ch.last
	}
	final := db.fs.PathJoin(db.cfg.Dir, file.name())
	tmp := final + ckptTmp
	st, err := db.writeCheckpoint(tmp, file)
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
	if err := db.fs.Rename(tmp, final); err != nil {
		db.fail(fmt.Errorf("checkpoint: %w", err))
		return st, err
	}
	if err := vfsutil.SyncDir(db.fs, db.cfg.Dir); err != nil {
		db.fail(fmt.Errorf("checkpoint: %w", err))
		return st, err
	}
	if file.delta() {
		db.chain.last = cs
		db.chain.deltaBytes += st.Bytes
	} else {
		db.chain = ckptChain{last: cs, fullBytes: st.Bytes}
		db.removeBefore(file)
	}
	// The floor record goes first: a recovery that finds the log cut
	// then knows which checkpoint it needs, and refuses one that lacks it.
	if err := db.logNow(floorRecord(cs)); err != nil {
		return st, fmt.Errorf("checkpoint: %w", err)
	}
	kept, err := db.truncateBefore(cs)
	if err != nil {
		return st, fmt.Errorf("truncating the log: %w", err)
	}
	db.chain.logFrom = max(db.chain.logFrom, kept)
	st.Duration = db.clock.Since(began)
	return st, nil
}

// writeCheckpoint writes checkpoint file to path: every record present, or
// for a delta every record whose TID is of an epoch ≥ file.base, present
// or deleted.
func (db *DB) writeCheckpoint(path string, file ckptFile) (CheckpointStats, error) {
	st := CheckpointStats{Start: file.cs, Base: file.base}
	f, err := db.fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return st, err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	// The catalog first, as of the walk's start: the walk covers the
	// tables it names (DDL holds the catalog's lock while it logs, so
	// every change of an epoch before Cs is in it).
	db.cat.mu.RLock()
	snap, err := json.Marshal(db.cat.snapshotLocked(db.cfg.Loggers))
	tables := db.cat.tablesLocked()
	db.cat.mu.RUnlock()
	if err != nil {
		return st, err
	}
	w := newCkptWriter(f)
	w.start(chunkCatalog)
	w.buf = append(w.buf, snap...)
	next := func(kind byte) error {
		n, err := w.next(kind)
		st.Bytes += int64(n)
		return err
	}
	if err := next(chunkData); err != nil {
		return st, err
	}
	// The walk goes ckptBatch records at a time, in stages (see touchRows).
	batch := make([]ckptRec, 0, ckptBatch)
	var recs []*record
	emit := func(t *table) error {
		for i := range batch {
			c := &batch[i]
			// A delta passes over a record its chain holds already: one
			// whose TID, locked or not, is older than the base (a commit
			// in progress is of an epoch ≥ Cs, and the log has it).
			if file.delta() && tidEpoch(c.r.tid.Load()) < file.base {
				continue
			}
			c.tid, c.rw = c.r.readStable()
			c.in = tidEpoch(c.tid) != 0 && (c.tid&tidAbsent == 0 || file.delta())
		}
		touchRows(batch)
		for i := range batch {
			c := &batch[i]
			if !c.in {
				continue
			}
			rw := c.rw
			if c.tid&tidAbsent != 0 {
				rw = nil // a tombstone
			}
			w.appendEntry(t.id, tidVersion(c.tid), c.p.pk, c.r.ck, rw)
			st.Rows++
			if w.chunkLen() >= ckptChunk {
				if err := next(chunkData); err != nil {
					return err
				}
			}
		}
		clear(batch)
		batch = batch[:0]
		return nil
	}
	for _, t := range tables {
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
	if err := next(chunkTrailer); err != nil {
		return st, err
	}
	st.End = db.epoch.Load()
	if file.delta() {
		w.buf = append(w.buf, deltaMagic...)
	} else {
		w.buf = append(w.buf, ckptMagic...)
	}
	w.buf = binary.AppendUvarint(w.buf, file.cs)
	w.buf = binary.AppendUvarint(w.buf, st.End)
	w.buf = binary.AppendUvarint(w.buf, uint64(st.Rows))
	if file.delta() {
		w.buf = binary.AppendUvarint(w.buf, file.base)
	}
	n, err := w.end()
	st.Bytes += int64(n)
	if err != nil {
		return st, err
	}
	if err := f.Sync(); err != nil {
		return st, err
	}
	err = f.Close()
	f = nil
	return st, err
}

// ckptWriter frames a checkpoint's chunks and writes them in whole blocks
// with direct I/O where the file takes it. Through the page cache, the
// kernel's copy of the chunks was about half of a checkpoint's CPU, and
// every checkpoint left its size in dirty pages behind.
//
// buf starts on a block boundary of the file: the unwritten end of the
// last block written (fewer than ckptBlock bytes), then the chunk being
// built, whose header is at hdr. Its array is block-aligned and never
// grows by append, which would lose the alignment.
type ckptWriter struct {
	f   vfs.File
	buf []byte
	hdr int
}

// ckptBlock is the unit of a checkpoint's direct writes: the page size,
// a multiple of every disk's logical block size.
const ckptBlock = 4096

func newCkptWriter(f vfs.File) *ckptWriter {
	vfsutil.SetDirect(f, true)
	return &ckptWriter{f: f, buf: alignedCkpt(ckptChunk + 64<<10)}
}

// alignedCkpt returns an empty buffer with room for n bytes, block-aligned.
func alignedCkpt(n int) []byte {
	return vfsutil.Aligned(n, ckptBlock)[:0]
}

// start begins a chunk of the given kind.
func (w *ckptWriter) start(kind byte) {
	w.hdr = len(w.buf)
	w.buf = append(w.buf, 0, 0, 0, 0, 0, 0, 0, 0, kind)
}

// chunkLen is the length of the chunk's payload so far.
func (w *ckptWriter) chunkLen() int { return len(w.buf) - w.hdr - 8 }

// appendEntry appends a record's entry: its TID and its write.
func (w *ckptWriter) appendEntry(table, tid uint64, pk, ck string, r *row) {
	bound := 8 + writeBound(pk, ck, r)
	if cap(w.buf)-len(w.buf) < bound {
		nb := alignedCkpt(max(len(w.buf)+bound, cap(w.buf)+cap(w.buf)/4))
		w.buf = nb[:copy(nb[:len(w.buf)], w.buf)]
	}
	n := len(w.buf)
	d := w.buf[n : n+bound]
	binary.LittleEndian.PutUint64(d, tid)
	w.buf = w.buf[:n+8+putWrite(d[8:], table, pk, ck, r)]
}

// next ends the chunk being built and begins one of the given kind; a
// chunk still empty only takes the new kind. It returns the framed size of
// the chunk it ended.
func (w *ckptWriter) next(kind byte) (int, error) {
	if w.chunkLen() == 1 {
		w.buf[w.hdr+8] = kind
		return 0, nil
	}
	n, err := w.finish()
	w.start(kind)
	return n, err
}

// end ends the last chunk and writes what is left of the file, part of a
// block, through the page cache. It returns the chunk's framed size.
func (w *ckptWriter) end() (int, error) {
	n, err := w.finish()
	if err != nil || len(w.buf) == 0 {
		return n, err
	}
	vfsutil.SetDirect(w.f, false)
	_, err = w.f.Write(w.buf)
	w.buf = w.buf[:0]
	return n, err
}

// finish frames the chunk and writes every whole block of buf, keeping the
// rest at its start. It returns the chunk's framed size.
func (w *ckptWriter) finish() (int, error) {
	payload := w.buf[w.hdr+8:]
	binary.LittleEndian.PutUint32(w.buf[w.hdr:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(w.buf[w.hdr+4:], crc32.Checksum(payload, crcTable))
	framed := len(w.buf) - w.hdr
	if n := len(w.buf) &^ (ckptBlock - 1); n > 0 {
		if _, err := w.f.Write(w.buf[:n]); err != nil {
			return framed, err
		}
		w.buf = w.buf[:copy(w.buf, w.buf[n:])]
	}
	w.hdr = len(w.buf)
	return framed, nil
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
	in  bool // written out: present, or a tombstone in a delta
}

// touchSink keeps touchRows's loads from being optimized away.
var touchSink atomic.Uintptr

// touchRows loads the first word of each row, a stage at a time. A row
// sits behind a pointer (record to row), a likely cache miss in a large
// database; encoding the rows one by one waited for every miss in turn,
// while the loads of a stage do not depend on each other, so the
// processor has the misses of a whole batch in flight at once, and the
// copying that follows finds the lines in cache (the hardware prefetcher
// follows a row's later lines).
func touchRows(batch []ckptRec) {
	var sum uintptr
	for i := range batch {
		if rw := batch[i].rw; rw != nil {
			sum += uintptr(rw.n)
		}
	}
	touchSink.Add(sum)
}

// removeBefore removes, once full checkpoint f is in place, the files no
// chain needs any more: older full checkpoints and deltas that do not
// start after f.
func (db *DB) removeBefore(f ckptFile) {
	names, _ := db.fs.List(db.cfg.Dir)
	for _, n := range names {
		if old, ok := parseCkptName(n); ok && (old.delta() && old.cs <= f.cs || !old.delta() && old.cs < f.cs) {
			db.fs.Remove(db.fs.PathJoin(db.cfg.Dir, n))
		}
	}
}

// findChain returns the chain recovery loads, the newest full checkpoint
// first and then each delta over the file before it, removing unfinished
// temporary files. Every delta that starts after the full checkpoint must
// be on the chain: one that is not follows a file that is missing, and
// the log it covers may be truncated already.
func (db *DB) findChain() ([]ckptFile, error) {
	names, err := db.fs.List(db.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var full ckptFile
	deltas := map[uint64]ckptFile{} // by base
	for _, n := range names {
		if (strings.HasPrefix(n, ckptPrefix) || strings.HasPrefix(n, deltaPrefix)) && strings.HasSuffix(n, ckptTmp) {
			db.fs.Remove(db.fs.PathJoin(db.cfg.Dir, n))
			continue
		}
		f, ok := parseCkptName(n)
		switch {
		case !ok:
		case !f.delta():
			full.cs = max(full.cs, f.cs)
		case deltas[f.base].cs != 0:
			return nil, &CorruptionError{File: n, Offset: -1, Err: fmt.Errorf("two deltas over the checkpoint of epoch %d", f.base)}
		default:
			deltas[f.base] = f
		}
	}
	if full.cs == 0 {
		for _, d := range deltas {
			return nil, &CorruptionError{File: d.name(), Offset: -1, Err: errors.New("a delta checkpoint without a full one")}
		}
		return nil, nil
	}
	chain := []ckptFile{full}
	for at := full.cs; ; {
		d, ok := deltas[at]
		if !ok {
			break
		}
		chain = append(chain, d)
		at = d.cs
	}
	for _, d := range deltas {
		if d.cs > full.cs && !slices.Contains(chain, d) {
			return nil, &CorruptionError{File: d.name(), Offset: -1, Err: fmt.Errorf("delta over the checkpoint of epoch %d, which is missing", d.base)}
		}
	}
	return chain, nil
}

// loadChain loads every file of chain and sets db.chain: the catalog of
// the newest file first (rows of tables it no longer has are skipped),
// then every file's rows. It returns the newest file's start, the latest
// end of any, and the logger count of the era the newest was taken in.
func (db *DB) loadChain(chain []ckptFile) (cs, ce uint64, loggers int, err error) {
	db.chain = ckptChain{}
	if len(chain) > 0 {
		snap, err := db.readCatalogChunk(chain[len(chain)-1])
		if err != nil {
			return 0, 0, 0, err
		}
		if err := db.cat.restore(snap); err != nil {
			return 0, 0, 0, &CorruptionError{File: chain[len(chain)-1].name(), Err: err}
		}
		loggers = snap.Loggers
	}
	for _, f := range chain {
		fcs, fce, rows, size, err := db.loadCheckpoint(f)
		if err != nil {
			return 0, 0, 0, err
		}
		db.cfg.Logf("engine: loaded %s: %d rows, epochs %d..%d", f.name(), rows, fcs, fce)
		cs, ce = fcs, max(ce, fce)
		db.chain.last = fcs
		if f.delta() {
			db.chain.deltaBytes += size
		} else {
			db.chain.fullBytes = size
		}
	}
	// Files a later full checkpoint made useless, if a crash came before
	// their removal.
	if len(chain) > 0 {
		db.removeBefore(chain[0])
	}
	return cs, ce, loggers, nil
}

// readCatalogChunk reads the catalog a checkpoint file begins with.
func (db *DB) readCatalogChunk(file ckptFile) (catalogSnapshot, error) {
	var snap catalogSnapshot
	name := file.name()
	f, err := db.fs.Open(db.fs.PathJoin(db.cfg.Dir, name))
	if err != nil {
		return snap, err
	}
	defer f.Close()
	payload, err := readChunk(f, name, 0)
	if err != nil {
		return snap, err
	}
	if err := decodeCatalogChunk(payload, &snap); err != nil {
		return snap, &CorruptionError{File: name, Offset: 0, Err: err}
	}
	return snap, nil
}

// decodeCatalogChunk decodes a catalog chunk's payload (its kind byte
// first) as untrusted input.
func decodeCatalogChunk(payload []byte, snap *catalogSnapshot) error {
	if len(payload) == 0 || payload[0] != chunkCatalog {
		return malformed("the file does not begin with its catalog (a checkpoint of an older format?)")
	}
	dec := json.NewDecoder(bytes.NewReader(payload[1:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(snap); err != nil {
		return malformed("catalog: %v", err)
	}
	if dec.More() {
		return malformed("catalog: data after it")
	}
	return nil
}

// readChunk reads and checks the chunk at the reader's position, off in
// the file, and returns its payload.
func readChunk(f io.Reader, name string, off int64) ([]byte, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return nil, &CorruptionError{File: name, Offset: off, Err: malformed("truncated chunk header (%v)", err)}
	}
	n := binary.LittleEndian.Uint32(hdr[0:4])
	if n == 0 || n > ckptMaxChunk {
		return nil, &CorruptionError{File: name, Offset: off, Err: malformed("chunk of %d bytes", n)}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(f, payload); err != nil {
		return nil, &CorruptionError{File: name, Offset: off, Err: malformed("truncated chunk (%v)", err)}
	}
	if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(hdr[4:8]) {
		return nil, &CorruptionError{File: name, Offset: off, Err: malformed("checksum mismatch")}
	}
	return payload, nil
}

// loadCheckpoint reads a checkpoint and applies its rows, decoding chunks
// on every core. It returns the trailer's epochs and row count, and the
// file's size.
func (db *DB) loadCheckpoint(file ckptFile) (cs, ce uint64, rows int, size int64, err error) {
	name := file.name()
	f, err := db.fs.Open(db.fs.PathJoin(db.cfg.Dir, name))
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer f.Close()
	corrupt := func(off int64, format string, args ...any) error {
		return &CorruptionError{File: name, Offset: off, Err: malformed(format, args...)}
	}
	var counted atomic.Int64
	p := startPool(runtime.GOMAXPROCS(0), func(off int64, payload []byte) error {
		n, err := db.applyEntries(payload[1:], 0, file.delta())
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
		switch kind := payload[0]; {
		case off == 0:
			var snap catalogSnapshot
			if derr := decodeCatalogChunk(payload, &snap); derr != nil {
				err = &CorruptionError{File: name, Offset: off, Err: derr}
			}
		case kind == chunkData:
			p.submit(off, payload)
		case kind == chunkTrailer:
			d := decoder{b: payload[1:]}
			magic := ckptMagic
			if file.delta() {
				magic = deltaMagic
			}
			if string(d.bytes(uint64(len(magic)), "magic")) != magic {
				err = corrupt(off, "bad trailer")
				break
			}
			cs, ce = d.uvarint("start epoch"), d.uvarint("end epoch")
			rows = int(d.uvarint("rows"))
			var base uint64
			if file.delta() {
				base = d.uvarint("base epoch")
			}
			if d.err != nil || len(d.b) != 0 || cs != file.cs || base != file.base || cs > ce || ce > MaxEpoch || rows < 0 {
				err = corrupt(off, "bad trailer")
			}
			trailer = true
		default:
			err = corrupt(off, "chunk kind %d", kind)
		}
		off += 8 + int64(n)
	}
	if perr := p.wait(); err == nil {
		err = perr
	}
	if err != nil {
		return 0, 0, 0, 0, err
	}
	if total := int(counted.Load()); total != rows {
		return 0, 0, 0, 0, corrupt(off, "trailer counts %d rows, chunks hold %d", rows, total)
	}
	return cs, ce, rows, off, nil
}

// applyEntries applies checkpoint entries (tid, write), keeping per key the
// highest TID. If epoch is non-zero every TID must be of that epoch.
// Deletes are taken only if deletes is set (a delta's tombstones).
func (db *DB) applyEntries(b []byte, epoch uint64, deletes bool) (int, error) {
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
		if w.del && !deletes {
			return n, malformed("a delete in a full checkpoint")
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
				r.row.Store(w.row)
			}
			r.tid.Store(tid | status)
			return nil
		}
		backoff(spins)
	}
}
