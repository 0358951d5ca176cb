package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// TestOpenEpochBuffersWaitForABatch: buffers of an epoch still open are
// written once writeBatch bytes of them wait, not one round each.
func TestOpenEpochBuffersWaitForABatch(t *testing.T) {
	db, err := Open(Config{Dir: t.TempDir(), EpochInterval: time.Minute, CheckpointInterval: -1,
		Workers: 1, LogBufferSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	createKV(t, db, "t", storage.TypeBlob)
	h, err := db.Table("t", "t")
	if err != nil {
		t.Fatal(err)
	}
	lg := db.loggers[0]
	start := db.logLast.Load()
	value := storage.Blob(make([]byte, 1000))
	k := int64(0)
	// commitUntil commits over 1,000 bytes at a time until done; the bound
	// stops a loop whose condition never comes (a logger that writes, and
	// so releases pending, before a goal in pending bytes is reached).
	commitUntil := func(done func() bool, bytes int64) {
		for most := k + 2*bytes/1000; !done(); k++ {
			if k > most {
				t.Fatalf("%d bytes wait after %d commits of 1,000 bytes; the log has %d records more",
					lg.pending.Load(), k, db.logLast.Load()-start)
			}
			x := db.BeginRaw()
			x.Write(h, h.PartitionKey(storage.BigInt(k)), []storage.Value{value})
			if _, err := x.CommitAsync(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	batch := lg.writeBatch()
	commitUntil(func() bool { return lg.pending.Load() >= batch/2 }, batch/2) // four buffers of the open epoch
	queued := lg.pending.Load()
	lg.poke() // as anything else may: a wake is no reason to write
	time.Sleep(200 * time.Millisecond)
	if got := db.logLast.Load(); got != start {
		t.Fatalf("the logger wrote %d records for %d bytes of buffers, below a batch of %d",
			got-start, queued, batch)
	}
	// A batch: the logger, poked by the handoff that completes it, may
	// write and release it before the loop looks at pending again.
	commitUntil(func() bool { return lg.pending.Load() >= batch || db.logLast.Load() != start }, batch/2)
	for deadline := time.Now().Add(10 * time.Second); db.logLast.Load() == start; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a batch of %d bytes waits for the epoch's close", lg.pending.Load())
		}
	}
}

// TestWaitersOfAClosedEpochAreServed: many committers that wait for
// durability are served by the loggers' rounds, never left for the epoch
// tick (a minute away here). A logger that went idle while a worker still
// committed into a closed epoch left them to it: no committer of a closed
// epoch wakes a logger.
func TestWaitersOfAClosedEpochAreServed(t *testing.T) {
	db, _ := kvDB(t, Config{Dir: t.TempDir(), EpochInterval: time.Minute, CheckpointInterval: -1})
	h, err := db.Table("t", "t")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for c := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				k := int64(c*1000 + i)
				x := db.BeginRaw()
				x.Write(h, h.PartitionKey(storage.BigInt(k)), []storage.Value{storage.BigInt(k)})
				e, err := x.CommitAsync(context.Background())
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err = db.WaitDurable(ctx, e)
					cancel()
				}
				if err != nil {
					errs <- fmt.Errorf("client %d, commit %d: %w", c, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
