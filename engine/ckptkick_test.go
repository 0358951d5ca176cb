package engine

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// TestNoCheckpointForAStaleKick: loggers kick the checkpoint loop at every
// round while the log since the last checkpoint is CheckpointLogSize or
// more, until a checkpoint begins and moves the mark. A kick sent after
// the loop took the first one, but before that checkpoint began, must not
// start a second checkpoint once the first ends: nothing is due then, and
// under uniform updates such a delta holds nearly every row again.
func TestNoCheckpointForAStaleKick(t *testing.T) {
	ctx := context.Background()
	var done atomic.Int64 // checkpoints written
	cfg := Config{Dir: "/db", FS: vfs.NewMem(), EpochInterval: time.Millisecond, LogSegmentSize: 64 << 10,
		CheckpointInterval: time.Hour, CheckpointLogSize: 64 << 10,
		Logf: func(format string, _ ...any) {
			if strings.HasPrefix(format, "engine: checkpoint of") {
				done.Add(1)
			}
		}}
	began, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	hook := func() {
		if calls.Add(1) == 1 {
			close(began)
			<-release
		}
	}
	cfg.hooks = new(testHooks)
	cfg.hooks.checkpointBegin.Store(&hook)
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	createKV(t, db, "m", storage.TypeBlob)
	val := bytes.Repeat([]byte{7}, 4<<10)
	k := int64(0)
	put := func() {
		t.Helper()
		k++
		if err := db.Put(ctx, &storage.Put{Namespace: "m", Table: "t", Partition: storage.Values{"k": storage.BigInt(k)},
			Values: storage.Values{"v": storage.Blob(val)}}); err != nil {
			t.Fatal(err)
		}
	}
	// Past the size: the loop starts a checkpoint, held before it moves the
	// mark.
	for deadline := time.Now().Add(20 * time.Second); ; put() {
		select {
		case <-began:
		default:
			if time.Now().After(deadline) {
				t.Fatal("no checkpoint began after 20 s of writes")
			}
			continue
		}
		break
	}
	// More rounds, each still finding the old mark: they kick again.
	for range 8 {
		put()
	}
	close(release)
	for deadline := time.Now().Add(20 * time.Second); done.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint did not end in 20 s")
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d checkpoints began, want 1: a stale kick started another", n)
	}
	if db.CheckpointBusy() {
		t.Fatal("CheckpointBusy with nothing due and no checkpoint running")
	}
}
