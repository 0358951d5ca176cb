package storagetest

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

func testAdmin(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	e.is(e.db.CreateNamespace(e.ctx, e.ns), storage.ErrNamespaceExists)
	nss, err := e.db.ListNamespaces(e.ctx)
	e.ok(err)
	if !slices.Contains(nss, e.ns) || !slices.IsSorted(nss) {
		t.Fatalf("ListNamespaces = %v, want sorted and holding %s", nss, e.ns)
	}

	full := &storage.Table{Namespace: e.ns, Name: "b_full",
		PartitionKey:  cols(col("p1", storage.TypeText), col("p2", storage.TypeBigInt)),
		ClusteringKey: []storage.ClusteringColumn{ccol("c1", storage.TypeTimestamp, storage.Desc), ccol("c2", storage.TypeBlob, storage.Asc)},
		Columns: cols(col("v_bool", storage.TypeBoolean), col("v_int", storage.TypeBigInt), col("v_dbl", storage.TypeDouble),
			col("v_txt", storage.TypeText), col("v_blob", storage.TypeBlob), col("v_ts", storage.TypeTimestamp)),
	}
	e.ok(e.db.CreateTable(e.ctx, full))
	e.is(e.db.CreateTable(e.ctx, full), storage.ErrTableExists)
	got, err := e.db.DescribeTable(e.ctx, e.ns, "b_full")
	e.ok(err)
	if !got.Equal(full) {
		t.Fatalf("DescribeTable = %+v, want %+v", got, full)
	}
	e.table("a_min", cols(col("k", storage.TypeBigInt)), nil, nil)
	tables, err := e.db.ListTables(e.ctx, e.ns)
	e.ok(err)
	if !slices.Equal(tables, []string{"a_min", "b_full"}) {
		t.Fatalf("ListTables = %v", tables)
	}

	missing := e.ns + "_missing"
	e.is(e.db.CreateTable(e.ctx, &storage.Table{Namespace: missing, Name: "t", PartitionKey: cols(col("k", storage.TypeBigInt))}), storage.ErrNamespaceNotFound)
	_, err = e.db.DescribeTable(e.ctx, e.ns, "nope")
	e.is(err, storage.ErrTableNotFound)
	_, err = e.db.DescribeTable(e.ctx, missing, "t")
	e.is(err, storage.ErrNamespaceNotFound)
	_, err = e.db.ListTables(e.ctx, missing)
	e.is(err, storage.ErrNamespaceNotFound)
	e.is(e.db.DropTable(e.ctx, e.ns, "nope"), storage.ErrTableNotFound)
	e.is(e.db.DropNamespace(e.ctx, missing), storage.ErrNamespaceNotFound)
	e.is(e.db.DropNamespace(e.ctx, e.ns), storage.ErrNamespaceNotEmpty)

	// Schemas that are not valid.
	bad := []struct {
		name string
		tb   storage.Table
		want error
	}{
		{"no partition key", storage.Table{Name: "t", Columns: cols(col("v", storage.TypeBigInt))}, storage.ErrInvalidSchema},
		{"double key", storage.Table{Name: "t", PartitionKey: cols(col("k", storage.TypeDouble))}, storage.ErrInvalidSchema},
		{"double clustering", storage.Table{Name: "t", PartitionKey: cols(col("k", storage.TypeBigInt)),
			ClusteringKey: []storage.ClusteringColumn{ccol("c", storage.TypeDouble, storage.Asc)}}, storage.ErrInvalidSchema},
		{"duplicate column", storage.Table{Name: "t", PartitionKey: cols(col("k", storage.TypeBigInt)), Columns: cols(col("k", storage.TypeText))}, storage.ErrInvalidSchema},
		{"unknown type", storage.Table{Name: "t", PartitionKey: cols(col("k", 0))}, storage.ErrInvalidSchema},
		{"bad order", storage.Table{Name: "t", PartitionKey: cols(col("k", storage.TypeBigInt)),
			ClusteringKey: []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, 7)}}, storage.ErrInvalidSchema},
		{"empty table name", storage.Table{Name: "", PartitionKey: cols(col("k", storage.TypeBigInt))}, storage.ErrInvalidName},
		{"upper-case name", storage.Table{Name: "Tab", PartitionKey: cols(col("k", storage.TypeBigInt))}, storage.ErrInvalidName},
		{"bad column name", storage.Table{Name: "t", PartitionKey: cols(col("k-1", storage.TypeBigInt))}, storage.ErrInvalidName},
		{"long name", storage.Table{Name: strings.Repeat("t", storage.MaxNameLen+1), PartitionKey: cols(col("k", storage.TypeBigInt))}, storage.ErrInvalidName},
	}
	for _, b := range bad {
		tb := b.tb
		tb.Namespace = e.ns
		if err := e.db.CreateTable(e.ctx, &tb); !errorsIs(err, b.want) {
			t.Errorf("%s: CreateTable = %v, want %v", b.name, err, b.want)
		}
	}
	for _, name := range []string{"", "public", "pg_catalog", "kiroku_meta", "Upper", "1abc", "a b"} {
		if err := e.db.CreateNamespace(e.ctx, name); !errorsIs(err, storage.ErrInvalidName) {
			t.Errorf("CreateNamespace(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	tables, err = e.db.ListTables(e.ctx, e.ns)
	e.ok(err)
	if len(tables) != 2 {
		t.Fatalf("bad CreateTable calls changed the namespace: %v", tables)
	}

	// Drop, use after drop, recreate with another schema.
	e.put(full, V{"p1": txt("x"), "p2": i64(1)}, V{"c1": storage.TimestampMicros(5), "c2": storage.Blob([]byte{1})}, V{"v_int": i64(1)})
	e.ok(e.db.DropTable(e.ctx, e.ns, "b_full"))
	_, _, err = e.db.Get(e.ctx, &storage.Get{Namespace: e.ns, Table: "b_full", Partition: V{"p1": txt("x"), "p2": i64(1)}})
	e.is(err, storage.ErrTableNotFound)
	re := e.table("b_full", cols(col("id", storage.TypeText)), nil, cols(col("n", storage.TypeBigInt)))
	e.put(re, V{"id": txt("x")}, nil, V{"n": i64(9)})
	row, ok := e.get(re, V{"id": txt("x")}, nil)
	if !ok {
		t.Fatal("row in recreated table not found")
	}
	e.rowEq(row, V{"id": txt("x"), "n": i64(9)})

	// An empty namespace can be dropped and created again.
	e.ok(e.db.DropTable(e.ctx, e.ns, "a_min"))
	e.ok(e.db.DropTable(e.ctx, e.ns, "b_full"))
	e.ok(e.db.DropNamespace(e.ctx, e.ns))
	e.ok(e.db.CreateNamespace(e.ctx, e.ns))
}

func testRestart(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := e.table("kept", cols(col("k", storage.TypeText)),
		[]storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Desc)}, cols(col("v", storage.TypeBlob)))
	e.put(tb, V{"k": txt("a")}, V{"c": i64(1)}, V{"v": storage.Blob([]byte("one"))})
	e.reopen()
	got, err := e.db.DescribeTable(e.ctx, e.ns, "kept")
	e.ok(err)
	if !got.Equal(tb) {
		t.Fatalf("after restart DescribeTable = %+v, want %+v", got, tb)
	}
	row, ok := e.get(tb, V{"k": txt("a")}, V{"c": i64(1)})
	if !ok {
		t.Fatal("row lost across restart")
	}
	e.rowEq(row, V{"k": txt("a"), "c": i64(1), "v": storage.Blob([]byte("one"))})
	nss, err := e.db.ListNamespaces(e.ctx)
	e.ok(err)
	if !slices.Contains(nss, e.ns) {
		t.Fatalf("namespace lost across restart: %v", nss)
	}
}

