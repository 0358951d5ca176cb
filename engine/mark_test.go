package engine

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// TestMarkNeverGoesBack: a worker caught between publishing an old epoch
// and rechecking it (enter) holds a round's X below what the logger already
// published. The round must not write that lower mark: recovery takes a
// log's last mark as its durable epoch, and a lower one after a higher
// one would void acknowledged commits.
func TestMarkNeverGoesBack(t *testing.T) {
	ctx := context.Background()
	db, mem, cfg := openMarkDB(t, 4)
	put := func(k int64) {
		t.Helper()
		if err := db.Put(ctx, &storage.Put{Namespace: "m", Table: "t", Partition: storage.Values{"k": storage.BigInt(k)},
			Values: storage.Values{"v": storage.BigInt(k)}}); err != nil {
			t.Fatal(err)
		}
	}
	put(1)
	put(2) // acknowledged: durable at an epoch ≥ 2
	if d := db.DurableEpoch(); d < 2 {
		t.Fatalf("durable epoch %d after two acknowledged commits", d)
	}
	time.Sleep(50 * time.Millisecond) // let the logger finish its rounds; nothing wakes it again
	// A commit left in its worker's buffer, then the epoch moves on so a
	// round collects it, while another worker shows epoch 1.
	h, err := db.Table("m", "t")
	if err != nil {
		t.Fatal(err)
	}
	x := db.BeginRaw()
	x.Write(h, h.PartitionKey(storage.BigInt(3)), []storage.Value{storage.BigInt(3)})
	if _, err := x.CommitAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if !db.tryAdvance(evTick).advanced {
		t.Fatal("the epoch did not advance")
	}
	stale := db.workers[len(db.workers)-1]
	stale.active.Store(1)
	if !db.loggers[0].round(true) {
		t.Fatal("the round wrote nothing")
	}
	// Crash here: only what the rounds synced survives.
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	stale.active.Store(0)
	checkRecovered(t, db, crashed, cfg, 1, 2)
}

// openMarkDB opens an engine with the given workers on a crashable
// in-memory filesystem, whose epoch only the test advances, with table
// m.t (bigint k → bigint v).
func openMarkDB(t *testing.T, workers int) (*DB, *vfs.MemFS, Config) {
	t.Helper()
	mem := vfs.NewCrashableMem()
	cfg := Config{Dir: "/db", FS: mem, Workers: workers, EpochInterval: time.Minute, CheckpointInterval: -1}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	createKV(t, db, "m", storage.TypeBigInt)
	return db, mem, cfg
}

// checkRecovered closes db, opens the engine on crashed, its filesystem as
// a crash left it, and checks that m.t holds every key of durable epochs
// given.
func checkRecovered(t *testing.T, db *DB, crashed *vfs.MemFS, cfg Config, durable ...int64) {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.FS = crashed
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, k := range durable {
		if _, ok, err := db.Get(context.Background(), &storage.Get{Namespace: "m", Table: "t", Partition: storage.Values{"k": storage.BigInt(k)}}); err != nil || !ok {
			t.Fatalf("key %d of a durable epoch lost at recovery (%v)", k, err)
		}
	}
}

// TestRoundWaitsForACommit: a logger's round takes no lock on a worker
// (logger.collect). While a commit runs on a worker that still holds
// entries of a closed epoch, the round must wait rather than mark that
// epoch without them; once the commit ends, it claims the worker and
// writes them. And a commit must not start on a worker whose log state its
// logger has claimed.
func TestRoundWaitsForACommit(t *testing.T) {
	ctx := context.Background()
	db, mem, cfg := openMarkDB(t, 1)
	time.Sleep(50 * time.Millisecond) // let the logger finish its rounds; nothing wakes it again
	h, err := db.Table("m", "t")
	if err != nil {
		t.Fatal(err)
	}
	write := func(k int64) error {
		x := db.BeginRaw()
		x.Write(h, h.PartitionKey(storage.BigInt(k)), []storage.Value{storage.BigInt(k)})
		_, err := x.CommitAsync(ctx)
		return err
	}
	w := db.workers[0]

	// The logger claims the worker: a commit waits until it lets go.
	w.active.Store(logClaimed)
	entered := make(chan error, 1)
	go func() { entered <- write(1) }()
	select {
	case err := <-entered:
		t.Fatalf("a commit ran on a worker its logger had claimed (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	w.active.Store(0)
	if err := <-entered; err != nil {
		t.Fatal(err)
	}
	e1 := db.epoch.Load()
	if got := w.heldEp.Load(); got != e1 {
		t.Fatalf("the worker holds entries of epoch %d, want %d", got, e1)
	}

	// A commit enters the next epoch on the worker, and the epoch moves
	// on again: a round may mark e1 only with the worker's entries.
	if !db.tryAdvance(evTick).advanced {
		t.Fatal("the epoch did not advance")
	}
	w.active.Store(db.epoch.Load())
	if !db.tryAdvance(evTick).advanced {
		t.Fatal("the epoch did not advance")
	}
	done := make(chan bool, 1)
	go func() { done <- db.loggers[0].round(true) }()
	select {
	case <-done:
		t.Fatal("a round ended while a committing worker held entries of a closed epoch")
	case <-time.After(50 * time.Millisecond):
	}
	if d := db.DurableEpoch(); d >= e1 {
		t.Fatalf("durable epoch %d while the entries of epoch %d are in a committing worker", d, e1)
	}
	w.active.Store(0) // the commit ends without logging, as an abort does
	if !<-done {
		t.Fatal("the round wrote nothing")
	}
	// The round proposed its records; the log makes them durable
	// without another round.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := db.WatchDurable(ctx, e1); err != nil {
		t.Fatalf("durable epoch %d after the round, want at least %d: %v", db.DurableEpoch(), e1, err)
	}
	if got := w.heldEp.Load(); got != 0 {
		t.Fatalf("the worker still shows entries of epoch %d after the round took them", got)
	}
	checkRecovered(t, db, mem.CrashClone(vfs.CrashCloneCfg{}), cfg, 1)
}
