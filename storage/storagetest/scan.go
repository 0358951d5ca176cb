package storagetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// scanModel is the suite's own reference for scans: rows sorted by the
// clustering order, filtered by prefix bounds, reversed, limited.
type scanModel struct {
	tb   *storage.Table
	rows []storage.Row // one partition
}

// cmpPrefix compares the first len(bound) clustering columns of row with the
// bound, in clustering order (a DESC column flips its comparison).
func (m *scanModel) cmpPrefix(row storage.Row, bound []storage.Value) int {
	for i, v := range bound {
		c := m.tb.ClusteringKey[i]
		r := storage.Compare(row[c.Name], v)
		if c.Order == storage.Desc {
			r = -r
		}
		if r != 0 {
			return r
		}
	}
	return 0
}

func (m *scanModel) scan(s *storage.Scan) []storage.Row {
	rows := slices.Clone(m.rows)
	full := make([]storage.Value, len(m.tb.ClusteringKey))
	slices.SortFunc(rows, func(a, b storage.Row) int {
		for i, c := range m.tb.ClusteringKey {
			full[i] = b[c.Name]
		}
		return m.cmpPrefix(a, full)
	})
	var out []storage.Row
	for _, r := range rows {
		if s.Start != nil {
			c := m.cmpPrefix(r, m.tb.BoundValues(s.Start))
			if c < 0 || c == 0 && !s.Start.Inclusive {
				continue
			}
		}
		if s.End != nil {
			c := m.cmpPrefix(r, m.tb.BoundValues(s.End))
			if c > 0 || c == 0 && !s.End.Inclusive {
				continue
			}
		}
		out = append(out, r)
	}
	if s.Order == storage.Desc {
		slices.Reverse(out)
	}
	if s.Limit > 0 && len(out) > s.Limit {
		out = out[:s.Limit]
	}
	return out
}

func keyString(tb *storage.Table, r storage.Row) string {
	s := ""
	for _, c := range tb.ClusteringKey {
		s += fmt.Sprintf("%v/", r[c.Name])
	}
	return s
}