// itemTable is the table most functional tests use.
func itemTable(e *env) *storage.Table {
	return e.table("items", cols(col("id", storage.TypeBigInt)),
		[]storage.ClusteringColumn{ccol("seq", storage.TypeBigInt, storage.Asc)},
		cols(col("i", storage.TypeBigInt), col("s", storage.TypeText), col("d", storage.TypeDouble),
			col("b", storage.TypeBlob), col("f", storage.TypeBoolean), col("ts", storage.TypeTimestamp), col("mark", storage.TypeBigInt)))
}

// seq is the clustering key of row s of itemTable.
func seq(s int64) V { return V{"seq": i64(s)} }

func testCRUD(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := itemTable(e)
	p, c := V{"id": i64(1)}, V{"seq": i64(1)}
	if _, ok := e.get(tb, p, c); ok {
		t.Fatal("Get of a missing row found one")
	}
	e.put(tb, p, c, V{"i": i64(7), "s": txt("seven"), "b": storage.Blob([]byte{7})})
	row, ok := e.get(tb, p, c)
	if !ok {
		t.Fatal("Get after Put found nothing")
	}
	e.rowEq(row, V{"id": i64(1), "seq": i64(1), "i": i64(7), "s": txt("seven"), "d": storage.NullOf(storage.TypeDouble),
		"b": storage.Blob([]byte{7}), "f": storage.NullOf(storage.TypeBoolean), "ts": storage.NullOf(storage.TypeTimestamp),
		"mark": storage.NullOf(storage.TypeBigInt)})

	// Projection.
	row, _ = e.get(tb, p, c, "s", "id")
	e.rowEq(row, V{"s": txt("seven"), "id": i64(1)})

	// A Put of some columns keeps the others; Null() clears one.
	e.put(tb, p, c, V{"i": i64(8), "b": storage.Null()})
	row, _ = e.get(tb, p, c, "i", "s", "b")
	e.rowEq(row, V{"i": i64(8), "s": txt("seven"), "b": storage.NullOf(storage.TypeBlob)})

	// A Put with no values creates the row with every value NULL, and
	// leaves an existing row as it is.
	e.put(tb, V{"id": i64(2)}, c, nil)
	row, ok = e.get(tb, V{"id": i64(2)}, c, "i")
	if !ok {
		t.Fatal("Put without values did not create the row")
	}
	e.rowEq(row, V{"i": storage.NullOf(storage.TypeBigInt)})
	e.put(tb, p, c, nil)
	row, _ = e.get(tb, p, c, "i")
	e.rowEq(row, V{"i": i64(8)})

	// Rows are distinct per partition and clustering key.
	e.put(tb, p, V{"seq": i64(2)}, V{"i": i64(20)})
	row, _ = e.get(tb, p, c, "i")
	e.rowEq(row, V{"i": i64(8)})

	// Delete, and delete of a missing row.
	e.ok(e.db.Delete(e.ctx, &storage.Delete{Namespace: e.ns, Table: "items", Partition: p, Clustering: c}))
	if _, ok := e.get(tb, p, c); ok {
		t.Fatal("row still there after Delete")
	}
	e.ok(e.db.Delete(e.ctx, &storage.Delete{Namespace: e.ns, Table: "items", Partition: p, Clustering: c}))
	if _, ok := e.get(tb, p, V{"seq": i64(2)}); !ok {
		t.Fatal("Delete removed a neighbouring row")
	}

	// A table without clustering key.
	kv := e.table("kv", cols(col("k", storage.TypeText), col("k2", storage.TypeBoolean)), nil, cols(col("v", storage.TypeText)))
	e.put(kv, V{"k": txt("a"), "k2": storage.Bool(true)}, nil, V{"v": txt("A")})
	e.put(kv, V{"k": txt("a"), "k2": storage.Bool(false)}, nil, V{"v": txt("B")})
	row, _ = e.get(kv, V{"k": txt("a"), "k2": storage.Bool(true)}, nil)
	e.rowEq(row, V{"k": txt("a"), "k2": storage.Bool(true), "v": txt("A")})
	rows := e.scan(&storage.Scan{Namespace: e.ns, Table: "kv", Partition: V{"k": txt("a"), "k2": storage.Bool(false)}})
	if len(rows) != 1 || !rows[0]["v"].Equal(txt("B")) {
		t.Fatalf("scan of a one-row partition = %v", rows)
	}
}

