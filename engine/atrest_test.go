package engine_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/wal"
)

// Damage to a closed data directory that no crash can make must stop Open
// with a typed error that says what is wrong, never open as less data.

// chainOf writes rounds bursts of random rows, each followed by a
// checkpoint (full, then deltas), and closes the engine.
func chainOf(t *testing.T, rounds int) *chainDB {
	t.Helper()
	c := newChainDB(t, 1e9)
	for round := range rounds {
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		for i := range 60 {
			c.step(rng, round*100+i)
		}
		if _, err := c.db.Checkpoint(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	c.step(rand.New(rand.NewPCG(99, 7)), 999) // and some log after the last
	if err := c.db.Close(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *chainDB) newest(prefix string) string {
	names, _ := c.fs.List("/db")
	last := ""
	for _, n := range names {
		if strings.HasPrefix(n, prefix) && !strings.HasSuffix(n, ".tmp") && n > last {
			last = n
		}
	}
	return last
}

// TestNewestDeltaMissing: the logs were truncated for the newest delta;
// without it, the chain ends earlier than the logs begin, and replaying
// would serve the rows of the epochs between with holes. Open refuses with
// ErrLogGap, naming the epochs; with the file back, everything is there.
func TestNewestDeltaMissing(t *testing.T) {
	c := chainOf(t, 3)
	gone := c.newest("delta-")
	if gone == "" {
		t.Fatal("no delta checkpoint was written")
	}
	if err := c.fs.Rename("/db/"+gone, "/db/aside"); err != nil {
		t.Fatal(err)
	}
	db, err := engine.Open(c.cfg)
	if !errors.Is(err, engine.ErrLogGap) || !strings.Contains(err.Error(), "epochs") {
		if err == nil {
			db.Close()
		}
		t.Fatalf("without %s: Open returned %v, want ErrLogGap naming the epochs", gone, err)
	}
	t.Log(err)
	if err := c.fs.Rename("/db/aside", "/db/"+gone); err != nil {
		t.Fatal(err)
	}
	c.open()
	c.check("with the delta back")
	c.db.Close()
}

// TestOldLayoutRefused: a data directory of the older format (catalog.json
// and a log per logger) is refused with ErrOldLayout, not opened empty
// beside it.
func TestOldLayoutRefused(t *testing.T) {
	for _, name := range []string{"catalog.json", "log-0"} {
		fs := vfs.NewMem()
		if err := fs.MkdirAll("/db", 0o755); err != nil {
			t.Fatal(err)
		}
		if name == "log-0" {
			if err := fs.MkdirAll("/db/log-0", 0o755); err != nil {
				t.Fatal(err)
			}
		} else {
			writeFile(t, fs, "/db/"+name, []byte(`{"version":2}`))
		}
		db, err := engine.Open(engine.Config{Dir: "/db", FS: fs, CheckpointInterval: -1})
		if !errors.Is(err, engine.ErrOldLayout) {
			if err == nil {
				db.Close()
			}
			t.Fatalf("with %s: Open returned %v, want ErrOldLayout", name, err)
		}
	}
}

// TestCatalogInCheckpoints: the catalog is in the log and in every
// checkpoint. Opened from the checkpoints alone, the log removed, every
// table is there; a checkpoint damaged where its catalog is, is refused as
// corrupt.
func TestCatalogInCheckpoints(t *testing.T) {
	c := chainOf(t, 2)
	c.open()
	if _, err := c.db.Checkpoint(context.Background()); err != nil { // after the last write
		t.Fatal(err)
	}
	c.reopen(true)
	c.check("from the checkpoints alone")
	c.db.Close()
	name := "/db/" + c.newest("delta-")
	buf := readFile(t, c.fs, name)
	buf[20] ^= 0x40 // inside the first chunk: the catalog
	writeFile(t, c.fs, name, buf)
	db, err := engine.Open(c.cfg)
	var ce *engine.CorruptionError
	if !errors.As(err, &ce) || !strings.HasPrefix(name, "/db/"+ce.File) {
		if err == nil {
			db.Close()
		}
		t.Fatalf("Open with a damaged catalog: %v, want a CorruptionError of %s", err, name)
	}
}

// TestCheckpointDurableBeforeTruncation: at the moment a checkpoint
// truncates the log, a crash must find the checkpoint file, its directory
// entry and the raised log floor durable: the machine is "crashed" (only
// synced bytes kept) at the first removal or recycling of a log segment,
// and the copy must open with every row.
func TestCheckpointDurableBeforeTruncation(t *testing.T) {
	mem := vfs.NewCrashableMem()
	hook := &crashAtFS{FS: mem, mem: mem}
	c := &chainDB{t: t, fs: hook, want: map[string]string{}}
	c.cfg = newChainDB(t, 1e9).cfg
	c.cfg.FS = hook
	c.open()
	ctx := context.Background()
	for _, err := range []error{c.db.CreateNamespace(ctx, "b"), c.db.CreateTable(ctx, blobTable), c.db.CreateTable(ctx, versionsTable)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	var crashed *chainDB
	for round := 0; crashed == nil && round < 20; round++ {
		rng := rand.New(rand.NewPCG(uint64(round), 3))
		for i := range 80 {
			c.step(rng, round*100+i)
		}
		hook.arm()
		if _, err := c.db.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
		if clone := hook.taken(); clone != nil {
			crashed = &chainDB{t: t, fs: clone, cfg: c.cfg, want: c.want}
			crashed.cfg.FS = clone
		}
	}
	c.db.Close()
	if crashed == nil {
		t.Fatal("no checkpoint truncated the log")
	}
	crashed.open()
	crashed.check("after a crash as the log was truncated")
	crashed.db.Close()
}

// crashAtFS, once armed, takes a crash clone of mem (synced bytes and
// entries only) as soon as the removal or recycling of a log segment is
// durable: at the first directory sync after it.
type crashAtFS struct {
	vfs.FS
	mem     *vfs.MemFS
	mu      sync.Mutex
	armed   bool
	removed bool
	clone   *vfs.MemFS
}

func (f *crashAtFS) arm() { f.mu.Lock(); f.armed = true; f.mu.Unlock() }

func (f *crashAtFS) taken() *vfs.MemFS {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clone
}

func (f *crashAtFS) gone(name string) {
	if strings.Contains(name, "/log/") && strings.HasSuffix(name, ".wal") {
		f.mu.Lock()
		f.removed = f.removed || f.armed
		f.mu.Unlock()
	}
}

func (f *crashAtFS) Remove(name string) error {
	err := f.FS.Remove(name)
	f.gone(name)
	return err
}

func (f *crashAtFS) Rename(old, new string) error {
	err := f.FS.Rename(old, new)
	f.gone(old)
	return err
}

func (f *crashAtFS) OpenDir(name string) (vfs.File, error) {
	d, err := f.FS.OpenDir(name)
	if err != nil {
		return nil, err
	}
	return &crashAtDir{File: d, fs: f}, nil
}

type crashAtDir struct {
	vfs.File
	fs *crashAtFS
}

func (d *crashAtDir) Sync() error {
	err := d.File.Sync()
	f := d.fs
	f.mu.Lock()
	if f.removed && f.clone == nil {
		f.clone = f.mem.CrashClone(vfs.CrashCloneCfg{})
	}
	f.mu.Unlock()
	return err
}

// TestRecoveryReportsTornTail: a torn write at the end of a log is cut at
// Open and reported in Recovery, with where it was.
func TestRecoveryReportsTornTail(t *testing.T) {
	c := chainOf(t, 1)
	names, _ := c.fs.List("/db/log")
	last := ""
	for _, n := range names {
		if strings.HasSuffix(n, ".wal") && n > last {
			last = n
		}
	}
	buf := readFile(t, c.fs, "/db/log/"+last)
	end := len(bytes.TrimRight(buf, "\x00"))
	// Half a frame of a record never synced: garbage where the next
	// header goes.
	copy(buf[end:], []byte{0xde, 0xad, 0xbe, 0xef, 9, 9, 9, 9, 2, 1})
	writeFile(t, c.fs, "/db/log/"+last, buf)
	c.open()
	defer c.db.Close()
	c.check("after the torn tail was cut")
	rec := c.db.Recovery()
	if len(rec.TornTails) != 1 || rec.TornTails[0].Bytes != 10 || !strings.Contains(rec.TornTails[0].Detail, last) || !rec.Dropped() {
		t.Fatalf("recovery %+v; want one torn tail of 10 bytes in %s", rec, last)
	}
	if rec.Checkpoints != 1 || rec.Records == 0 {
		t.Fatalf("recovery %+v; want 1 checkpoint and records replayed", rec)
	}
}

func readFile(t *testing.T, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, fs vfs.FS, name string, b []byte) {
	t.Helper()
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// TestRecoveryReportsVoidRecords: records logged past the last durable
// mark (a commit whose epoch never became durable, never acknowledged)
// are counted in Recovery as void, and reported as dropped; a clean stop
// drops nothing.
func TestRecoveryReportsVoidRecords(t *testing.T) {
	c := chainOf(t, 1)
	c.open()
	if rec := c.db.Recovery(); rec.Dropped() || rec.VoidRecords != 0 {
		t.Fatalf("a clean stop dropped %+v", rec)
	}
	c.db.Close()
	l, err := wal.Open(wal.Config{Dir: "/db/log", FS: c.fs, SegmentSize: c.cfg.LogSegmentSize, Policy: wal.BatchPolicy()})
	if err != nil {
		t.Fatal(err)
	}
	rec := binary.AppendUvarint([]byte{3}, 1<<20) // a buffer of an epoch far past any mark
	if _, err := l.Append(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	defer c.db.Close()
	c.check("after void records")
	got := c.db.Recovery()
	if !got.Dropped() || got.VoidRecords != 1 || got.VoidBytes != int64(len(rec)) || got.VoidTo < 1<<20 {
		t.Fatalf("recovery %+v; want one void record of %d bytes", got, len(rec))
	}
}
