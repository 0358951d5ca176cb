package engine_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

var blobTable = &storage.Table{Namespace: "b", Name: "blobs",
	PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
	Columns:      []storage.Column{{Name: "v", Type: storage.TypeBlob}}}

// TestCheckpointByLogSize: with checkpoints an hour apart, a log that
// reaches CheckpointLogSize since the last checkpoint starts one at once
// and is truncated, while the engine runs and when a long log is found at
// Open, as happens to an engine opened many times for less than the
// interval.
func TestCheckpointByLogSize(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	cfg := engine.Config{Dir: "/db", FS: fs, EpochInterval: time.Millisecond, LogSegmentSize: 64 << 10,
		CheckpointInterval: time.Hour, CheckpointLogSize: 256 << 10}
	val := bytes.Repeat([]byte{7}, 4<<10)
	write := func(db *engine.DB, from, n int) {
		t.Helper()
		for k := from; k < from+n; k++ {
			if err := db.Put(ctx, &storage.Put{Namespace: "b", Table: "blobs", Partition: key(k),
				Values: storage.Values{"v": storage.Blob(val)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// logSize is the bytes of the log's segment files; each is
	// LogSegmentSize, filled with zeros before use.
	logSize := func() int64 {
		names, err := fs.List("/db/log")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, name := range names {
			if st, err := fs.Stat("/db/log/" + name); err == nil && strings.HasSuffix(name, ".wal") {
				n += st.Size()
			}
		}
		return n
	}
	checkpoints := func() int {
		names, _ := fs.List("/db")
		n := 0
		for _, name := range names {
			if strings.HasPrefix(name, "checkpoint-") && !strings.HasSuffix(name, ".tmp") {
				n++
			}
		}
		return n
	}
	// settle waits until a checkpoint has truncated the log below 1 MiB.
	settle := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if checkpoints() > 0 && logSize() < 1<<20 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d checkpoints, %d log bytes after 20 s", what, checkpoints(), logSize())
			}
		}
	}

	// Written without periodic checkpoints: 4 MiB of log stays.
	off := cfg
	off.CheckpointInterval = -1
	db := openTable(t, off, blobTable)
	write(db, 0, 1024)
	if n := logSize(); n < 4<<20 || checkpoints() != 0 {
		t.Fatalf("without checkpoints: %d log bytes and %d checkpoints", n, checkpoints())
	}
	db.Close()

	// Opened with them: the log recovery read calls for one at once.
	db = openTable(t, cfg, blobTable)
	settle("after Open")
	for k := 0; k < 1024; k += 97 {
		if row, ok, err := db.Get(ctx, &storage.Get{Namespace: "b", Table: "blobs", Partition: key(k)}); err != nil || !ok || !bytes.Equal(row["v"].AsBlob(), val) {
			t.Fatalf("key %d after the checkpoint: %v %v", k, ok, err)
		}
	}

	// kept counts the truncated segments the log keeps for reuse.
	kept := func() int {
		names, _ := fs.List("/db/log")
		n := 0
		for _, name := range names {
			if strings.HasPrefix(name, "recycled-") {
				n++
			}
		}
		return n
	}
	// Running: 4 MiB more is truncated as it goes. Checkpoints' truncations
	// leave segments kept for the next ones: at most what one checkpoint
	// frees (256 KiB of 64 KiB segments, plus one), and one more that the
	// preparer may be turning into a segment.
	mostKept := 0
	for i := range 4 {
		write(db, 1024+i*256, 256)
		settle("while writing")
		n := kept()
		if n > 6 {
			t.Fatalf("%d truncated segments kept for reuse, want at most 6", n)
		}
		mostKept = max(mostKept, n)
	}
	if mostKept == 0 {
		t.Fatalf("no truncated segment was kept for reuse")
	}
	db.Close()
	db = openTable(t, cfg, blobTable)
	defer db.Close()
	if row, ok, err := db.Get(ctx, &storage.Get{Namespace: "b", Table: "blobs", Partition: key(2047)}); err != nil || !ok || !bytes.Equal(row["v"].AsBlob(), val) {
		t.Fatalf("the last key after reopening: %v %v", ok, err)
	}
}
