package storagetest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// testBadInput sends every kind of malformed request and checks each gets
// the specific typed error and that nothing in the table changed.
func testBadInput(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := e.table("strict", cols(col("p", storage.TypeBigInt), col("q", storage.TypeText)),
		[]storage.ClusteringColumn{ccol("a", storage.TypeBigInt, storage.Asc), ccol("b", storage.TypeText, storage.Desc)},
		cols(col("v", storage.TypeText), col("n", storage.TypeBigInt), col("blob", storage.TypeBlob)))
	lim := e.db.Limits()
	P := V{"p": i64(1), "q": txt("x")}
	C := V{"a": i64(1), "b": txt("k")}
	e.put(tb, P, C, V{"v": txt("original"), "n": i64(1)})
	snapshot := func() string {
		rows := e.scan(&storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: P})
		return fmt.Sprint(rows)
	}
	before := snapshot()

	ns, name := e.ns, tb.Name
	put := func(mod func(p *storage.Put)) func() error {
		return func() error {
			p := &storage.Put{Namespace: ns, Table: name, Partition: V{"p": i64(1), "q": txt("x")}, Clustering: V{"a": i64(2), "b": txt("k")},
				Values: V{"v": txt("bad")}}
			mod(p)
			return e.db.Put(e.ctx, p)
		}
	}
	get := func(mod func(g *storage.Get)) func() error {
		return func() error {
			g := &storage.Get{Namespace: ns, Table: name, Partition: V{"p": i64(1), "q": txt("x")}, Clustering: V{"a": i64(1), "b": txt("k")}}
			mod(g)
			_, _, err := e.db.Get(e.ctx, g)
			return err
		}
	}
	scan := func(mod func(s *storage.Scan)) func() error {
		return func() error {
			s := &storage.Scan{Namespace: ns, Table: name, Partition: V{"p": i64(1), "q": txt("x")}}
			mod(s)
			rows, err := e.db.Scan(e.ctx, s)
			if err == nil {
				_, err = storage.CollectRows(rows)
			}
			return err
		}
	}
	del := func(mod func(d *storage.Delete)) func() error {
		return func() error {
			d := &storage.Delete{Namespace: ns, Table: name, Partition: V{"p": i64(1), "q": txt("x")}, Clustering: V{"a": i64(1), "b": txt("k")}}
			mod(d)
			return e.db.Delete(e.ctx, d)
		}
	}
	txnPut := func(mod func(p *storage.Put)) func() error {
		return func() error {
			tx, err := e.backend().Begin(e.ctx)
			if err != nil {
				return err
			}
			defer tx.Abort(context.Background())
			p := &storage.Put{Namespace: ns, Table: name, Partition: V{"p": i64(1), "q": txt("x")}, Clustering: V{"a": i64(1), "b": txt("k")},
				Values: V{"v": txt("bad")}}
			mod(p)
			if err := tx.Put(e.ctx, p); err != nil {
				return err
			}
			return tx.Commit(e.ctx)
		}
	}
	big := strings.Repeat("x", lim.MaxValueSize+1)
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"unknown namespace", put(func(p *storage.Put) { p.Namespace = ns + "_nope" }), storage.ErrNamespaceNotFound},
		{"unknown namespace get", get(func(g *storage.Get) { g.Namespace = ns + "_nope" }), storage.ErrNamespaceNotFound},
		{"unknown table", put(func(p *storage.Put) { p.Table = "nope" }), storage.ErrTableNotFound},
		{"unknown table scan", scan(func(s *storage.Scan) { s.Table = "nope" }), storage.ErrTableNotFound},
		{"empty table name", put(func(p *storage.Put) { p.Table = "" }), storage.ErrInvalidName},
		{"empty table name get", get(func(g *storage.Get) { g.Table = "" }), storage.ErrInvalidName},
		{"empty namespace", put(func(p *storage.Put) { p.Namespace = "" }), storage.ErrInvalidName},
		{"missing partition column", put(func(p *storage.Put) { delete(p.Partition, "q") }), storage.ErrInvalidKey},
		{"missing clustering column", put(func(p *storage.Put) { delete(p.Clustering, "b") }), storage.ErrInvalidKey},
		{"no clustering key", get(func(g *storage.Get) { g.Clustering = nil }), storage.ErrInvalidKey},
		{"extra partition column", put(func(p *storage.Put) { p.Partition["a"] = i64(1) }), storage.ErrInvalidKey},
		{"extra clustering column", put(func(p *storage.Put) { p.Clustering["zz"] = i64(1) }), storage.ErrInvalidKey},
		{"value column in key", get(func(g *storage.Get) { g.Clustering["v"] = txt("x") }), storage.ErrInvalidKey},
		{"NULL key", put(func(p *storage.Put) { p.Partition["p"] = storage.Null() }), storage.ErrInvalidKey},
		{"key of wrong type", put(func(p *storage.Put) { p.Partition["p"] = txt("1") }), storage.ErrTypeMismatch},
		{"clustering of wrong type", del(func(d *storage.Delete) { d.Clustering["a"] = storage.Double(1) }), storage.ErrTypeMismatch},
		{"value of wrong type", put(func(p *storage.Put) { p.Values["n"] = txt("1") }), storage.ErrTypeMismatch},
		{"typed NULL of wrong type", put(func(p *storage.Put) { p.Values["n"] = storage.NullOf(storage.TypeText) }), storage.ErrTypeMismatch},
		{"unknown value column", put(func(p *storage.Put) { p.Values["zz"] = i64(1) }), storage.ErrUnknownColumn},
		{"key column in values", put(func(p *storage.Put) { p.Values["a"] = i64(1) }), storage.ErrInvalidArgument},
		{"unknown projection", get(func(g *storage.Get) { g.Projection = []string{"v", "zz"} }), storage.ErrUnknownColumn},
		{"invalid UTF-8 text", put(func(p *storage.Put) { p.Values["v"] = txt("\xff\xfe") }), storage.ErrInvalidValue},
		{"NUL in text", put(func(p *storage.Put) { p.Values["v"] = txt("a\x00b") }), storage.ErrInvalidValue},
		{"invalid UTF-8 key", put(func(p *storage.Put) { p.Partition["q"] = txt("\xc3\x28") }), storage.ErrInvalidValue},
		{"value over the limit", put(func(p *storage.Put) { p.Values["v"] = txt(big) }), storage.ErrTooLarge},
		{"blob over the limit", put(func(p *storage.Put) { p.Values["blob"] = storage.Blob([]byte(big)) }), storage.ErrTooLarge},
		{"key over the limit", put(func(p *storage.Put) { p.Clustering["b"] = txt(strings.Repeat("k", lim.MaxKeySize)) }), storage.ErrTooLarge},
		{"bound on a non-prefix", scan(func(s *storage.Scan) { s.Start = &storage.Bound{Key: V{"b": txt("k")}, Inclusive: true} }), storage.ErrInvalidBound},
		{"bound on a value column", scan(func(s *storage.Scan) { s.End = &storage.Bound{Key: V{"a": i64(1), "v": txt("k")}} }), storage.ErrInvalidBound},
		{"empty bound", scan(func(s *storage.Scan) { s.End = &storage.Bound{Key: V{}} }), storage.ErrInvalidBound},
		{"bound of wrong type", scan(func(s *storage.Scan) { s.Start = &storage.Bound{Key: V{"a": txt("1")}} }), storage.ErrTypeMismatch},
		{"negative limit", scan(func(s *storage.Scan) { s.Limit = -1 }), storage.ErrInvalidArgument},
		{"scan with bad partition", scan(func(s *storage.Scan) { s.Partition = V{"p": i64(1)} }), storage.ErrInvalidKey},
		{"IfNotExists on delete", del(func(d *storage.Delete) { d.Condition = storage.IfNotExists() }), storage.ErrInvalidArgument},
		{"If without expressions", put(func(p *storage.Put) { p.Condition = storage.If() }), storage.ErrInvalidArgument},
		{"comparison with NULL", put(func(p *storage.Put) { p.Condition = storage.If(storage.Eq("v", storage.Null())) }), storage.ErrInvalidArgument},
		{"condition on unknown column", del(func(d *storage.Delete) { d.Condition = storage.If(storage.Eq("zz", i64(1))) }), storage.ErrUnknownColumn},
		{"condition of wrong type", put(func(p *storage.Put) { p.Condition = storage.If(storage.Eq("n", txt("1"))) }), storage.ErrTypeMismatch},
	}
	if _, ok := e.db.(storage.Backend); ok {
		cases = append(cases, []struct {
			name string
			call func() error
			want error
		}{
			{"txn: value of wrong type", txnPut(func(p *storage.Put) { p.Values["n"] = storage.Bool(true) }), storage.ErrTypeMismatch},
			{"txn: missing key", txnPut(func(p *storage.Put) { p.Clustering = nil }), storage.ErrInvalidKey},
		}...)
	}
	for _, c := range cases {
		err := c.call()
		if !errorsIs(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	// A Put whose values are each within the limit but together are not.
	wide := e.table("wide", cols(col("k", storage.TypeBigInt)), nil, cols(col("c0", storage.TypeText), col("c1", storage.TypeText),
		col("c2", storage.TypeText), col("c3", storage.TypeText), col("c4", storage.TypeText), col("c5", storage.TypeText),
		col("c6", storage.TypeText), col("c7", storage.TypeText)))
	need := lim.MaxWriteSize/lim.MaxValueSize + 1
	if need > 8 {
		t.Fatalf("limits %+v: cannot exceed MaxWriteSize with 8 columns of MaxValueSize", lim)
	}
	full := strings.Repeat("w", lim.MaxValueSize)
	vals := V{}
	for i := range need {
		vals["c"+strconv.Itoa(i)] = txt(full)
	}
	err := e.db.Put(e.ctx, &storage.Put{Namespace: ns, Table: wide.Name, Partition: V{"k": i64(1)}, Values: vals})
	if !errorsIs(err, storage.ErrTooLarge) {
		t.Errorf("put of %d values of MaxValueSize: got %v, want ErrTooLarge", need, err)
	}
	if _, ok := e.get(wide, V{"k": i64(1)}, nil); ok {
		t.Error("an oversized put wrote a row")
	}
	tsTable := e.table("times", cols(col("k", storage.TypeBigInt)), nil, cols(col("t", storage.TypeTimestamp)))
	for _, us := range []int64{storage.MinTimestamp.UnixMicro() - 1, storage.MaxTimestamp.UnixMicro() + 1} {
		err := e.db.Put(e.ctx, &storage.Put{Namespace: ns, Table: tsTable.Name, Partition: V{"k": i64(1)}, Values: V{"t": storage.TimestampMicros(us)}})
		if !errorsIs(err, storage.ErrInvalidValue) {
			t.Errorf("timestamp %d µs: got %v, want ErrInvalidValue", us, err)
		}
	}
	if _, ok := e.get(tsTable, V{"k": i64(1)}, nil); ok {
		t.Error("rejected timestamps wrote a row")
	}
	if after := snapshot(); after != before {
		t.Fatalf("bad input changed the table:\nbefore %s\nafter  %s", before, after)
	}
}
