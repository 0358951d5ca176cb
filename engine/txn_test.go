package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// clusteredTable opens an engine in memory, without a log, holding table
// n.t: partition key p and clustering key k (BIGINT), one column v of
// type v. It closes when the test ends.
func clusteredTable(t *testing.T, v storage.DataType) *DB {
	return clusteredTableOf(t, storage.Column{Name: "v", Type: v})
}

// clusteredTableOf is clusteredTable with the value columns cols.
func clusteredTableOf(t *testing.T, cols ...storage.Column) *DB {
	t.Helper()
	db, err := Open(Config{Dir: "/c", FS: vfs.NewMem(), Log: LogNone, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.CreateNamespace(t.Context(), "n"); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(t.Context(), &storage.Table{Namespace: "n", Name: "t",
		PartitionKey:  []storage.Column{{Name: "p", Type: storage.TypeBigInt}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "k", Type: storage.TypeBigInt}},
		Columns:       cols}); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestCreatedPartitionGuardsItsRecords: a transaction that read keys of a
// missing partition and then creates the partition at commit must see
// what others insert into the partition before it validates. Between its
// creating the partition and inserting its own records, another
// transaction here reads key 1, finds it absent, writes it and commits.
// The first transaction read key 1 (and, in the second case, key 2) as
// absent, so it must abort; it used to commit and, in the first case,
// overwrite the other's row: a lost update found by the conformance
// suite's history check under load. The cases with many structure reads
// take the commit's index of them (indexNodes).
func TestCreatedPartitionGuardsItsRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []int64 // the creator's writes, after reading keys 1 and 2
		stale  bool    // the other transaction also writes key 2, which the creator only read
		pad    int     // absent partitions the creator reads first (past linearNodes: bumped's index)
	}{
		{"lost update", []int64{0, 1}, false, 0},
		{"stale absent read", []int64{0}, true, 0},
		{"lost update, many structure reads", []int64{0, 1}, false, 2 * linearNodes},
		{"stale absent read, many structure reads", []int64{0}, true, 2 * linearNodes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			db := clusteredTable(t, storage.TypeText)
			at := func(k int64) (storage.Values, storage.Values) {
				return storage.Values{"p": storage.BigInt(0)}, storage.Values{"k": storage.BigInt(k)}
			}
			get := func(tx storage.Txn, k int64) (string, bool) {
				t.Helper()
				part, clus := at(k)
				row, ok, err := tx.Get(ctx, &storage.Get{Namespace: "n", Table: "t", Partition: part, Clustering: clus})
				if err != nil || !ok {
					return "", false
				}
				return row["v"].AsText(), true
			}
			put := func(tx storage.Txn, k int64, v string) {
				t.Helper()
				part, clus := at(k)
				if err := tx.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: clus,
					Values: storage.Values{"v": storage.Text(v)}}); err != nil {
					t.Fatal(err)
				}
			}
			store := unsyncedView{db} // commits return once visible: no epoch to wait for inside the hook

			creator, err := store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for p := range tc.pad {
				if _, ok, err := creator.Get(ctx, &storage.Get{Namespace: "n", Table: "t",
					Partition: storage.Values{"p": storage.BigInt(int64(100 + p))}, Clustering: storage.Values{"k": storage.BigInt(0)}}); err != nil || ok {
					t.Fatalf("partition %d: present %v, %v", 100+p, ok, err)
				}
			}
			for _, k := range []int64{1, 2} {
				if _, ok := get(creator, k); ok {
					t.Fatalf("key %d present in an empty table", k)
				}
			}
			for _, k := range tc.writes {
				put(creator, k, "creator")
			}

			var otherErr error
			ran := false
			hook := func() {
				if ran {
					return
				}
				ran = true
				otherErr = func() error {
					other, err := store.Begin(ctx)
					if err != nil {
						return err
					}
					if v, ok := get(other, 1); ok {
						return errors.New("key 1 already present: " + v)
					}
					put(other, 1, "other")
					if tc.stale {
						put(other, 2, "other")
					}
					return other.Commit(ctx)
				}()
			}
			db.hooks.partitionCreated.Store(&hook)
			defer db.hooks.partitionCreated.Store(nil)

			err = creator.Commit(ctx)
			if !ran {
				t.Fatal("the creator's commit did not create the partition")
			}
			if otherErr != nil {
				t.Fatalf("the other transaction: %v", otherErr)
			}
			if !errors.Is(err, storage.ErrConflict) {
				t.Fatalf("the creator committed (err %v) though key 1, which it read absent, was written before it validated", err)
			}
			check, err := db.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range map[int64]string{0: "", 1: "other"} {
				if v, _ := get(check, k); v != want {
					t.Errorf("key %d = %q, want %q", k, v, want)
				}
			}
		})
	}
}