// errorsIs reports whether err is a *storage.Error of the target kind.
func errorsIs(err, target error) bool {
	var se *storage.Error
	return errors.As(err, &se) && errors.Is(err, target)
}

func testConditions(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := itemTable(e)
	key := func(id int64) (V, V) { return V{"id": i64(id)}, V{"seq": i64(0)} }
	putC := func(id int64, cond *storage.Condition, vals V) error {
		p, c := key(id)
		return e.db.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: c, Values: vals, Condition: cond})
	}
	delC := func(id int64, cond *storage.Condition) error {
		p, c := key(id)
		return e.db.Delete(e.ctx, &storage.Delete{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: c, Condition: cond})
	}
	mark := func(id int64) (storage.Value, bool) {
		p, c := key(id)
		row, ok := e.get(tb, p, c, "mark")
		return row["mark"], ok
	}

	// IfNotExists.
	e.ok(putC(1, storage.IfNotExists(), V{"mark": i64(1)}))
	e.is(putC(1, storage.IfNotExists(), V{"mark": i64(2)}), storage.ErrConditionNotMet)
	if m, _ := mark(1); !m.Equal(i64(1)) {
		t.Fatalf("failed IfNotExists wrote: mark = %v", m)
	}
	// IfExists.
	e.is(putC(2, storage.IfExists(), V{"mark": i64(1)}), storage.ErrConditionNotMet)
	if _, ok := mark(2); ok {
		t.Fatal("failed IfExists created the row")
	}
	e.ok(putC(1, storage.IfExists(), V{"mark": i64(3)}))
	if m, _ := mark(1); !m.Equal(i64(3)) {
		t.Fatalf("IfExists put: mark = %v", m)
	}
	e.ok(putC(1, storage.IfExists(), nil))
	e.is(delC(2, storage.IfExists()), storage.ErrConditionNotMet)
	e.ok(delC(1, storage.IfExists()))
	if _, ok := mark(1); ok {
		t.Fatal("IfExists delete left the row")
	}
	// If on a missing row never holds, not even IS NULL.
	e.is(putC(3, storage.If(storage.IsNull("i")), V{"mark": i64(1)}), storage.ErrConditionNotMet)
	e.is(delC(3, storage.If(storage.IsNull("i"))), storage.ErrConditionNotMet)
	if _, ok := mark(3); ok {
		t.Fatal("failed If created the row")
	}

	// Every operator, met and not met, on every type, for Put and Delete.
	ts := storage.TimestampMicros(1_000_000)
	base := V{"i": i64(10), "s": txt("m"), "d": storage.Double(1.5), "b": storage.Blob([]byte{5, 6}),
		"f": storage.Bool(true), "ts": ts, "mark": i64(0)}
	cases := []struct {
		expr storage.Expr
		met  bool
	}{
		{storage.Eq("i", i64(10)), true}, {storage.Eq("i", i64(11)), false},
		{storage.Ne("i", i64(11)), true}, {storage.Ne("i", i64(10)), false},
		{storage.Lt("i", i64(11)), true}, {storage.Lt("i", i64(10)), false},
		{storage.Le("i", i64(10)), true}, {storage.Le("i", i64(9)), false},
		{storage.Gt("i", i64(9)), true}, {storage.Gt("i", i64(10)), false},
		{storage.Ge("i", i64(10)), true}, {storage.Ge("i", i64(11)), false},
		{storage.Eq("s", txt("m")), true}, {storage.Lt("s", txt("m")), false}, {storage.Gt("s", txt("l")), true},
		{storage.Eq("s", txt("")), false}, {storage.Gt("s", txt("")), true},
		{storage.Eq("d", storage.Double(1.5)), true}, {storage.Lt("d", storage.Double(1.5)), false},
		{storage.Lt("d", storage.Double(2)), true}, {storage.Gt("d", storage.Double(-1e300)), true},
		{storage.Eq("b", storage.Blob([]byte{5, 6})), true}, {storage.Lt("b", storage.Blob([]byte{5, 7})), true},
		{storage.Gt("b", storage.Blob([]byte{5, 6, 0})), false},
		{storage.Eq("f", storage.Bool(true)), true}, {storage.Lt("f", storage.Bool(true)), false},
		{storage.Gt("f", storage.Bool(false)), true},
		{storage.Eq("ts", ts), true}, {storage.Gt("ts", storage.TimestampMicros(999_999)), true},
		{storage.Lt("ts", ts), false},
		{storage.IsNotNull("i"), true}, {storage.IsNull("i"), false},
		{storage.IsNull("mark"), false},
		// Comparisons with a key column work too.
		{storage.Eq("id", i64(100)), true}, {storage.Ne("id", i64(100)), false},
	}
	for i, c := range cases {
		e.put(tb, V{"id": i64(100)}, V{"seq": i64(0)}, base)
		err := putC(100, storage.If(c.expr), V{"mark": i64(int64(i) + 1)})
		m, _ := mark(100)
		if c.met {
			if err != nil || !m.Equal(i64(int64(i)+1)) {
				t.Errorf("put If(%s %v %v): err %v, mark %v; want the write", c.expr.Column, c.expr.Op, c.expr.Value, err, m)
			}
		} else if !errors.Is(err, storage.ErrConditionNotMet) || !m.Equal(i64(0)) {
			t.Errorf("put If(%s %v %v): err %v, mark %v; want ErrConditionNotMet and no write", c.expr.Column, c.expr.Op, c.expr.Value, err, m)
		}
		e.put(tb, V{"id": i64(100)}, V{"seq": i64(0)}, base)
		err = delC(100, storage.If(c.expr))
		_, exists := mark(100)
		if c.met && (err != nil || exists) {
			t.Errorf("delete If(%s %v %v): err %v, exists %v; want the delete", c.expr.Column, c.expr.Op, c.expr.Value, err, exists)
		}
		if !c.met && (!errors.Is(err, storage.ErrConditionNotMet) || !exists) {
			t.Errorf("delete If(%s %v %v): err %v, exists %v; want ErrConditionNotMet and the row kept", c.expr.Column, c.expr.Op, c.expr.Value, err, exists)
		}
	}

	// NULL columns: comparisons are false, IS NULL true.
	e.put(tb, V{"id": i64(200)}, V{"seq": i64(0)}, V{"mark": i64(0)})
	for _, x := range []storage.Expr{storage.Eq("i", i64(1)), storage.Ne("i", i64(1)), storage.Lt("s", txt("z")), storage.IsNotNull("d")} {
		e.is(putC(200, storage.If(x), V{"mark": i64(1)}), storage.ErrConditionNotMet)
	}
	e.ok(putC(200, storage.If(storage.IsNull("i"), storage.IsNull("s"), storage.IsNotNull("mark")), V{"mark": i64(2)}))
	// AND: one false expression fails the whole condition.
	e.is(putC(200, storage.If(storage.Eq("mark", i64(2)), storage.IsNotNull("i")), V{"mark": i64(3)}), storage.ErrConditionNotMet)
	if m, _ := mark(200); !m.Equal(i64(2)) {
		t.Fatalf("mark = %v, want 2", m)
	}

	// DOUBLE edge cases follow one total order: NaN equals NaN and is
	// greater than +Inf; -0 equals +0.
	for _, c := range []struct {
		stored float64
		expr   storage.Expr
		met    bool
	}{
		{math.NaN(), storage.Eq("d", storage.Double(math.NaN())), true},
		{math.NaN(), storage.Gt("d", storage.Double(math.Inf(1))), true},
		{math.NaN(), storage.Ne("d", storage.Double(math.NaN())), false},
		{math.Inf(1), storage.Lt("d", storage.Double(math.NaN())), true},
		{math.Inf(-1), storage.Lt("d", storage.Double(-1e308)), true},
		{math.Copysign(0, -1), storage.Eq("d", storage.Double(0)), true},
		{math.Copysign(0, -1), storage.Lt("d", storage.Double(0)), false},
	} {
		e.put(tb, V{"id": i64(300)}, V{"seq": i64(0)}, V{"d": storage.Double(c.stored), "mark": i64(0)})
		err := putC(300, storage.If(c.expr), V{"mark": i64(1)})
		m, _ := mark(300)
		if c.met && (err != nil || !m.Equal(i64(1))) || !c.met && (!errors.Is(err, storage.ErrConditionNotMet) || !m.Equal(i64(0))) {
			t.Errorf("stored %v, If(d %v %v): err = %v, mark %v; want met=%v", c.stored, c.expr.Op, c.expr.Value, err, m, c.met)
		}
	}
}

