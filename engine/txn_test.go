package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// TestCreatedPartitionGuardsItsRecords: a transaction that read keys of a
// missing partition and then creates the partition at commit must see
// what others insert into the partition before it validates. Between its
// creating the partition and inserting its own records, another
// transaction here reads key 1, finds it absent, writes it and commits.
// The first transaction read key 1 (and, in the second case, key 2) as
// absent, so it must abort; it used to commit and, in the first case,
// overwrite the other's row: a lost update found by the conformance
// suite's history check under load.
func TestCreatedPartitionGuardsItsRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []int64 // the creator's writes, after reading keys 1 and 2
	}{
		{"lost update", []int64{0, 1}},
		{"stale absent read", []int64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			db, err := Open(Config{Dir: "/c", FS: vfs.NewMem(), Log: LogNone, CheckpointInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.CreateNamespace(ctx, "n"); err != nil {
				t.Fatal(err)
			}
			if err := db.CreateTable(ctx, &storage.Table{Namespace: "n", Name: "t",
				PartitionKey:  []storage.Column{{Name: "p", Type: storage.TypeBigInt}},
				ClusteringKey: []storage.ClusteringColumn{{Name: "k", Type: storage.TypeBigInt}},
				Columns:       []storage.Column{{Name: "v", Type: storage.TypeText}}}); err != nil {
				t.Fatal(err)
			}
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
					if tc.name == "stale absent read" {
						put(other, 2, "other")
					}
					return other.Commit(ctx)
				}()
			}
			testHookPartitionCreated.Store(&hook)
			defer testHookPartitionCreated.Store(nil)

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
