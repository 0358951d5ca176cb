package engine

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage"
)

// A snapshot is a leader's checkpoint chain in one stream, for a replica
// that is behind the log the leader kept (FORMAT.md, "Snapshots"):
//
//	snapshot = magic header file* crc
//	magic    = "KRKSNAP1"
//	header   = uvarint(index) uvarint(start) uvarint(files)
//	file     = uvarint(len(name)) name uvarint(size) bytes(size)
//	crc      = CRC-32C (Castagnoli) of everything before it, 4 bytes LE
//
// The files are the checkpoints recovery would load (the newest full one
// and the deltas after it), byte for byte; each checks its own chunks too.
const snapMagic = "KRKSNAP1"

// Bounds on what a snapshot may declare, checked before anything is
// allocated or written.
const (
	maxSnapFiles = 1024
	maxSnapName  = 255
)

// ErrBadSnapshot is the cause Install reports for a stream that is not a
// whole, intact snapshot: a wrong magic, an impossible header, a file
// name that is not a checkpoint's, a short stream or a checksum mismatch.
var ErrBadSnapshot = errors.New("engine: bad snapshot")

// SnapshotMeta describes a snapshot.
type SnapshotMeta struct {
	// Index is the last log index the snapshot stands for: a replica that
	// installs it applies the log from Index+1. 0 means from the first
	// record the log keeps.
	Index uint64
	// Start is the epoch its newest checkpoint started at (Cs); End, set
	// by Install, the latest end of its files (Ce): the follower's durable
	// epoch once installed.
	Start, End uint64
	Files      int
	Bytes      int64 // the checkpoint files' bytes
}

// Snapshot writes a snapshot of a leading engine to w: it writes a
// checkpoint (which truncates the log it covers), then streams the
// checkpoint chain. A replica installs it (Install) and applies the log
// from the returned Index+1. Writers go on meanwhile.
func (db *DB) Snapshot(ctx context.Context, w io.Writer) (SnapshotMeta, error) {
	if db.following.Load() {
		return SnapshotMeta{}, &storage.Error{Kind: storage.ErrInvalidArgument, Op: "snapshot", Detail: "a follower has no checkpoints of its own"}
	}
	if _, err := db.Checkpoint(ctx); err != nil {
		return SnapshotMeta{}, err
	}
	// The files are opened under the checkpoint lock, which keeps the
	// chain from changing, and read after it: an open file outlives its
	// removal by a later checkpoint.
	db.ckptMu.Lock()
	chain, err := db.findChain()
	var meta SnapshotMeta
	var files []vfs.File
	if err == nil && len(chain) == 0 {
		err = errors.New("engine: no checkpoint to snapshot")
	}
	if err == nil {
		meta.Index = max(db.chain.logFrom, 1) - 1
		for _, f := range chain {
			meta.Start = max(meta.Start, f.cs)
			var fh vfs.File
			if fh, err = db.fs.Open(db.fs.PathJoin(db.cfg.Dir, f.name())); err != nil {
				break
			}
			files = append(files, fh)
		}
	}
	db.ckptMu.Unlock()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("engine: snapshot: %w", err)
	}
	crc := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 256<<10)
	meta.Files = len(chain)
	hdr := []byte(snapMagic)
	for _, v := range []uint64{meta.Index, meta.Start, uint64(len(chain))} {
		hdr = binary.AppendUvarint(hdr, v)
	}
	bw.Write(hdr)
	for i, f := range chain {
		st, err := files[i].Stat()
		if err != nil {
			return meta, fmt.Errorf("engine: snapshot: %w", err)
		}
		name := f.name()
		var fh []byte
		fh = binary.AppendUvarint(fh, uint64(len(name)))
		fh = append(fh, name...)
		fh = binary.AppendUvarint(fh, uint64(st.Size()))
		bw.Write(fh)
		n, err := io.Copy(bw, io.NewSectionReader(files[i], 0, st.Size()))
		if err == nil && n != st.Size() {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return meta, fmt.Errorf("engine: snapshot of %s: %w", name, err)
		}
		meta.Bytes += n
		if err := ctx.Err(); err != nil {
			return meta, err
		}
	}
	if err := bw.Flush(); err != nil {
		return meta, fmt.Errorf("engine: snapshot: %w", err)
	}
	if _, err := w.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32())); err != nil {
		return meta, fmt.Errorf("engine: snapshot: %w", err)
	}
	return meta, nil
}