func testScan(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	// Three clustering columns mixing ASC and DESC.
	tb := e.table("grid", cols(col("p", storage.TypeBigInt)),
		[]storage.ClusteringColumn{ccol("a", storage.TypeBigInt, storage.Asc), ccol("b", storage.TypeText, storage.Desc),
			ccol("c", storage.TypeBigInt, storage.Asc)},
		cols(col("v", storage.TypeBigInt)))
	m := &scanModel{tb: tb}
	n := int64(0)
	for _, a := range []int64{1, 2, 3} {
		for _, b := range []string{"x", "y", "z"} {
			for _, c := range []int64{1, 2} {
				n++
				r := V{"p": i64(1), "a": i64(a), "b": txt(b), "c": i64(c), "v": i64(n)}
				e.put(tb, V{"p": i64(1)}, V{"a": r["a"], "b": r["b"], "c": r["c"]}, V{"v": r["v"]})
				m.rows = append(m.rows, r)
				// A second partition that no scan of partition 1 may see.
				e.put(tb, V{"p": i64(2)}, V{"a": r["a"], "b": r["b"], "c": r["c"]}, V{"v": i64(-n)})
			}
		}
	}
	base := func() *storage.Scan { return &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: V{"p": i64(1)}} }

	// Hand-checked expectations, independent of the model.
	all := e.scan(base())
	if len(all) != 18 {
		t.Fatalf("full scan: %d rows", len(all))
	}
	wantFirst := []string{"1/\"z\"/1/", "1/\"z\"/2/", "1/\"y\"/1/", "1/\"y\"/2/", "1/\"x\"/1/"}
	for i, w := range wantFirst {
		if got := keyString(tb, all[i]); got != w {
			t.Fatalf("full scan row %d = %s, want %s", i, got, w)
		}
	}
	desc := base()
	desc.Order = storage.Desc
	if got := keyString(tb, e.scan(desc)[0]); got != "3/\"x\"/2/" {
		t.Fatalf("reverse scan starts at %s, want 3/\"x\"/2/", got)
	}
	prefix := base()
	prefix.Start = &storage.Bound{Key: V{"a": i64(2)}, Inclusive: true}
	prefix.End = &storage.Bound{Key: V{"a": i64(2)}, Inclusive: true}
	if got := e.scan(prefix); len(got) != 6 || !got[0]["v"].Equal(i64(11)) {
		t.Fatalf("scan of prefix a=2: %d rows, first %v", len(got), got)
	}

	// Every combination of bounds, orders and limits against the model.
	n1 := checkScans(e, tb, m, V{"p": i64(1)}, []V{
		{"a": i64(2)},
		{"a": i64(2), "b": txt("y")},
		{"a": i64(2), "b": txt("y"), "c": i64(1)},
		{"a": i64(2), "b": txt("w")}, // between existing values
		{"a": i64(0)},                // before everything
		{"a": i64(3), "b": txt("x"), "c": i64(9)},
	})
	// The same over keys whose columns all go one way, which take the
	// row-comparison path in SQL backends.
	n2 := 0
	for _, o := range []storage.Order{storage.Desc, storage.Asc} {
		ut := e.table("uniform_"+strings.ToLower(o.String()), cols(col("p", storage.TypeBigInt)),
			[]storage.ClusteringColumn{ccol("x", storage.TypeBigInt, o), ccol("y", storage.TypeText, o)}, cols(col("v", storage.TypeBigInt)))
		um := &scanModel{tb: ut}
		for x := int64(1); x <= 3; x++ {
			for _, y := range []string{"a", "b", "c"} {
				r := V{"p": i64(1), "x": i64(x), "y": txt(y), "v": i64(x*10 + int64(y[0]))}
				e.put(ut, V{"p": i64(1)}, V{"x": r["x"], "y": r["y"]}, V{"v": r["v"]})
				um.rows = append(um.rows, r)
			}
		}
		n2 += checkScans(e, ut, um, V{"p": i64(1)}, []V{
			{"x": i64(2)}, {"x": i64(2), "y": txt("b")}, {"x": i64(2), "y": txt("bb")}, {"x": i64(4)}, {"x": i64(1), "y": txt("a")},
		})
	}
	t.Logf("%d scans matched the model (%d on uniform keys)", n1+n2, n2)

	// Empty ranges and partitions; projection.
	empty := base()
	empty.Start = &storage.Bound{Key: V{"a": i64(3)}, Inclusive: true}
	empty.End = &storage.Bound{Key: V{"a": i64(1)}, Inclusive: true}
	if got := e.scan(empty); len(got) != 0 {
		t.Fatalf("start after end returned %d rows", len(got))
	}
	if got := e.scan(&storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: V{"p": i64(99)}}); len(got) != 0 {
		t.Fatalf("empty partition returned %d rows", len(got))
	}
	proj := base()
	proj.Projection = []string{"v"}
	proj.Limit = 2
	got := e.scan(proj)
	if len(got) != 2 {
		t.Fatalf("projected scan: %v", got)
	}
	e.rowEq(got[0], V{"v": i64(5)})

	// Streaming: stop early on a large partition and keep using the backend.
	big := e.table("big", cols(col("p", storage.TypeBigInt)), []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Asc)}, cols(col("v", storage.TypeBlob)))
	var ms []storage.Mutation
	for i := range 2000 {
		ms = append(ms, &storage.Put{Namespace: e.ns, Table: big.Name, Partition: V{"p": i64(1)}, Clustering: V{"c": i64(int64(i))},
			Values: V{"v": storage.Blob(make([]byte, 512))}})
	}
	e.ok(e.db.Mutate(e.ctx, ms))
	// More early closes than a connection pool normally holds: a Close that
	// did not release its connection would exhaust the pool and the scans
	// would stop at the deadline.
	sctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	for range 100 {
		rows, err := e.db.Scan(sctx, &storage.Scan{Namespace: e.ns, Table: big.Name, Partition: V{"p": i64(1)}})
		e.ok(err)
		for i := 0; i < 10 && rows.Next(); i++ {
			if !rows.Row()["c"].Equal(i64(int64(i))) {
				t.Fatalf("streamed row %d = %v", i, rows.Row())
			}
		}
		e.ok(rows.Err())
		e.ok(rows.Close())
	}
	if got := e.scan(&storage.Scan{Namespace: e.ns, Table: big.Name, Partition: V{"p": i64(1)}, Projection: []string{"c"}}); len(got) != 2000 {
		t.Fatalf("full scan of big partition: %d rows", len(got))
	}
}

func bstr(b *storage.Bound) string {
	if b == nil {
		return "none"
	}
	return fmt.Sprintf("%v(incl=%v)", b.Key, b.Inclusive)
}

// checkScans compares the backend with the model for every combination of
// start and end bound (from bounds, inclusive or exclusive, or none), order
// and limit, and returns how many scans it made.
func checkScans(e *env, tb *storage.Table, m *scanModel, part V, bounds []V) int {
	e.t.Helper()
	ends := []*storage.Bound{nil}
	for _, b := range bounds {
		ends = append(ends, &storage.Bound{Key: b, Inclusive: true}, &storage.Bound{Key: b, Inclusive: false})
	}
	n := 0
	for _, start := range ends {
		for _, end := range ends {
			for _, order := range []storage.Order{storage.Asc, storage.Desc} {
				for _, limit := range []int{0, 1, 4} {
					s := &storage.Scan{Namespace: tb.Namespace, Table: tb.Name, Partition: part, Start: start, End: end, Order: order, Limit: limit}
					got, want := e.scan(s), m.scan(s)
					if len(got) != len(want) {
						e.t.Fatalf("%s: scan start=%v end=%v order=%v limit=%d: %d rows, want %d", tb.Name, bstr(start), bstr(end), order, limit, len(got), len(want))
					}
					for i := range got {
						e.rowEq(got[i], want[i])
					}
					n++
				}
			}
		}
	}
	return n
}
