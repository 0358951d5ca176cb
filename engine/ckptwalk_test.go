package engine_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

// BenchmarkCheckpointVersions writes checkpoints of 300,000 rows shaped
// like the ledger's asset versions (eleven columns, most of them short
// strings), inserted in random order as a running ledger scatters them
// over the heap. It reports the time per row: the walk's cache misses
// dominate it.
func BenchmarkCheckpointVersions(b *testing.B) {
	ctx := context.Background()
	db, err := engine.Open(engine.Config{Dir: b.TempDir(), CheckpointInterval: -1, CheckpointDeltaShare: -1}) // full ones
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	text := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeText} }
	blob := func(n string) storage.Column { return storage.Column{Name: n, Type: storage.TypeBlob} }
	tb := &storage.Table{Namespace: "l", Name: "assets", PartitionKey: []storage.Column{text("id")},
		ClusteringKey: []storage.ClusteringColumn{{Name: "age", Type: storage.TypeBigInt, Order: storage.Asc}},
		Columns: []storage.Column{text("input"), text("output"), text("contract"), blob("argument"), text("nonce"), text("entity"),
			{Name: "key_version", Type: storage.TypeBigInt}, blob("signature"), blob("prev_hash"), blob("hash"), blob("proof_sig")}}
	if err := db.CreateNamespace(ctx, "l"); err != nil {
		b.Fatal(err)
	}
	if err := db.CreateTable(ctx, tb); err != nil {
		b.Fatal(err)
	}
	const assets, versions = 100_000, 3
	order := rand.New(rand.NewPCG(1, 2)).Perm(assets * versions)
	h := strings.Repeat("h", 32)
	var ms []*storage.Put
	flush := func() {
		if err := storage.Update(ctx, db, func(tx storage.Txn) error {
			for _, m := range ms {
				if err := tx.Put(ctx, m); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		ms = ms[:0]
	}
	for n, i := range order {
		id, age := fmt.Sprintf("y%d", i/versions), int64(i%versions)
		ms = append(ms, &storage.Put{Namespace: "l", Table: "assets",
			Partition: storage.Values{"id": storage.Text(id)}, Clustering: storage.Values{"age": storage.BigInt(age)},
			Values: storage.Values{"input": storage.Text(fmt.Sprintf(`{"%s":%d}`, id, age)), "output": storage.Text(strings.Repeat("o", 120)),
				"contract": storage.Text("builtin.ycsb_f"), "argument": storage.Blob([]byte(strings.Repeat("a", 130))),
				"nonce": storage.Text(fmt.Sprintf("nonce-%016d", n)), "entity": storage.Text("bench"), "key_version": storage.BigInt(1),
				"signature": storage.Blob([]byte(h)), "prev_hash": storage.Blob([]byte(h)), "hash": storage.Blob([]byte(h)),
				"proof_sig": storage.Blob([]byte(h))}})
		if len(ms) == 500 {
			flush()
		}
	}
	flush()
	b.ResetTimer()
	var rows int
	for b.Loop() {
		st, err := db.Checkpoint(ctx)
		if err != nil {
			b.Fatal(err)
		}
		rows += st.Rows
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows), "ns/row")
}

// TestCheckpointBatchBoundaries: a checkpoint's walk goes a batch of
// records at a time. A table without clustering key, one whose partitions
// hold more records than a batch, and deleted (absent) records among them
// must come out exactly: the checkpoint counts the live rows, and an
// engine opened from it alone (its log truncated) holds them.
func TestCheckpointBatchBoundaries(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	cfg := engine.Config{Dir: "/db", FS: fs, EpochInterval: time.Millisecond, CheckpointInterval: -1}
	db, err := engine.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clustered := &storage.Table{Namespace: "b", Name: "versions", PartitionKey: []storage.Column{{Name: "id", Type: storage.TypeText}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "age", Type: storage.TypeBigInt, Order: storage.Asc}},
		Columns:       []storage.Column{{Name: "v", Type: storage.TypeText}}}
	for _, tb := range []*storage.Table{blobTable, clustered} {
		if err := db.CreateNamespace(ctx, tb.Namespace); err != nil && !errors.Is(err, storage.ErrNamespaceExists) {
			t.Fatal(err)
		}
		if err := db.CreateTable(ctx, tb); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{}
	put := func(p *storage.Put, label string) {
		if err := db.Put(ctx, p); err != nil {
			t.Fatal(err)
		}
		want[label] = fmt.Sprint(p.Values)
	}
	del := func(d *storage.Delete, label string) {
		if err := db.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
		delete(want, label)
	}
	for k := range 101 {
		put(&storage.Put{Namespace: "b", Table: "blobs", Partition: key(k), Values: storage.Values{"v": storage.Blob([]byte{byte(k)})}}, fmt.Sprint("blob ", k))
	}
	for _, k := range []int{0, 31, 32, 33, 100} {
		del(&storage.Delete{Namespace: "b", Table: "blobs", Partition: key(k)}, fmt.Sprint("blob ", k))
	}
	for p, n := range []int{1, 32, 33, 70} {
		id := storage.Values{"id": storage.Text(fmt.Sprint("p", p))}
		for age := range n {
			put(&storage.Put{Namespace: "b", Table: "versions", Partition: id, Clustering: storage.Values{"age": storage.BigInt(int64(age))},
				Values: storage.Values{"v": storage.Text(fmt.Sprintf("p%d@%d", p, age))}}, fmt.Sprintf("version p%d@%d", p, age))
		}
		if n > 1 {
			del(&storage.Delete{Namespace: "b", Table: "versions", Partition: id, Clustering: storage.Values{"age": storage.BigInt(int64(n - 1))}},
				fmt.Sprintf("version p%d@%d", p, n-1))
		}
	}
	st, err := db.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != len(want) {
		t.Errorf("the checkpoint wrote %d rows, want %d", st.Rows, len(want))
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Only the checkpoint: the log it covers goes.
	names, _ := fs.List("/db/log")
	for _, n := range names {
		if err := fs.Remove("/db/log/" + n); err != nil {
			t.Fatal(err)
		}
	}
	if db, err = engine.Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got := map[string]string{}
	for k := range 101 {
		row, ok, err := db.Get(ctx, &storage.Get{Namespace: "b", Table: "blobs", Partition: key(k)})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got[fmt.Sprint("blob ", k)] = fmt.Sprint(storage.Values{"v": row["v"]})
		}
	}
	for p := range 4 {
		rows, err := db.Scan(ctx, &storage.Scan{Namespace: "b", Table: "versions", Partition: storage.Values{"id": storage.Text(fmt.Sprint("p", p))}})
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			row := rows.Row()
			got[fmt.Sprintf("version p%d@%d", p, row["age"].AsBigInt())] = fmt.Sprint(storage.Values{"v": row["v"]})
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("recovered from the checkpoint:\n%v\nwant\n%v", got, want)
	}
}