// Install loads a snapshot (Snapshot) into a follower (Config.Follow) that
// has applied nothing yet, and returns what it holds: the follower then
// applies the leader's log from meta.Index+1 (DB.Apply). The stream is
// read whole and its checksum checked before anything is loaded; a
// stream that fails is ErrBadSnapshot (or a CorruptionError of a file),
// and leaves the follower as it was. Checkpoint files already in the
// follower's directory — of an earlier run: a follower does not load
// them — are replaced by the snapshot's once it is verified. A failure
// while loading verified files fails the follower.
func (db *DB) Install(r io.Reader) (SnapshotMeta, error) {
	if err := db.usable("install"); err != nil {
		return SnapshotMeta{}, err
	}
	db.followMu.Lock()
	defer db.followMu.Unlock()
	if err := db.checkFresh("install"); err != nil {
		return SnapshotMeta{}, err
	}
	meta, names, err := readSnapshot(r, func(name string, size int64, sr io.Reader) error {
		return db.receiveFile(sr, name, size)
	})
	if err != nil {
		for _, n := range names {
			db.fs.Remove(db.fs.PathJoin(db.cfg.Dir, n+ckptTmp))
		}
		return SnapshotMeta{}, err
	}
	fail := func(err error) (SnapshotMeta, error) {
		db.fail(fmt.Errorf("installing a snapshot: %w", err))
		return SnapshotMeta{}, err
	}
	for _, n := range names {
		p := db.fs.PathJoin(db.cfg.Dir, n)
		if err := db.fs.Rename(p+ckptTmp, p); err != nil {
			return fail(err)
		}
	}
	// The checkpoints of an earlier run go: only the snapshot's make a
	// chain now. (A crash before this point leaves both; the owner
	// installs the snapshot again, which removes them then.)
	if err := db.removeCheckpointsBut(names); err != nil {
		return fail(err)
	}
	if err := vfsutil.SyncDir(db.fs, db.cfg.Dir); err != nil {
		return fail(err)
	}
	chain, err := db.findChain()
	if err != nil {
		return fail(err)
	}
	got, err := db.startFromChain(chain, meta.Index)
	if err != nil {
		return fail(err)
	}
	if got.Start != meta.Start || got.Files != meta.Files {
		return fail(fmt.Errorf("%w: it declares a chain to epoch %d in %d files, its files make one to %d in %d", ErrBadSnapshot,
			meta.Start, meta.Files, got.Start, got.Files))
	}
	return got, nil
}

// Reinstall loads the checkpoint chain a follower's own directory holds —
// the one it wrote while it led (Checkpoint truncated the log for it), or
// one it installed (Install) — into a follower that has applied nothing,
// as Install loads a snapshot: the follower then applies the log from
// index+1. A replica whose log was compacted for those checkpoints
// reopens so. The log from index+1 must hold every record the chain does
// not; it may hold more (records the chain covers change nothing). A
// directory without checkpoints is ErrLogGap; a chain that does not load
// is a CorruptionError, and fails the follower.
func (db *DB) Reinstall(index uint64) (SnapshotMeta, error) {
	if err := db.usable("reinstall"); err != nil {
		return SnapshotMeta{}, err
	}
	db.followMu.Lock()
	defer db.followMu.Unlock()
	if err := db.checkFresh("reinstall"); err != nil {
		return SnapshotMeta{}, err
	}
	chain, err := db.findChain()
	if err != nil {
		return SnapshotMeta{}, err
	}
	if len(chain) == 0 {
		return SnapshotMeta{}, fmt.Errorf("%w: the log was compacted to index %d for checkpoints, but %s holds none", ErrLogGap, index, db.cfg.Dir)
	}
	meta, err := db.startFromChain(chain, index)
	if err != nil {
		db.fail(fmt.Errorf("reinstalling the checkpoints: %w", err))
		return SnapshotMeta{}, err
	}
	return meta, nil
}

// checkFresh refuses a snapshot for an engine that is not a follower, or
// one that has applied something already. Called with followMu held.
func (db *DB) checkFresh(op string) error {
	if !db.following.Load() || db.follower.last != 0 || len(db.cat.tables()) > 0 {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: op, Detail: "a snapshot goes to a follower that has applied nothing"}
	}
	return nil
}

// startFromChain loads chain and readies the follower to apply the log
// from index+1. Called with followMu held.
func (db *DB) startFromChain(chain []ckptFile, index uint64) (SnapshotMeta, error) {
	cs, ce, loggers, err := db.loadChain(chain)
	if err != nil {
		return SnapshotMeta{}, err
	}
	meta := SnapshotMeta{Index: index, Start: cs, End: ce, Files: len(chain), Bytes: db.chain.fullBytes + db.chain.deltaBytes}
	ia := &inlineApply{db: db}
	sm := newStateMachine(db, cs, ce, loggers, ia.apply, ia.barrier)
	sm.last = index
	db.follower, db.followApply = sm, ia
	db.resetEpochs(ce+1, ce)
	return meta, nil
}

