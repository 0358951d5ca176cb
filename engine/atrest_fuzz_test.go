package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
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

// FuzzDecodeRecord: recovery and a follower decode every log record
// before anything else; what is accepted is well formed, and a record
// encoded from an accepted one decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	ddl, _ := ddlRecord(3, ddlOp{Op: ddlCreateNamespace, Namespace: "ns"})
	f.Add(markRecord(2, 5))
	f.Add(binary.AppendUvarint([]byte{recBuffer}, 1<<40))
	f.Add([]byte{recPlainBuffer, 0})
	f.Add(voidRecord(epochRange{4, 9}))
	f.Add(eraRecord(2, 10))
	f.Add(floorRecord(7))
	f.Add(ddl)
	f.Add([]byte{recOldMark, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		var again []byte
		switch r.kind {
		case recMark:
			again = markRecord(r.logger, r.x)
		case recVoid:
			again = voidRecord(epochRange{r.epoch, r.x})
		case recEra:
			again = eraRecord(r.logger, r.epoch)
		case recFloor:
			again = floorRecord(r.epoch)
		case recDDL:
			if again, err = ddlRecord(r.epoch, r.op); err != nil {
				t.Fatal(err)
			}
		case recBuffer, recPlainBuffer:
			if r.epoch == 0 || r.epoch > MaxEpoch {
				t.Fatalf("buffer of epoch %d", r.epoch)
			}
			return
		default:
			t.Fatalf("kind %d accepted", r.kind)
		}
		if r2, err := decodeRecord(again); err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("%v re-encoded decodes to %v, %v", r, r2, err)
		}
	})
}

// FuzzCatalogChunk reads arbitrary bytes as the catalog a checkpoint
// begins with: it decodes and restores, or is refused as malformed, and a
// restored catalog snapshots to what restores the same.
func FuzzCatalogChunk(f *testing.F) {
	db := fuzzDB(f)
	db.cat.mu.RLock()
	good, err := json.Marshal(db.cat.snapshotLocked(1))
	db.cat.mu.RUnlock()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{chunkCatalog}, good...))
	f.Add([]byte{chunkCatalog, '{', '}'})
	f.Add([]byte(`{"next_table_id":1,"namespaces":[],"tables":[],"loggers":1}`))
	f.Add([]byte("not json"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var snap catalogSnapshot
		if err := decodeCatalogChunk(b, &snap); err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		var c catalog
		if err := c.restore(snap); err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("restore: untyped error %v", err)
			}
			return
		}
		c.mu.RLock()
		again := c.snapshotLocked(snap.Loggers)
		c.mu.RUnlock()
		var c2 catalog
		if err := c2.restore(again); err != nil {
			t.Fatalf("a restored catalog's snapshot does not restore: %v", err)
		}
		c2.mu.RLock()
		defer c2.mu.RUnlock()
		if !reflect.DeepEqual(again, c2.snapshotLocked(snap.Loggers)) {
			t.Fatalf("snapshot %+v restores differently", again)
		}
	})
}
