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
	mem := vfs.NewCrashableMem()
	cfg := Config{Dir: "/db", FS: mem, Workers: 4, EpochInterval: time.Minute, CheckpointInterval: -1}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	createKV(t, db, "m", storage.TypeBigInt)
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
	if !db.tryAdvance() {
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
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.FS = crashed
	db, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, k := range []int64{1, 2} {
		if _, ok, err := db.Get(ctx, &storage.Get{Namespace: "m", Table: "t", Partition: storage.Values{"k": storage.BigInt(k)}}); err != nil || !ok {
			t.Fatalf("acknowledged key %d lost at recovery (%v)", k, err)
		}
	}
}
