package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// Fuzz targets for the engine's files read back at Open: checkpoint
// framing, log record headers (marks), the catalog. Whatever the bytes,
// the decoders return a *CorruptionError or something that holds.

// realCheckpoint writes rows into an engine on a MemFS, checkpoints it,
// and returns the checkpoint file's bytes and its name.
func realCheckpoint(t testing.TB) ([]byte, ckptFile) {
	fs := vfs.NewMem()
	db, err := Open(Config{Dir: "/r", FS: fs, EpochInterval: time.Millisecond, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	tb := &storage.Table{Namespace: "f", Name: "a", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeText}, {Name: "d", Type: storage.TypeDouble}}}
	if err := errors.Join(db.CreateNamespace(ctx, "f"), db.CreateTable(ctx, tb)); err != nil {
		t.Fatal(err)
	}
	for k := range 5 {
		if err := db.Put(ctx, &storage.Put{Namespace: "f", Table: "a", Partition: storage.Values{"k": storage.BigInt(int64(k))},
			Values: storage.Values{"v": storage.Text("x"), "d": storage.Double(float64(k))}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := db.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	file := ckptFile{cs: st.Start}
	f, err := fs.Open("/r/" + file.name())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b, file
}

// FuzzCheckpointFile reads arbitrary bytes as a checkpoint file, full and
// delta: its chunk framing, checksums, trailer and the entries in it.
func FuzzCheckpointFile(f *testing.F) {
	db := fuzzDB(f)
	good, file := realCheckpoint(f)
	f.Add(good, false)
	f.Add(good[:len(good)/2], false)
	f.Add([]byte{}, true)
	f.Add([]byte{5, 0, 0, 0, 0, 0, 0, 0, 2, 'k', 'i'}, false)
	f.Fuzz(func(t *testing.T, b []byte, delta bool) {
		want := ckptFile{cs: file.cs}
		if delta {
			want.base = 1
		}
		w, err := db.fs.Create(db.fs.PathJoin(db.cfg.Dir, want.name()), vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(bytes.Clone(b)) // a race build's MemFS mangles what it was given to write
		w.Close()
		cs, ce, rows, size, err := db.loadCheckpoint(want)
		var corrupt *CorruptionError
		switch {
		case err != nil && !errors.As(err, &corrupt):
			t.Fatalf("untyped error %v", err)
		case err == nil && (cs != want.cs || ce < cs || rows < 0 || size != int64(len(b))):
			t.Fatalf("accepted: epochs %d..%d, %d rows, %d of %d bytes", cs, ce, rows, size, len(b))
		}
	})
}

// FuzzRecordHeader: recovery reads every log record's kind and epoch
// before anything else, marks included.
func FuzzRecordHeader(f *testing.F) {
	f.Add([]byte{recMark, 5})
	f.Add(binary.AppendUvarint([]byte{recBuffer}, 1<<40))
	f.Add([]byte{recPlainBuffer, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, e, err := recordHeader(b)
		if err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		switch kind {
		case recMark:
			if v, n := binary.Uvarint(b[1:]); e >= MaxEpoch || v != e || len(b) != 1+n {
				t.Fatalf("mark %d from %x", e, b)
			}
		case recBuffer, recPlainBuffer:
			if e == 0 || e > MaxEpoch {
				t.Fatalf("buffer of epoch %d", e)
			}
		default:
			t.Fatalf("kind %d accepted", kind)
		}
	})
}

// FuzzCatalog reads arbitrary bytes as catalog.json. A catalog that
// decodes re-encodes to one that decodes the same, and loading it either
// succeeds or is a *CorruptionError.
func FuzzCatalog(f *testing.F) {
	db := fuzzDB(f)
	db.cat.mu.Lock()
	good, err := encodeCatalog(db.cat.fileLocked())
	db.cat.mu.Unlock()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"version":1,"next_table_id":1,"namespaces":[],"tables":[],"loggers":1}`))
	f.Add([]byte(`{"version":2,"crc32c":0,"catalog":{}}`))
	f.Add([]byte("not json"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cf, legacy, err := decodeCatalog(b)
		var corrupt *CorruptionError
		if err != nil {
			if !errors.As(err, &corrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !legacy {
			again, err := encodeCatalog(cf)
			if err != nil {
				t.Fatal(err)
			}
			cf2, legacy2, err := decodeCatalog(again)
			if err != nil || legacy2 || !reflect.DeepEqual(cf, cf2) {
				t.Fatalf("re-encoded catalog decodes to %+v, %v, %v; was %+v", cf2, legacy2, err, cf)
			}
		}
		fresh := &DB{cfg: Config{Dir: "/c"}, fs: vfs.NewMem()}
		fresh.cat.init()
		if err := fresh.fs.MkdirAll("/c", 0o755); err != nil {
			t.Fatal(err)
		}
		w, _ := fresh.fs.Create("/c/"+catalogName, vfs.WriteCategoryUnspecified)
		w.Write(bytes.Clone(b)) // a race build's MemFS mangles what it was given to write
		w.Close()
		if _, err := fresh.loadCatalog(); err != nil && !errors.As(err, &corrupt) {
			t.Fatalf("load: untyped error %v", err)
		}
	})
}