// removeCheckpointsBut removes every checkpoint file in the data
// directory but those named keep.
func (db *DB) removeCheckpointsBut(keep []string) error {
	names, err := db.fs.List(db.cfg.Dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, ok := parseCkptName(n); ok && !slices.Contains(keep, n) {
			if err := db.fs.Remove(db.fs.PathJoin(db.cfg.Dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckSnapshot reads a snapshot stream (DB.Snapshot) to its end and
// checks it as Install does before it writes anything: the magic, the
// header, the files' names and sizes, the checksum, and that nothing
// follows it. A stream that fails is ErrBadSnapshot. It does not decode
// the checkpoint files inside, whose own chunk checksums Install checks
// when it loads them. A replica uses it to refuse a damaged stream on
// receipt, before it keeps it.
func CheckSnapshot(r io.Reader) (SnapshotMeta, error) {
	meta, _, err := readSnapshot(r, func(_ string, size int64, sr io.Reader) error {
		_, err := io.CopyN(io.Discard, sr, size)
		return err
	})
	return meta, err
}

// readSnapshot reads a snapshot stream and checks it, handing each file's
// bytes to file (which must read exactly size bytes of sr). It returns
// the names of the files handed over, also on error (for removal).
func readSnapshot(r io.Reader, file func(name string, size int64, sr io.Reader) error) (meta SnapshotMeta, names []string, err error) {
	crc := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	sr := &snapReader{r: bufio.NewReaderSize(r, 256<<10), crc: crc}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w at byte %d: %s", ErrBadSnapshot, sr.n, fmt.Sprintf(format, args...))
	}
	magic := make([]byte, len(snapMagic))
	if err := sr.full(magic); err != nil || string(magic) != snapMagic {
		return meta, nil, bad("not a kiroku snapshot")
	}
	var hdr [3]uint64
	for i := range hdr {
		if hdr[i], err = sr.uvarint(); err != nil {
			return meta, nil, bad("header: %v", err)
		}
	}
	meta = SnapshotMeta{Index: hdr[0], Start: hdr[1]}
	if hdr[2] == 0 || hdr[2] > maxSnapFiles || meta.Start == 0 {
		return meta, nil, bad("header: %d files, the newest from epoch %d", hdr[2], meta.Start)
	}
	meta.Files = int(hdr[2])
	for range meta.Files {
		n, err := sr.uvarint()
		if err != nil || n == 0 || n > maxSnapName {
			return meta, names, bad("file name of %d bytes (%v)", n, err)
		}
		nb := make([]byte, n)
		if err := sr.full(nb); err != nil {
			return meta, names, bad("file name: %v", err)
		}
		name := string(nb)
		if _, ok := parseCkptName(name); !ok || strings.ContainsAny(name, "/\\") {
			return meta, names, bad("%q is not a checkpoint's name", name)
		}
		for _, seen := range names {
			if seen == name {
				return meta, names, bad("%s twice", name)
			}
		}
		size, err := sr.uvarint()
		if err != nil || size > 1<<40 {
			return meta, names, bad("size of %s: %d (%v)", name, size, err)
		}
		names = append(names, name)
		if err := file(name, int64(size), sr); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return meta, names, bad("%s cut short", name)
			}
			return meta, names, err
		}
		meta.Bytes += int64(size)
	}
	sum := crc.Sum32()
	var tail [4]byte
	if _, err := io.ReadFull(sr.r, tail[:]); err != nil {
		return meta, names, bad("no checksum")
	}
	if got := binary.LittleEndian.Uint32(tail[:]); got != sum {
		return meta, names, bad("checksum %08x, computed %08x", got, sum)
	}
	if _, err := sr.r.ReadByte(); err != io.EOF {
		return meta, names, bad("bytes after the checksum")
	}
	return meta, names, nil
}

// receiveFile copies size bytes of sr to name+ckptTmp in the data
// directory and syncs it.
func (db *DB) receiveFile(sr io.Reader, name string, size int64) error {
	f, err := db.fs.Create(db.fs.PathJoin(db.cfg.Dir, name+ckptTmp), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(f, sr, size); err != nil {
		return err
	}
	return f.Sync()
}

// snapReader reads a snapshot stream, hashing and counting what it reads.
type snapReader struct {
	r   *bufio.Reader
	crc hash.Hash32
	n   int64
}

func (s *snapReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.crc.Write(p[:n])
	s.n += int64(n)
	return n, err
}

func (s *snapReader) full(p []byte) error {
	_, err := io.ReadFull(s, p)
	return err
}

func (s *snapReader) uvarint() (uint64, error) {
	return binary.ReadUvarint(byteReader{s})
}

// byteReader reads one byte at a time through a snapReader, so that the
// bytes of a uvarint are hashed and counted too.
type byteReader struct{ s *snapReader }

func (b byteReader) ReadByte() (byte, error) {
	var one [1]byte
	if _, err := io.ReadFull(b.s, one[:]); err != nil {
		return 0, err
	}
	return one[0], nil
}