// TestImportExcusesItsOwnInserts: a transaction that reads many keys as
// absent and then inserts them all (an import) commits, its own inserts
// excused from the structure versions it read, whether it creates the
// partitions or inserts into partitions it found; and the rows are there.
// Past linearNodes structure reads this goes through bumped's index.
func TestImportExcusesItsOwnInserts(t *testing.T) {
	ctx := t.Context()
	db := clusteredTable(t, storage.TypeBigInt)
	key := func(p, k int) (storage.Values, storage.Values) {
		return storage.Values{"p": storage.BigInt(int64(p))}, storage.Values{"k": storage.BigInt(int64(k))}
	}
	// Partitions 0..9 exist (one row each) before the import; 10..49 do not.
	for p := range 10 {
		part, clus := key(p, -1)
		if err := db.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: clus,
			Values: storage.Values{"v": storage.BigInt(0)}}); err != nil {
			t.Fatal(err)
		}
	}
	const parts, perPart = 50, 8
	err := storage.UpdateWith(ctx, unsyncedView{db}, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
		for p := range parts {
			for k := range perPart {
				part, clus := key(p, k)
				if _, ok, err := tx.Get(ctx, &storage.Get{Namespace: "n", Table: "t", Partition: part, Clustering: clus}); err != nil || ok {
					return fmt.Errorf("(%d, %d) present %v before the import: %v", p, k, ok, err)
				}
				if err := tx.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: clus,
					Values: storage.Values{"v": storage.BigInt(int64(p*perPart + k))}}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the import did not commit alone: %v", err)
	}
	for p := range parts {
		for k := range perPart {
			part, clus := key(p, k)
			row, ok, err := db.Get(ctx, &storage.Get{Namespace: "n", Table: "t", Partition: part, Clustering: clus})
			if err != nil || !ok || row["v"].AsBigInt() != int64(p*perPart+k) {
				t.Fatalf("(%d, %d) after the import: %v, %v, %v", p, k, row, ok, err)
			}
		}
	}
}

// TestEndedTxnLeavesItsPooledCoreAlone: a transaction's core goes back to
// the pool when it commits or aborts, and the next transaction takes it.
// Calls on the ended transaction, including a second Abort, must fail with
// ErrTxnDone and reach nothing of the next one's.
func TestEndedTxnLeavesItsPooledCoreAlone(t *testing.T) {
	ctx := t.Context()
	db := twoColumnTable(t)
	part := storage.Values{"p": storage.BigInt(1)}
	put := func(k int64) *storage.Put {
		return &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: storage.Values{"k": storage.BigInt(k)},
			Values: storage.Values{"a": storage.BigInt(k)}}
	}
	for _, end := range []string{"commit", "abort"} {
		t.Run(end, func(t *testing.T) {
			old, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := old.Put(ctx, put(1)); err != nil {
				t.Fatal(err)
			}
			if end == "commit" {
				err = old.Commit(ctx)
			} else {
				err = old.Abort(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			next, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := next.Put(ctx, put(2)); err != nil {
				t.Fatal(err)
			}
			if err := old.Put(ctx, put(3)); !errors.Is(err, storage.ErrTxnDone) {
				t.Fatalf("Put after %s: %v, want ErrTxnDone", end, err)
			}
			if _, _, err := old.Get(ctx, &storage.Get{Namespace: "n", Table: "t", Partition: part, Clustering: storage.Values{"k": storage.BigInt(2)}}); !errors.Is(err, storage.ErrTxnDone) {
				t.Fatalf("Get after %s: %v, want ErrTxnDone", end, err)
			}
			if err := old.Commit(ctx); !errors.Is(err, storage.ErrTxnDone) {
				t.Fatalf("Commit after %s: %v, want ErrTxnDone", end, err)
			}
			if err := old.Abort(ctx); err != nil {
				t.Fatal(err)
			}
			// next still holds its core: a third transaction must not share it.
			third, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if third.(*Txn).x == next.(*Txn).x {
				t.Fatal("a second Abort of an ended transaction put a live core back in the pool")
			}
			third.Abort(ctx)
			if err := next.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			check, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer check.Abort(ctx)
			rows := scanAll(t, check, &storage.Scan{Namespace: "n", Table: "t", Partition: part})
			var keys []int64
			for _, r := range rows {
				keys = append(keys, r["k"].AsBigInt())
			}
			want := []int64{1, 2}
			if end == "abort" {
				want = []int64{2}
			}
			if !reflect.DeepEqual(keys, want) {
				t.Fatalf("keys %v, want %v", keys, want)
			}
			if err := db.Delete(ctx, &storage.Delete{Namespace: "n", Table: "t", Partition: part, Clustering: storage.Values{"k": storage.BigInt(1)}}); err != nil {
				t.Fatal(err)
			}
			if err := db.Delete(ctx, &storage.Delete{Namespace: "n", Table: "t", Partition: part, Clustering: storage.Values{"k": storage.BigInt(2)}}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
