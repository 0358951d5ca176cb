package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

var errInjected = errors.New("injected fdatasync failure")

// TestSyncFailureIsFatal fails one fdatasync and checks that every pending
// and later caller gets the error and that nothing is retried.
func TestSyncFailureIsFatal(t *testing.T) {
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			var armed atomic.Bool
			var syncsAfter atomic.Int64
			fs := errorfs.Wrap(vfs.NewCrashableMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
				if op.Kind == errorfs.OpFileSyncData && armed.Load() {
					syncsAfter.Add(1)
					return errInjected
				}
				return nil
			}))
			l := mustOpen(t, testConfig(fs, p))
			ctx := context.Background()
			for i := range 5 {
				if _, err := l.Append(ctx, payload(0, i)); err != nil {
					t.Fatal(err)
				}
			}
			armed.Store(true)
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for w := range 8 {
				wg.Add(1)
				go func() { defer wg.Done(); _, err := l.Append(ctx, payload(w, 100)); errs <- err }()
			}
			if p.Kind == Periodic {
				// Acknowledged on write; the failure shows at the next fsync.
				wg.Wait()
				if err := l.Sync(ctx); !errors.Is(err, ErrFailed) || !errors.Is(err, errInjected) {
					t.Fatalf("Sync: %v", err)
				}
			} else {
				wg.Wait()
				close(errs)
				for err := range errs {
					if !errors.Is(err, ErrFailed) || !errors.Is(err, errInjected) {
						t.Fatalf("pending append: %v, want ErrFailed wrapping the injected error", err)
					}
				}
			}
			if _, err := l.Append(ctx, []byte("later")); !errors.Is(err, ErrFailed) {
				t.Fatalf("later append: %v", err)
			}
			if err := l.Sync(ctx); !errors.Is(err, ErrFailed) {
				t.Fatalf("later Sync: %v", err)
			}
			if err := l.TruncateAfter(ctx, 1); !errors.Is(err, ErrFailed) {
				t.Fatalf("truncate after failure: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
			if n := syncsAfter.Load(); n != 1 {
				t.Fatalf("%d fdatasync calls after the failure; want exactly the one that failed", n)
			}
			if err := l.Close(); !errors.Is(err, ErrFailed) {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

// writeLog makes a closed log of n records in a fresh FS.
func writeLog(t *testing.T, n int) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewCrashableMem()
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	for i := 1; i <= n; i++ {
		if _, err := l.Append(context.Background(), payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return fs
}

// locate returns the segment file and offset of record index.
func locate(t *testing.T, fs vfs.FS, index uint64) (string, int64, int) {
	t.Helper()
	firsts, err := listSegments(fs, "/wal", false)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(firsts) - 1; i >= 0; i-- {
		if firsts[i] > index {
			continue
		}
		name := segName(firsts[i])
		buf, err := readSegment(fs, "/wal/"+name)
		if err != nil {
			t.Fatal(err)
		}
		var at, size int
		_, err = walkFrames(buf, name, firsts[i], index, func(idx uint64, p []byte, off int) error {
			at, size = off, frameSize(len(p))
			return nil
		})
		if err != nil {
			t.Fatalf("record %d not found: %v", index, err)
		}
		return name, int64(at), size
	}
	t.Fatalf("no segment holds %d", index)
	return "", 0, 0
}

func writeAt(t *testing.T, fs vfs.FS, name string, off int64, b []byte) {
	t.Helper()
	f, err := fs.OpenReadWrite("/wal/"+name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func flip(t *testing.T, fs vfs.FS, name string, off int64) {
	t.Helper()
	buf, err := readSegment(fs, "/wal/"+name)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, fs, name, off, []byte{buf[off] ^ 0x10})
}

func TestTornTail(t *testing.T) {
	const n = 200
	torn := map[string]func(fs vfs.FS, name string, end int64){
		"half a frame": func(fs vfs.FS, name string, end int64) {
			f := appendFrame(nil, n+1, n, payload(9, 9))
			writeAt(t, fs, name, end, f[:len(f)/2])
		},
		"header only": func(fs vfs.FS, name string, end int64) {
			writeAt(t, fs, name, end, appendFrame(nil, n+1, n, payload(9, 9))[:headerSize])
		},
		"garbage": func(fs vfs.FS, name string, end int64) {
			writeAt(t, fs, name, end, []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3})
		},
		"a later page without the earlier one": func(fs vfs.FS, name string, end int64) {
			// Frames n+1.. were being written; only a later block reached the
			// disk: a gap of zeros, then frame n+2 intact.
			writeAt(t, fs, name, end+500, appendFrame(nil, n+2, n, payload(9, 9)))
		},
	}
	for what, tear := range torn {
		t.Run(what, func(t *testing.T) {
			fs := writeLog(t, n)
			name, off, size := locate(t, fs, n)
			tear(fs, name, off+int64(size))
			l := mustOpen(t, testConfig(fs, BatchPolicy()))
			rec := l.Recovery()
			if rec.TornTail == nil || rec.TornTail.Segment != name || rec.TornTail.Offset != off+int64(size) || rec.LastIndex != n {
				t.Fatalf("recovery %+v, torn %+v; want a torn tail in %s at %d", rec, rec.TornTail, name, off+int64(size))
			}
			if idx, err := l.Append(context.Background(), []byte("next")); err != nil || idx != n+1 {
				t.Fatalf("append after repair: %d, %v", idx, err)
			}
			l.Close()
			l = mustOpen(t, testConfig(fs, BatchPolicy()))
			defer l.Close()
			all := readAll(t, l)
			if l.Recovery().TornTail != nil || len(all) != n+1 || string(all[n+1]) != "next" || !bytes.Equal(all[n], payload(0, n)) {
				t.Fatalf("second open: torn %+v, %d records", l.Recovery().TornTail, len(all))
			}
		})
	}
}

func TestCorruptionIsAnError(t *testing.T) {
	const n = 200
	cases := []struct {
		name   string
		index  uint64
		offset int // into the frame
	}{
		{"payload bit, sealed segment", 10, headerSize + 3},
		{"crc bit, sealed segment", 30, 1},
		{"payload bit, last segment", n - 5, headerSize + 1},
		{"length bit, last segment", n - 3, 5},
		{"index bit, last segment", n - 2, 10},
		{"type byte, last segment", n - 4, 8},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := writeLog(t, n)
			name, off, _ := locate(t, fs, c.index)
			flip(t, fs, name, off+int64(c.offset))
			before, _ := readSegment(fs, "/wal/"+name)
			_, err := Open(testConfig(fs, BatchPolicy()))
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Segment != name || ce.Offset != off || ce.Index != c.index {
				t.Fatalf("Open: %v; want a CorruptionError for record %d in %s at %d", err, c.index, name, off)
			}
			after, _ := readSegment(fs, "/wal/"+name)
			if !bytes.Equal(before, after) {
				t.Fatal("a failed Open changed the segment")
			}
		})
	}
	// A flipped bit in the very last record cannot be told from a torn
	// write: it is dropped and reported as a torn tail.
	fs := writeLog(t, n)
	name, off, _ := locate(t, fs, n)
	flip(t, fs, name, off+headerSize)
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	defer l.Close()
	if tt := l.Recovery().TornTail; tt == nil || l.LastIndex() != n-1 {
		t.Fatalf("last record corrupt: torn %+v, last %d", tt, l.LastIndex())
	}
}

// TestDamagedSyncedTail: damage to the last segment that no crash can
// make — a zeroed block followed by records written after it was synced,
// a file cut short mid-record or at a record's end — is corruption: Open
// refuses, names the segment and offset, and changes nothing, rather
// than drop acknowledged records as a torn tail.
func TestDamagedSyncedTail(t *testing.T) {
	const n = 220 // the last segment holds records 183..220, to offset 6923
	cases := []struct {
		name   string
		damage func(fs vfs.FS, name string, buf []byte)
		index  uint64 // the record Open must name
		offset int64
	}{
		{"first 4 KiB zeroed", func(fs vfs.FS, name string, buf []byte) {
			writeAt(t, fs, name, 0, make([]byte, 4096))
		}, 183, 0},
		{"one synced record zeroed", func(fs vfs.FS, name string, buf []byte) {
			_, off, size := locate(t, fs, 200)
			writeAt(t, fs, name, off, make([]byte, size))
		}, 200, -1},
		{"cut mid-record", func(fs vfs.FS, name string, buf []byte) {
			_, off, _ := locate(t, fs, 210)
			rewrite(t, fs, name, buf[:off+30])
		}, 210, -1},
		{"cut at a record's end", func(fs vfs.FS, name string, buf []byte) {
			_, off, _ := locate(t, fs, 215)
			rewrite(t, fs, name, buf[:off])
		}, 215, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := writeLog(t, n)
			name, _, _ := locate(t, fs, n)
			if name != segName(183) {
				t.Fatalf("setup: the last segment is %s", name)
			}
			want := c.offset
			if want < 0 {
				_, want, _ = locate(t, fs, c.index)
			}
			buf, _ := readSegment(fs, "/wal/"+name)
			c.damage(fs, name, buf)
			before, _ := readSegment(fs, "/wal/"+name)
			_, err := Open(testConfig(fs, BatchPolicy()))
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Segment != name || ce.Index != c.index || (ce.Offset != want && ce.Offset != int64(len(before))) {
				t.Fatalf("Open: %v; want a CorruptionError for record %d in %s at %d", err, c.index, name, want)
			}
			if after, _ := readSegment(fs, "/wal/"+name); !bytes.Equal(before, after) {
				t.Fatal("a failed Open changed the segment")
			}
		})
	}
}

// rewrite replaces a segment file by b, synced.
func rewrite(t *testing.T, fs vfs.FS, name string, b []byte) {
	t.Helper()
	f, err := fs.Create("/wal/"+name, vfs.WriteCategoryUnspecified)
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

// TestCrashDuringTruncation: the truncation marker is durable, the tail
// only partly zeroed (record index+1 damaged, index+2 intact) when the
// machine stops. Open must finish the truncation, not cry corruption.
func TestCrashDuringTruncation(t *testing.T) {
	fs := vfs.NewCrashableMem()
	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	for i := 1; i <= 100; i++ {
		if _, err := l.Append(context.Background(), payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	const cut = 60
	if err := l.writeTruncateMark(cut); err != nil {
		t.Fatal(err)
	}
	name, off, _ := locate(t, fs, cut+1)
	writeAt(t, fs, name, off+headerSize, make([]byte, 8))
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	l.Close()
	l = mustOpen(t, testConfig(crashed, BatchPolicy()))
	defer l.Close()
	rec := l.Recovery()
	if rec.Truncated == nil || *rec.Truncated != cut || rec.LastIndex != cut {
		t.Fatalf("recovery %+v", rec)
	}
	if all := readAll(t, l); len(all) != cut || !bytes.Equal(all[cut], payload(0, cut)) {
		t.Fatalf("%d records after the finished truncation", len(all))
	}
	if idx, err := l.Append(context.Background(), []byte("x")); err != nil || idx != cut+1 {
		t.Fatalf("append: %d, %v", idx, err)
	}
}

// TestTornAcrossSectorBoundary: the last synced record ends 5 bytes before
// a sector boundary; the next write was lost in one block and kept in the
// next, so the next frame's header is partly zero (it keeps its synced
// zeros up to the boundary), or a whole sector inside it is zero, while the
// frame after it survived intact. That is a crash, not corruption.
func TestTornAcrossSectorBoundary(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(frame []byte) // zero what the lost block held, frame starts at offset 507
	}{
		{"header straddles the boundary", func(f []byte) { copy(f[:5], make([]byte, 5)) }},
		{"a whole sector inside the frame", func(f []byte) { copy(f[1024-507:1536-507], make([]byte, sectorSize)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			l := mustOpen(t, testConfig(fs, BatchPolicy()))
			if _, err := l.Append(context.Background(), bytes.Repeat([]byte{7}, sectorSize-5-headerSize)); err != nil {
				t.Fatal(err)
			}
			l.Close()
			name, off, size := locate(t, fs, 1)
			if end := off + int64(size); end != sectorSize-5 {
				t.Fatalf("setup: record 1 ends at %d", end)
			}
			f2 := appendFrame(nil, 2, 1, bytes.Repeat([]byte{9}, 1200))
			f3 := appendFrame(nil, 3, 1, []byte("intact"))
			c.lose(f2)
			writeAt(t, fs, name, sectorSize-5, append(f2, f3...))
			l, err := Open(testConfig(fs, BatchPolicy()))
			if err != nil {
				t.Fatalf("a lost write was taken for corruption: %v", err)
			}
			defer l.Close()
			if tt := l.Recovery().TornTail; tt == nil || tt.Offset != sectorSize-5 || l.LastIndex() != 1 {
				t.Fatalf("torn %+v, last %d; want a torn tail at %d", tt, l.LastIndex(), sectorSize-5)
			}
		})
	}
}

// TestTruncateFrontFailureIsFatal fails the removal of a segment, then the
// directory sync after one, and checks each time that the log fails: a
// later sync must not pass for having made a removal durable.
func TestTruncateFrontFailureIsFatal(t *testing.T) {
	for _, kind := range []errorfs.OpKind{errorfs.OpRemove, errorfs.OpFileSync} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			var armed atomic.Bool
			fs := errorfs.Wrap(vfs.NewCrashableMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
				if op.Kind == kind && armed.Load() {
					return errInjected
				}
				return nil
			}))
			l := mustOpen(t, testConfig(fs, BatchPolicy()))
			ctx := context.Background()
			for i := range 200 {
				if _, err := l.Append(ctx, payload(0, i)); err != nil {
					t.Fatal(err)
				}
			}
			armed.Store(true)
			if err := l.TruncateFront(150); !errors.Is(err, ErrFailed) || !errors.Is(err, errInjected) {
				t.Fatalf("TruncateFront: %v, want ErrFailed wrapping the injected error", err)
			}
			armed.Store(false)
			if _, err := l.Append(ctx, []byte("later")); !errors.Is(err, ErrFailed) {
				t.Fatalf("append after a failed TruncateFront: %v", err)
			}
			if err := l.TruncateFront(150); !errors.Is(err, ErrFailed) {
				t.Fatalf("a second TruncateFront: %v", err)
			}
			if err := l.Close(); !errors.Is(err, ErrFailed) {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

// TestRecoveredTailIsMadeDurable: records that a dead process wrote but did
// not fsync are read back from the page cache at open; the log reports
// them durable, so it must make them so before a power loss can take them.
func TestRecoveredTailIsMadeDurable(t *testing.T) {
	mem := vfs.NewCrashableMem()
	var dying atomic.Bool
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if dying.Load() && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
			return errInjected // the process dies before any of its fsyncs completes
		}
		return nil
	}))
	dead := mustOpen(t, testConfig(fs, PeriodicPolicy(time.Hour))) // acknowledged on write
	dying.Store(true)
	for i := 1; i <= 5; i++ {
		if _, err := dead.Append(context.Background(), payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	dead.Close() // its last fsync fails: the records stay in the page cache only
	dying.Store(false)

	l := mustOpen(t, testConfig(fs, BatchPolicy()))
	if got := l.DurableIndex(); got != 5 {
		t.Fatalf("reopened log: durable %d, want 5", got)
	}
	if err := l.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Power fails: only synced bytes remain.
	afterPower := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0, RNG: rand.New(rand.NewPCG(2, 7))})
	l.Close()
	l2 := mustOpen(t, testConfig(afterPower, BatchPolicy()))
	defer l2.Close()
	if got := len(readAll(t, l2)); got != 5 {
		t.Fatalf("after a power loss, %d of the 5 records reported durable remain", got)
	}
}
