package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
)

// TestCheckpointDirectIO: on a disk, a checkpoint is written with direct
// I/O, so it leaves at most its last, partial block in the page cache, and
// the file, alone with the catalog in a fresh directory, recovers every row: chunks of
// several blocks, entries across block boundaries, a row larger than the
// writer's buffer, and a tail that is not a whole block.
func TestCheckpointDirectIO(t *testing.T) {
	ctx := context.Background()
	dir := testenv.DiskDir(t)
	cfg := Config{Dir: filepath.Join(dir, "db"), FS: vfs.Default, CheckpointInterval: -1}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	createKV(t, db, "c", storage.TypeText)
	const n = 3000 // about 8 MB: several chunks, one row larger than a chunk's buffer
	value := func(k int) string {
		size := 1 + k*37%2000
		switch {
		case k == 1234:
			size = 3 << 20
		case k%500 == 0:
			size = 300 << 10
		}
		return strings.Repeat(string(rune('a'+k%26)), size)
	}
	for k := range n {
		if err := db.Unsynced().Put(ctx, &storage.Put{Namespace: "c", Table: "t", Partition: storage.Values{"k": storage.BigInt(int64(k))},
			Values: storage.Values{"v": storage.Text(value(k))}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := db.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows < n || st.Bytes%4096 == 0 {
		t.Fatalf("checkpoint of %d rows in %d bytes; want at least %d rows and a partial last block", st.Rows, st.Bytes, n)
	}
	name := filepath.Join(cfg.Dir, ckptFile{cs: st.Start}.name())
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != st.Bytes {
		t.Fatalf("the file holds %d bytes, the checkpoint reports %d", fi.Size(), st.Bytes)
	}
	if r := testenv.Resident(t, name); r > 1 {
		t.Fatalf("the checkpoint left %d pages in the page cache: not written with direct I/O", r)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	alone := filepath.Join(dir, "alone")
	if err := os.MkdirAll(alone, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{name} { // the catalog is in it
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(alone, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Dir = alone
	db, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for k := range n {
		row, ok, err := db.Get(ctx, &storage.Get{Namespace: "c", Table: "t", Partition: storage.Values{"k": storage.BigInt(int64(k))}})
		if err != nil || !ok || row["v"].AsText() != value(k) {
			t.Fatalf("row %d after recovery from the checkpoint alone: %v, %v", k, ok, err)
		}
	}
}
