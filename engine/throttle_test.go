package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wal"
)

// TestThrottleBoundsPendingLog: committers that do not wait for
// durability, against a log whose fsyncs are slow, are held back once
// their logger has more than MaxLogPending bytes to write. The bytes
// pending stay within the limit plus what the committers already past the
// check can add, and the limit is reached (the throttle did engage).
func TestThrottleBoundsPendingLog(t *testing.T) {
	const bufSize, limit, workers = 4 << 10, 16 << 10, 4
	fs := wal.DelaySyncFS(vfs.NewMem(), 5*time.Millisecond)
	db, err := Open(Config{Dir: "/db", FS: fs, Workers: workers, LogBufferSize: bufSize, MaxLogPending: limit,
		EpochInterval: time.Millisecond, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	createKV(t, db, "t", storage.TypeBlob)
	h, err := db.Table("t", "t")
	if err != nil {
		t.Fatal(err)
	}
	lg := db.loggers[0]
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if p := lg.pending.Load(); p > peak.Load() {
				peak.Store(p)
			}
		}
	})
	value := make([]byte, 1<<10)
	var clients sync.WaitGroup
	for g := range 8 {
		clients.Go(func() {
			x := db.BeginRaw()
			for i := range 300 {
				x.Reset()
				x.Write(h, h.PartitionKey(storage.BigInt(int64(g*1000+i))), []storage.Value{storage.Blob(value)})
				if _, err := x.CommitAsync(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	clients.Wait()
	close(stop)
	wg.Wait()
	// Each committer can add one full buffer after passing the check, and
	// the logger collects at most one more per worker.
	if bound := int64(limit + 2*workers*(bufSize+2<<10)); peak.Load() > bound {
		t.Fatalf("pending log bytes peaked at %d, want at most %d", peak.Load(), bound)
	}
	if peak.Load() < limit {
		t.Fatalf("pending log bytes peaked at %d, never reaching the limit %d: the throttle was not exercised", peak.Load(), limit)
	}
}
