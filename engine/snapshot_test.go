package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// TestSnapshotInstall: a snapshot taken while writers run, installed on a
// fresh follower that then applies the leader's log from the snapshot's
// index on, gives the leader's state; the log before that index was
// truncated, so the snapshot is all the follower could have had of it.
func TestSnapshotInstall(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	rec := &recordSink{next: 1}
	cfg := Config{Dir: "/leader", FS: fs, Loggers: 2, Workers: 8, EpochInterval: time.Millisecond, CheckpointInterval: -1,
		LogBufferSize: 4 << 10, LogSegmentSize: 64 << 10, OpenSink: func(fs vfs.FS, dir string) (LogSink, error) {
			s, err := openWALSink(fs, dir, 64<<10, 4)
			rec.LogSink = s
			return rec, err
		}}
	leader, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	for _, err := range []error{leader.CreateNamespace(ctx, "f"), leader.CreateTable(ctx, followFlat), leader.CreateTable(ctx, followClustered)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	write := func(round int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for i := range 100 {
					if err := followWrite(ctx, leader, r, round*1000+w*100+i); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	write(0)
	if _, err := leader.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	var meta SnapshotMeta
	var wg sync.WaitGroup
	wg.Go(func() { write(1) })
	wg.Go(func() {
		time.Sleep(5 * time.Millisecond)
		var err error
		if meta, err = leader.Snapshot(ctx, &snap); err != nil {
			t.Error(err)
		}
	})
	wg.Wait()
	write(2)
	if t.Failed() {
		t.FailNow()
	}
	if meta.Index == 0 || meta.Files < 1 {
		t.Fatalf("snapshot %+v: no log truncated for it", meta)
	}
	ld := leader.DurableEpoch() // (its idle rounds go on marking later epochs)
	rec.mu.Lock()
	log := rec.recs
	rec.mu.Unlock()

	f, err := Open(Config{Dir: "/follower", FS: fs, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	good := snap.Bytes()
	// Damaged or short streams are refused, and leave the follower fresh.
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 24 {
		bad := bytes.Clone(good)
		what := ""
		switch {
		case i < 16:
			at := rng.IntN(len(bad))
			if i < 4 {
				at = i * 3 // the magic and the header
			}
			bad[at] ^= 1 << rng.IntN(8)
			what = fmt.Sprint("a bit flipped at ", at)
		case i < 22:
			bad = bad[:rng.IntN(len(bad))]
			what = fmt.Sprint("cut at ", len(bad))
		default:
			bad = append(bad, 0)
			what = "a byte appended"
		}
		_, err := f.Install(bytes.NewReader(bad))
		var ce *CorruptionError
		if !errors.Is(err, ErrBadSnapshot) && !errors.As(err, &ce) {
			t.Fatalf("%s: %v, want ErrBadSnapshot", what, err)
		}
		if names, _ := fs.List("/follower"); len(names) != 1 || len(f.cat.tables()) != 0 {
			t.Fatalf("%s: the follower holds %v and %d tables", what, names, len(f.cat.tables()))
		}
	}
	got, err := f.Install(bytes.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if got.Index != meta.Index || got.Start != meta.Start || got.End < got.Start-1 {
		t.Fatalf("installed %+v, sent %+v", got, meta)
	}
	if _, err := f.Install(bytes.NewReader(good)); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("a second install: %v, want ErrInvalidArgument", err)
	}
	for i := meta.Index; i < uint64(len(log)); i++ {
		if err := f.Apply(i+1, log[i]); err != nil {
			t.Fatalf("record %d: %v", i+1, err)
		}
	}
	if fd := f.DurableEpoch(); fd < ld {
		t.Fatalf("the follower's durable epoch %d is behind the leader's %d", fd, ld)
	}
	sameState(t, "installed", leader, f)
	if _, err := f.Snapshot(ctx, &bytes.Buffer{}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("a snapshot of a follower: %v, want ErrInvalidArgument", err)
	}
}

// FuzzInstall reads arbitrary bytes as a snapshot into a fresh follower:
// it is installed, or refused with ErrBadSnapshot or a CorruptionError,
// and a refused one leaves the follower's directory as it was.
func FuzzInstall(f *testing.F) {
	ctx := context.Background()
	leader, err := Open(Config{Dir: "/l", FS: vfs.NewMem(), CheckpointInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	for _, err := range []error{leader.CreateNamespace(ctx, "f"), leader.CreateTable(ctx, followFlat)} {
		if err != nil {
			f.Fatal(err)
		}
	}
	for k := range 20 {
		if err := leader.Put(ctx, &storage.Put{Namespace: "f", Table: "flat", Partition: storage.Values{"k": storage.BigInt(int64(k))},
			Values: storage.Values{"v": storage.Text(fmt.Sprint(k))}}); err != nil {
			f.Fatal(err)
		}
	}
	var snap bytes.Buffer
	if _, err := leader.Snapshot(ctx, &snap); err != nil {
		f.Fatal(err)
	}
	leader.Close()
	good := snap.Bytes()
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add(good[:len(snapMagic)+3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		fs := vfs.NewMem()
		db, err := Open(Config{Dir: "/f", FS: fs, Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		_, err = db.Install(bytes.NewReader(bytes.Clone(b)))
		var corrupt *CorruptionError
		switch {
		case err == nil:
		case errors.Is(err, ErrBadSnapshot):
			if names, _ := fs.List("/f"); len(names) != 1 {
				t.Fatalf("refused (%v), but the directory holds %v", err, names)
			}
		case errors.As(err, &corrupt):
		default:
			t.Fatalf("untyped error %v", err)
		}
	})
}

// TestSnapshotReinstall: CheckSnapshot accepts a snapshot and refuses a
// damaged one without writing anything; Install replaces the checkpoints
// an earlier run left in the follower's directory; and a follower opened
// again on a directory holding a chain — installed, or its own from when
// it led — reloads it (Reinstall) and, with the log after the index, has
// the leader's state.
func TestSnapshotReinstall(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	rec := &recordSink{next: 1}
	cfg := Config{Dir: "/leader", FS: fs, Loggers: 2, Workers: 4, EpochInterval: time.Millisecond, CheckpointInterval: -1,
		LogBufferSize: 4 << 10, LogSegmentSize: 64 << 10, OpenSink: func(fs vfs.FS, dir string) (LogSink, error) {
			s, err := openWALSink(fs, dir, 64<<10, 4)
			rec.LogSink = s
			return rec, err
		}}
	leader, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	for _, err := range []error{leader.CreateNamespace(ctx, "f"), leader.CreateTable(ctx, followFlat), leader.CreateTable(ctx, followClustered)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(7, 7))
	write := func(n int) {
		for i := range n {
			if err := followWrite(ctx, leader, r, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(200)
	if _, err := leader.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	write(200)
	var snap bytes.Buffer
	meta, err := leader.Snapshot(ctx, &snap)
	if err != nil {
		t.Fatal(err)
	}
	write(200)
	if meta.Index == 0 {
		t.Fatalf("snapshot %+v: no log truncated for it", meta)
	}
	good := snap.Bytes()

	// CheckSnapshot reads what Install would, and writes nothing.
	if got, err := CheckSnapshot(bytes.NewReader(good)); err != nil || got.Index != meta.Index || got.Start != meta.Start || got.Files != meta.Files {
		t.Fatalf("CheckSnapshot: %+v, %v; want %+v", got, err, meta)
	}
	for _, bad := range [][]byte{good[:len(good)-1], append(bytes.Clone(good), 0), func() []byte {
		b := bytes.Clone(good)
		b[len(b)/2] ^= 0x10
		return b
	}()} {
		if _, err := CheckSnapshot(bytes.NewReader(bad)); !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("CheckSnapshot of a damaged stream: %v, want ErrBadSnapshot", err)
		}
	}

	// A follower directory with the checkpoints of an earlier run: Install
	// replaces them.
	stale := ckptFile{cs: meta.Start + 1000}.name()
	if err := fs.MkdirAll("/follower", 0o755); err != nil {
		t.Fatal(err)
	}
	if f, err := fs.Create("/follower/"+stale, vfs.WriteCategoryUnspecified); err != nil {
		t.Fatal(err)
	} else {
		f.Write([]byte("an older run's checkpoint"))
		f.Close()
	}
	rec.mu.Lock()
	log := rec.recs
	rec.mu.Unlock()
	applyFrom := func(db *DB, from uint64) {
		t.Helper()
		for i := from; i < uint64(len(log)); i++ {
			if err := db.Apply(i+1, log[i]); err != nil {
				t.Fatalf("record %d: %v", i+1, err)
			}
		}
	}
	f, err := Open(Config{Dir: "/follower", FS: fs, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Install(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat("/follower/" + stale); err == nil {
		t.Fatalf("%s is still there after Install", stale)
	}
	applyFrom(f, meta.Index)
	sameState(t, "installed", leader, f)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened, the follower reloads the chain it installed.
	f, err = Open(Config{Dir: "/follower", FS: fs, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Reinstall(meta.Index)
	if err != nil {
		t.Fatal(err)
	}
	if got.Index != meta.Index || got.Start != meta.Start || got.Files != meta.Files || got.Bytes != meta.Bytes {
		t.Fatalf("reinstalled %+v, installed %+v", got, meta)
	}
	if _, err := f.Reinstall(meta.Index); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("a second reinstall: %v, want ErrInvalidArgument", err)
	}
	applyFrom(f, meta.Index)
	sameState(t, "reinstalled", leader, f)
	f.Close()

	// A follower opened on the leader's own directory reloads the chain
	// it wrote as leader.
	want, wantRows := dump(leader)
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	own, err := Open(Config{Dir: "/leader", FS: fs, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if _, err := own.Reinstall(meta.Index); err != nil {
		t.Fatal(err)
	}
	applyFrom(own, meta.Index)
	if s, rows := dump(own); !maps.Equal(s, want) || !maps.Equal(rows, wantRows) {
		t.Fatalf("the leader's own chain and log: %d rows, want %d", len(rows), len(wantRows))
	}

	// No checkpoints: the log's compaction cannot be made good.
	empty, err := Open(Config{Dir: "/empty", FS: fs, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if _, err := empty.Reinstall(5); !errors.Is(err, ErrLogGap) {
		t.Fatalf("Reinstall without checkpoints: %v, want ErrLogGap", err)
	}
}
