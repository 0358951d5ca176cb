package storagetest

import (
	"slices"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// testEnsureTables: EnsureTables creates what is missing, accepts what is
// already there with the same schema, and refuses a table of another
// schema with ErrInvalidSchema, before it creates anything.
func testEnsureTables(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	a := &storage.Table{Namespace: e.ns, Name: "ens_a", PartitionKey: cols(col("k", storage.TypeText)),
		ClusteringKey: []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Desc)},
		Columns:       cols(col("v", storage.TypeBlob))}
	b := &storage.Table{Namespace: e.ns, Name: "ens_b", PartitionKey: cols(col("k", storage.TypeBigInt)),
		Columns: cols(col("v", storage.TypeText))}
	e.ok(storage.EnsureTables(e.ctx, e.db, e.ns, []*storage.Table{a, b}))
	e.ok(storage.EnsureTables(e.ctx, e.db, e.ns, []*storage.Table{a, b})) // again: all there
	for _, want := range []*storage.Table{a, b} {
		got, err := e.db.DescribeTable(e.ctx, e.ns, want.Name)
		e.ok(err)
		if !got.Equal(want) {
			t.Fatalf("DescribeTable(%s) = %+v, want %+v", want.Name, got, want)
		}
	}

	// Each difference a layout can have is refused; c, listed first and
	// missing, is not created.
	c := &storage.Table{Namespace: e.ns, Name: "ens_c", PartitionKey: cols(col("k", storage.TypeText))}
	variants := map[string]*storage.Table{
		"column type":      {Namespace: e.ns, Name: "ens_b", PartitionKey: b.PartitionKey, Columns: cols(col("v", storage.TypeBlob))},
		"extra column":     {Namespace: e.ns, Name: "ens_b", PartitionKey: b.PartitionKey, Columns: cols(col("v", storage.TypeText), col("w", storage.TypeText))},
		"key type":         {Namespace: e.ns, Name: "ens_b", PartitionKey: cols(col("k", storage.TypeText)), Columns: b.Columns},
		"clustering key":   {Namespace: e.ns, Name: "ens_b", PartitionKey: b.PartitionKey, ClusteringKey: []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Asc)}, Columns: b.Columns},
		"clustering order": {Namespace: e.ns, Name: "ens_a", PartitionKey: a.PartitionKey, ClusteringKey: []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Asc)}, Columns: a.Columns},
	}
	for name, v := range variants {
		e.is(storage.EnsureTables(e.ctx, e.db, e.ns, []*storage.Table{c, a, v}), storage.ErrInvalidSchema)
		tables, err := e.db.ListTables(e.ctx, e.ns)
		e.ok(err)
		if slices.Contains(tables, "ens_c") {
			t.Fatalf("%s: a refused EnsureTables created ens_c", name)
		}
	}
	got, err := e.db.DescribeTable(e.ctx, e.ns, "ens_b")
	e.ok(err)
	if !got.Equal(b) {
		t.Fatalf("a refused EnsureTables changed ens_b to %+v", got)
	}
}
