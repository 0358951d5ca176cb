package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

// opener returns a storagetest.Opener whose backends reach the same data
// directory on every call within one test.
func opener(cfg engine.Config) storagetest.Opener {
	var mu sync.Mutex
	dirs := map[*testing.T]string{}
	return func(t *testing.T) storage.Backend {
		t.Helper()
		mu.Lock()
		dir, ok := dirs[t]
		if !ok {
			dir = t.TempDir()
			dirs[t] = dir
		}
		mu.Unlock()
		c := cfg
		c.Dir = dir
		db, err := engine.Open(c)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		return db
	}
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, opener(engine.Config{}))
}

// TestContentionHistory runs list-append histories on a hot set of 10 keys
// with 2 to 8 clients and checks each for dependency cycles.
func TestContentionHistory(t *testing.T) {
	open := opener(engine.Config{EpochInterval: time.Millisecond})
	for _, workers := range []int{2, 4, 8} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("workers=%d/seed=%d", workers, seed), func(t *testing.T) {
				storagetest.RunHistory(t, open, storagetest.HistoryConfig{Keys: 10, Workers: workers, PerWorker: 60, Seed: seed})
			})
		}
	}
}

// TestInsertRace has clients race to create the same fresh keys: each
// transaction reads a key and, finding it absent, writes it. Only one
// transaction per key may commit having read it absent; the others must
// abort and, retried, see the winner. It covers the window in which a
// committing transaction has inserted a key's record but not yet locked it.
func TestInsertRace(t *testing.T) {
	db := opener(engine.Config{})(t)
	defer db.Close()
	ctx := context.Background()
	tb := &storage.Table{Namespace: "race", Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}
	if err := db.CreateNamespace(ctx, "race"); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	const clients, keysPerRound, rounds = 8, 2, 400
	for round := range rounds {
		var wg sync.WaitGroup
		var mu sync.Mutex
		winners := map[int64]int{}
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := storage.BigInt(int64(round*keysPerRound + c%keysPerRound))
				var absent bool
				err := storage.Update(ctx, db, func(tx storage.Txn) error {
					_, ok, err := tx.Get(ctx, &storage.Get{Namespace: "race", Table: "t", Partition: storage.Values{"k": k}})
					if err != nil || ok {
						absent = false
						return err
					}
					absent = true
					if err := tx.Put(ctx, &storage.Put{Namespace: "race", Table: "t", Partition: storage.Values{"k": k},
						Values: storage.Values{"v": storage.BigInt(int64(c))}}); err != nil {
						return err
					}
					// More fresh keys after it widen the window between
					// inserting the contested record and locking it.
					for j := range 64 {
						if err := tx.Put(ctx, &storage.Put{Namespace: "race", Table: "t",
							Partition: storage.Values{"k": storage.BigInt(-int64(1 + (round*clients+c)*64 + j))},
							Values:    storage.Values{"v": storage.BigInt(0)}}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				if absent {
					mu.Lock()
					winners[k.AsBigInt()]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for i := range keysPerRound {
			k := int64(round*keysPerRound + i)
			if n := winners[k]; n != 1 {
				t.Fatalf("round %d: %d transactions committed having read key %d absent, want exactly 1", round, n, k)
			}
			row, ok, err := db.Get(ctx, &storage.Get{Namespace: "race", Table: "t", Partition: storage.Values{"k": storage.BigInt(k)}})
			if err != nil || !ok || row["v"].AsBigInt()%keysPerRound != int64(i) {
				t.Fatalf("round %d: key %d after the race: %v, %v, %v", round, k, row, ok, err)
			}
		}
	}
}

// TestLogNoneKeepsOnlyTheCatalog: an engine without a log refuses to
// checkpoint (a fuzzy checkpoint without the log that completes it could
// hold half a transaction) and a restart keeps the catalog and no rows,
// even when an earlier run with the log left a checkpoint behind.
func TestLogNoneKeepsOnlyTheCatalog(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	put := func(db *engine.DB, k int64) {
		t.Helper()
		if err := putKV(ctx, db, k, k); err != nil {
			t.Fatal(err)
		}
	}
	count := func(db *engine.DB) int {
		t.Helper()
		n := 0
		for k := range int64(3) {
			_, ok, err := db.Get(ctx, &storage.Get{Namespace: "u", Table: "kv", Partition: key(int(k))})
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				n++
			}
		}
		return n
	}
	// A run with the log leaves a checkpoint holding row 1.
	db := openKV(t, engine.Config{Dir: dir, CheckpointInterval: -1})
	put(db, 1)
	if _, err := db.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for run := range 2 {
		db := openKV(t, engine.Config{Dir: dir, Log: engine.LogNone, CheckpointInterval: time.Millisecond})
		if n := count(db); n != 0 {
			t.Fatalf("run %d without the log starts with %d rows, want none", run, n)
		}
		put(db, 2)
		if _, err := db.Checkpoint(ctx); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("Checkpoint without the log: %v, want ErrInvalidArgument", err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The logged run's data is still what a logged open recovers.
	db = openKV(t, engine.Config{Dir: dir, CheckpointInterval: -1})
	defer db.Close()
	if n := count(db); n != 1 {
		t.Fatalf("reopened with the log: %d rows, want the 1 its checkpoint holds", n)
	}
}

// TestPinnedWorker: a pinned raw transaction commits on its own worker
// and holds it until Unpin, while other commits wait for a free one; its
// commits are durable and recovered like any other.
func TestPinnedWorker(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openKV(t, engine.Config{Dir: dir, Workers: 1, CheckpointInterval: -1, EpochInterval: time.Millisecond})
	h, err := db.Table("u", "kv")
	if err != nil {
		t.Fatal(err)
	}
	pinned, other := db.BeginRaw(), db.BeginRaw()
	if err := pinned.Pin(ctx); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range int64(100) {
		pinned.Reset()
		pinned.Write(h, h.PartitionKey(storage.BigInt(i)), []storage.Value{storage.BigInt(i)})
		if last, err = pinned.CommitAsync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	other.Write(h, h.PartitionKey(storage.BigInt(1000)), []storage.Value{storage.BigInt(1000)})
	if _, err := other.CommitAsync(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a commit while the only worker is pinned: %v, want it to wait (deadline exceeded)", err)
	}
	cancel()
	if err := db.WaitDurable(ctx, last); err != nil {
		t.Fatal(err)
	}
	pinned.Unpin()
	if _, err := other.CommitAsync(ctx); err != nil {
		t.Fatalf("commit after Unpin: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openKV(t, engine.Config{Dir: dir, CheckpointInterval: -1})
	defer db.Close()
	for _, k := range []int64{1, 99, 1000} { // not 0: getKV reads a missing row as 0
		if v, err := getKV(ctx, db, k); err != nil || v != k {
			t.Fatalf("row %d after recovery: value %d, %v", k, v, err)
		}
	}
}

// TestRawKeysReusable: a raw transaction's caller may reuse the bytes of
// its keys once the commit returns. Keys too long to sit inside their
// partition are written from one buffer, scribbled over after each
// commit; every row is then found under its key, with its value.
func TestRawKeysReusable(t *testing.T) {
	ctx := context.Background()
	db := openTable(t, engine.Config{Dir: t.TempDir()}, &storage.Table{Namespace: "u", Name: "long",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}}})
	defer db.Close()
	h, err := db.Table("u", "long")
	if err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return fmt.Sprintf("a partition key longer than sixteen bytes, %03d", i) }
	tx, buf := db.BeginRaw(), make([]byte, 0, 256)
	for i := range 100 {
		tx.Reset()
		buf = h.AppendPartitionKey(buf[:0], storage.Text(name(i)))
		tx.Write(h, unsafe.String(&buf[0], len(buf)), []storage.Value{storage.BigInt(int64(i))})
		if _, err := tx.CommitAsync(ctx); err != nil {
			t.Fatal(err)
		}
		for j := range buf {
			buf[j] = 'x'
		}
	}
	for i := range 100 {
		row, ok, err := db.Get(ctx, &storage.Get{Namespace: "u", Table: "long", Partition: storage.Values{"k": storage.Text(name(i))}})
		if err != nil || !ok || row["v"].AsBigInt() != int64(i) {
			t.Fatalf("row %d: %v, found %v, %v", i, row, ok, err)
		}
	}
}
