package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

// TestPartialPutRoomReused runs transactions back to back, so they share
// pooled cores: each sets one rotating column of many rows (partial Puts,
// whose columns live in room the core reuses, and more of them than that
// room first holds) and one whole row. Every row must read back as the
// model says, in the transaction and after it: a partial Put that saw an
// earlier transaction's set flags, or a whole row installed from reused
// room, would not.
func TestPartialPutRoomReused(t *testing.T) {
	db := opener(engine.Config{})(t)
	defer db.Close()
	ctx := context.Background()
	cols := []string{"a", "b", "c"}
	tb := &storage.Table{Namespace: "reuse", Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}}}
	for _, c := range cols {
		tb.Columns = append(tb.Columns, storage.Column{Name: c, Type: storage.TypeText})
	}
	if err := db.CreateNamespace(ctx, "reuse"); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	key := func(k int) storage.Values { return storage.Values{"k": storage.BigInt(int64(k))} }
	check := func(tx interface {
		Get(context.Context, *storage.Get) (storage.Row, bool, error)
	}, k int, want map[string]string, when string) {
		t.Helper()
		row, ok, err := tx.Get(ctx, &storage.Get{Namespace: "reuse", Table: "t", Partition: key(k)})
		if err != nil || !ok {
			t.Fatalf("%s: get %d: %v, found %v", when, k, err, ok)
		}
		for _, c := range cols {
			got := ""
			if v := row[c]; !v.IsNull() {
				got = v.AsText()
			}
			if got != want[c] {
				t.Fatalf("%s: row %d column %s = %q, want %q", when, k, c, got, want[c])
			}
		}
	}
	const rows = 20
	model := map[int]map[string]string{}
	for k := range rows + 1 {
		model[k] = map[string]string{}
	}
	for round := range 150 {
		err := storage.Update(ctx, db, func(tx storage.Txn) error {
			whole := storage.Values{}
			for _, c := range cols {
				whole[c] = storage.Text(fmt.Sprintf("whole-%d-%s", round, c))
			}
			if err := tx.Put(ctx, &storage.Put{Namespace: "reuse", Table: "t", Partition: key(0), Values: whole}); err != nil {
				return err
			}
			for k := 1; k <= rows; k++ {
				c := cols[(round+k)%len(cols)]
				err := tx.Put(ctx, &storage.Put{Namespace: "reuse", Table: "t", Partition: key(k),
					Values: storage.Values{c: storage.Text(fmt.Sprintf("%d-%d", round, k))}})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cols {
			model[0][c] = fmt.Sprintf("whole-%d-%s", round, c)
		}
		for k := 1; k <= rows; k++ {
			model[k][cols[(round+k)%len(cols)]] = fmt.Sprintf("%d-%d", round, k)
		}
		// A second partial Put to a row this transaction already wrote
		// partially, read back inside the transaction.
		err = storage.Update(ctx, db, func(tx storage.Txn) error {
			for _, c := range cols[:2] {
				if err := tx.Put(ctx, &storage.Put{Namespace: "reuse", Table: "t", Partition: key(1),
					Values: storage.Values{c: storage.Text(fmt.Sprintf("again-%d-%s", round, c))}}); err != nil {
					return err
				}
			}
			want := map[string]string{"a": fmt.Sprintf("again-%d-a", round), "b": fmt.Sprintf("again-%d-b", round), "c": model[1]["c"]}
			check(tx, 1, want, fmt.Sprintf("round %d, in the transaction", round))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		model[1]["a"], model[1]["b"] = fmt.Sprintf("again-%d-a", round), fmt.Sprintf("again-%d-b", round)
		for k := range rows + 1 {
			check(db, k, model[k], fmt.Sprintf("round %d", round))
		}
	}
}

// TestScanRoomHandedOnOnce closes scans twice and then holds two scans
// open at once: the room a closed scan hands on must go to one later scan
// only, or the second would overwrite the first's rows.
func TestScanRoomHandedOnOnce(t *testing.T) {
	db := clusteredStore(t)
	ctx := context.Background()
	scan := func(p string) storage.Rows {
		rows, err := db.Scan(ctx, &storage.Scan{Namespace: "reuse", Table: "c", Partition: storage.Values{"p": storage.Text(p)}})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	read := func(rows storage.Rows, p string) {
		t.Helper()
		n := 0
		for rows.Next() {
			if got, want := rows.Row()["v"].AsText(), fmt.Sprintf("%s-%d", p, n); got != want {
				t.Fatalf("partition %s row %d: v = %q, want %q", p, n, got, want)
			}
			n++
		}
		if n != 10 {
			t.Fatalf("partition %s: %d rows, want 10", p, n)
		}
	}
	for range 50 {
		first := scan("x")
		first.Next()
		first.Close()
		first.Close()
		if first.Next() {
			t.Fatal("a closed scan has rows")
		}
		b, c := scan("x"), scan("y")
		read(b, "x")
		read(c, "y")
		b.Close()
		c.Close()
	}
}

func clusteredStore(t *testing.T) storage.Backend {
	t.Helper()
	db := opener(engine.Config{})(t)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	tb := &storage.Table{Namespace: "reuse", Name: "c", PartitionKey: []storage.Column{{Name: "p", Type: storage.TypeText}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "i", Type: storage.TypeBigInt, Order: storage.Asc}},
		Columns:       []storage.Column{{Name: "v", Type: storage.TypeText}}}
	if err := db.CreateNamespace(ctx, "reuse"); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, tb); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"x", "y"} {
		for i := range 10 {
			err := db.Put(ctx, &storage.Put{Namespace: "reuse", Table: "c", Partition: storage.Values{"p": storage.Text(p)},
				Clustering: storage.Values{"i": storage.BigInt(int64(i))}, Values: storage.Values{"v": storage.Text(fmt.Sprintf("%s-%d", p, i))}})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return db
}