func testMutate(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := itemTable(e)
	p := V{"id": i64(1)}
	put := func(s, v int64, cond *storage.Condition) *storage.Put {
		return &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Values: V{"i": i64(v)}, Condition: cond}
	}
	del := func(s int64, cond *storage.Condition) *storage.Delete {
		return &storage.Delete{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Condition: cond}
	}
	e.put(tb, p, seq(9), V{"i": i64(9)})
	e.ok(e.db.Mutate(e.ctx, []storage.Mutation{put(1, 1, nil), put(2, 2, storage.IfNotExists()), del(9, storage.IfExists())}))
	got := e.scan(&storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: p, Projection: []string{"seq", "i"}})
	if len(got) != 2 || !got[0]["i"].Equal(i64(1)) || !got[1]["i"].Equal(i64(2)) {
		t.Fatalf("after Mutate: %v", got)
	}
	// A failing condition anywhere writes nothing at all.
	for _, ms := range [][]storage.Mutation{
		{put(3, 3, nil), put(1, 100, storage.IfNotExists())},
		{del(1, nil), put(4, 4, nil), del(9, storage.IfExists())},
		{put(2, 20, storage.If(storage.Eq("i", i64(2)))), put(1, 10, storage.If(storage.Eq("i", i64(99))))},
	} {
		e.is(e.db.Mutate(e.ctx, ms), storage.ErrConditionNotMet)
		got := e.scan(&storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: p, Projection: []string{"seq", "i"}})
		if len(got) != 2 || !got[0]["i"].Equal(i64(1)) || !got[1]["i"].Equal(i64(2)) {
			t.Fatalf("failed Mutate wrote something: %v", got)
		}
	}
	// Mutations must share one partition of one table.
	other := &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"id": i64(2)}, Clustering: seq(1), Values: V{"i": i64(1)}}
	e.is(e.db.Mutate(e.ctx, []storage.Mutation{put(5, 5, nil), other}), storage.ErrInvalidArgument)
	e.is(e.db.Mutate(e.ctx, nil), storage.ErrInvalidArgument)
	if _, ok := e.get(tb, p, seq(5)); ok {
		t.Fatal("rejected Mutate wrote")
	}
}
