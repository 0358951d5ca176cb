package engine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// twoColumnTable opens a database with table n.t: partition p, clustering
// k, value columns a (BIGINT) and b (TEXT), so that a Put may set part of a
// row.
func twoColumnTable(t *testing.T) *DB {
	return clusteredTableOf(t, storage.Column{Name: "a", Type: storage.TypeBigInt}, storage.Column{Name: "b", Type: storage.TypeText})
}

func scanAll(t *testing.T, tx storage.Txn, s *storage.Scan) []storage.Row {
	t.Helper()
	rows, err := tx.Scan(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	out, err := storage.CollectRows(rows)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLimitedScanMatchesTruncatedScan: a scan with a limit returns exactly
// the first rows of the same scan without one, in either order and over
// any range, with committed deletes left in the partition and the
// transaction's own full puts, partial puts and deletes laid over it. The
// limited scan walks the partition only as far as it needs.
func TestLimitedScanMatchesTruncatedScan(t *testing.T) {
	ctx := t.Context()
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			db := twoColumnTable(t)
			part := storage.Values{"p": storage.BigInt(1)}
			key := func(k int) storage.Values { return storage.Values{"k": storage.BigInt(int64(k))} }
			const keys = 60
			err := storage.Update(ctx, db, func(tx storage.Txn) error {
				for k := range keys {
					if rng.IntN(3) > 0 {
						if err := tx.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: key(k),
							Values: storage.Values{"a": storage.BigInt(int64(k)), "b": storage.Text(fmt.Sprint("row", k))}}); err != nil {
							return err
						}
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			// Committed deletes leave absent records behind in the tree.
			for k := range keys {
				if rng.IntN(3) == 0 {
					if err := db.Delete(ctx, &storage.Delete{Namespace: "n", Table: "t", Partition: part, Clustering: key(k)}); err != nil {
						t.Fatal(err)
					}
				}
			}
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Abort(ctx)
			for range rng.IntN(12) {
				k := rng.IntN(keys)
				switch rng.IntN(3) {
				case 0:
					err = tx.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: key(k),
						Values: storage.Values{"a": storage.BigInt(int64(1000 + k)), "b": storage.Text("own")}})
				case 1: // partial: b keeps its committed value, or NULL for a new row
					err = tx.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part, Clustering: key(k),
						Values: storage.Values{"a": storage.BigInt(int64(2000 + k))}})
				default:
					err = tx.Delete(ctx, &storage.Delete{Namespace: "n", Table: "t", Partition: part, Clustering: key(k)})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			for range 60 {
				s := &storage.Scan{Namespace: "n", Table: "t", Partition: part}
				if rng.IntN(2) == 0 {
					s.Start = &storage.Bound{Key: key(rng.IntN(keys)), Inclusive: rng.IntN(2) == 0}
				}
				if rng.IntN(2) == 0 {
					s.End = &storage.Bound{Key: key(rng.IntN(keys)), Inclusive: rng.IntN(2) == 0}
				}
				if rng.IntN(2) == 0 {
					s.Order = storage.Desc
				}
				all := scanAll(t, tx, s)
				s.Limit = 1 + rng.IntN(8)
				got := scanAll(t, tx, s)
				want := all[:min(len(all), s.Limit)]
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("scan %+v (start %v, end %v):\n got %v\nwant %v", *s, s.Start, s.End, got, want)
				}
			}
		})
	}
}

// TestLimitedScanReadsOnlyWhatItReturns: the latest versions of a long
// history, read with a limit, cost what they return, not the history.
func TestLimitedScanReadsOnlyWhatItReturns(t *testing.T) {
	ctx := t.Context()
	db := twoColumnTable(t)
	part := storage.Values{"p": storage.BigInt(1)}
	err := storage.Update(ctx, db, func(tx storage.Txn) error {
		for k := range 5000 {
			if err := tx.Put(ctx, &storage.Put{Namespace: "n", Table: "t", Partition: part,
				Clustering: storage.Values{"k": storage.BigInt(int64(k))}, Values: storage.Values{"a": storage.BigInt(int64(k))}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, order := range []storage.Order{storage.Asc, storage.Desc} {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows := scanAll(t, tx, &storage.Scan{Namespace: "n", Table: "t", Partition: part, Order: order, Limit: 10})
		if len(rows) != 10 {
			t.Fatalf("order %v: %d rows, want 10", order, len(rows))
		}
		if n := len(tx.(*Txn).x.reads); n != 10 {
			t.Errorf("order %v: the scan read %d records for 10 rows", order, n)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
