package validator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// TestMigratePending opens a Validator database that holds the table
// pending of the earlier layout (bucket | nonce → begin) and checks that
// ensureSchema moves every row to unvalidated and drops the old table,
// twice: the second time as after a crash before the drop, with the old
// table still full and the rows already moved.
func TestMigratePending(t *testing.T) {
	for _, name := range []string{"engine", "postgres"} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var db storage.Backend
			ns := DefaultNamespace
			if name == "engine" {
				db = openEngineDB(t)
			} else {
				db, ns = openPostgresDB(t), fmt.Sprintf("migrate_%d", time.Now().UnixNano())
				t.Cleanup(func() { dropNamespace(t, db, ns) })
			}
			if err := db.CreateNamespace(ctx, ns); err != nil {
				t.Fatal(err)
			}
			old := &storage.Table{Namespace: ns, Name: tPendingV1, PartitionKey: []storage.Column{{Name: "bucket", Type: storage.TypeBigInt}},
				ClusteringKey: []storage.ClusteringColumn{{Name: "nonce", Type: storage.TypeText, Order: storage.Asc}},
				Columns:       []storage.Column{{Name: "begin_clock", Type: storage.TypeBigInt}}}
			// More rows than one batch in some buckets; begin clocks not in
			// nonce order.
			want := map[string]int64{}
			for i := range 40 * batchSize / pendingBuckets {
				want[fmt.Sprintf("n%05d", i)] = int64(1000 + (i*7919)%5000)
			}
			for range 2 {
				if err := db.CreateTable(ctx, old); err != nil {
					t.Fatal(err)
				}
				for nonce, begin := range want {
					if err := db.Put(ctx, &storage.Put{Namespace: ns, Table: tPendingV1, Partition: storage.Values{"bucket": storage.BigInt(pendingBucket(nonce))},
						Clustering: storage.Values{"nonce": storage.Text(nonce)}, Values: storage.Values{"begin_clock": storage.BigInt(begin)}}); err != nil {
						t.Fatal(err)
					}
				}
				if err := ensureSchema(ctx, db, ns); err != nil {
					t.Fatal(err)
				}
				if _, err := db.DescribeTable(ctx, ns, tPendingV1); !errors.Is(err, storage.ErrTableNotFound) {
					t.Fatalf("old table still there: %v", err)
				}
				got := map[string]int64{}
				for b := range int64(pendingBuckets) {
					rows, err := db.Scan(ctx, &storage.Scan{Namespace: ns, Table: tPending, Partition: storage.Values{"bucket": storage.BigInt(b)}})
					if err != nil {
						t.Fatal(err)
					}
					last := int64(-1)
					for rows.Next() {
						r := rows.Row()
						nonce, begin := r["nonce"].AsText(), r["begin_clock"].AsBigInt()
						if pendingBucket(nonce) != b || begin < last {
							t.Fatalf("row %s (begin %d) in bucket %d after begin %d", nonce, begin, b, last)
						}
						last, got[nonce] = begin, begin
					}
					if err := errors.Join(rows.Err(), rows.Close()); err != nil {
						t.Fatal(err)
					}
				}
				if len(got) != len(want) {
					t.Fatalf("%d rows moved, want %d", len(got), len(want))
				}
				for n, b := range want {
					if got[n] != b {
						t.Fatalf("%s: begin %d, want %d", n, got[n], b)
					}
				}
			}
		})
	}
}

// A Validator database whose tables were laid out otherwise (another
// program's, or a later version's) is refused with ErrInvalidSchema, and no
// table is created in it.
func TestSchemaOfAnotherLayoutRefused(t *testing.T) {
	ctx := context.Background()
	db := openEngineDB(t)
	ns := DefaultNamespace
	if err := db.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, &storage.Table{Namespace: ns, Name: tTxs,
		PartitionKey: []storage.Column{{Name: "nonce", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "contract", Type: storage.TypeText}}}); err != nil {
		t.Fatal(err)
	}
	if err := ensureSchema(ctx, db, ns); !errors.Is(err, storage.ErrInvalidSchema) {
		t.Fatalf("ensureSchema = %v, want ErrInvalidSchema", err)
	}
	if names, err := db.ListTables(ctx, ns); err != nil || len(names) != 1 {
		t.Fatalf("tables after the refusal: %v (%v), want only %s", names, err, tTxs)
	}
}
