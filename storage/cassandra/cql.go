package cassandra

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kiroku-db/kiroku/storage"
)

// This file turns checked storage operations into CQL. Everything here is a
// pure function of the schema and the operation, so it is tested without a
// server; identifiers are always quoted, values always bound.

// existsCol is the hidden column every put sets to true: a row exists in
// kiroku's sense exactly when it is non-NULL. Cassandra keeps a row alive
// while any cell of it is, and an UPDATE (the only statement that takes
// the conditions kiroku needs) writes no row marker, so a row whose value
// columns are all NULL would otherwise vanish. Its name cannot be a kiroku
// column's, which start with a letter.
const (
	existsName = "_exists"
	existsCol  = `"` + existsName + `"`
)

func ident(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// relTable is a table's schema with the CQL table that holds it: a name
// and an id drawn at CREATE TABLE, so that a table dropped and created
// again by another process is a different CQL table and a stale cached
// schema is noticed ("unconfigured table") rather than written by.
type relTable struct {
	*storage.Table
	rel   string // the CQL table's name, unquoted
	id    string // the CQL table's id (a UUID), given at CREATE TABLE
	qname string // "keyspace"."rel"
	cols  []string
	qcols []string
}

func newRelTable(keyspace string, t *storage.Table, rel, id string) *relTable {
	rt := &relTable{Table: t, rel: rel, id: id, qname: ident(keyspace) + "." + ident(rel), cols: t.ColumnNames()}
	rt.qcols = make([]string, len(rt.cols))
	for i, c := range rt.cols {
		rt.qcols[i] = ident(c)
	}
	return rt
}

// q returns a column's quoted identifier.
func (t *relTable) q(name string) string {
	if i := slices.Index(t.cols, name); i >= 0 {
		return t.qcols[i]
	}
	return ident(name)
}

// prefixed reports whether name is a TEXT or BLOB partition-key column,
// whose values carry pkPrefix.
func (t *relTable) prefixed(name string) bool {
	typ, role, _ := t.Lookup(name)
	return role == storage.RolePartition && (typ == storage.TypeText || typ == storage.TypeBlob)
}

// newCell returns a cell for reading column name.
func (t *relTable) newCell(name string) *cell {
	typ, _, _ := t.Lookup(name)
	return &cell{typ: typ, pk: t.prefixed(name)}
}

// createTableCQL is the CQL table of t: key columns in the primary key,
// the clustering order as declared, the hidden existsCol, and the id drawn
// for it, so that two processes finishing the same creation make one table.
func createTableCQL(t *relTable) string {
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS " + t.qname + " (")
	for _, c := range t.PartitionKey {
		b.WriteString(ident(c.Name) + " " + cqlType(c.Type, true) + ", ")
	}
	for _, c := range t.ClusteringKey {
		b.WriteString(ident(c.Name) + " " + cqlType(c.Type, false) + ", ")
	}
	for _, c := range t.Columns {
		b.WriteString(ident(c.Name) + " " + cqlType(c.Type, false) + ", ")
	}
	b.WriteString(existsCol + " boolean, PRIMARY KEY ((")
	for i, c := range t.PartitionKey {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ident(c.Name))
	}
	b.WriteString(")")
	for _, c := range t.ClusteringKey {
		b.WriteString(", " + ident(c.Name))
	}
	b.WriteString(")) WITH ID = " + t.id)
	if len(t.ClusteringKey) > 0 {
		b.WriteString(" AND CLUSTERING ORDER BY (")
		for i, c := range t.ClusteringKey {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(ident(c.Name) + " " + c.Order.String())
		}
		b.WriteString(")")
	}
	// Names are [a-z0-9_]: nothing to escape in the literal.
	b.WriteString(" AND comment = 'kiroku table " + t.Namespace + "." + t.Name + "'")
	return b.String()
}

// stmt is one CQL statement and its bound values.
type stmt struct {
	cql  string
	args []any
}

// builder accumulates a statement's text and arguments.
type builder struct {
	sb   strings.Builder
	args []any
}

func (b *builder) w(s ...string) {
	for _, x := range s {
		b.sb.WriteString(x)
	}
}

// arg binds v, a value of column col of t, and returns its placeholder.
func (b *builder) arg(t *relTable, col string, v storage.Value) string {
	b.args = append(b.args, arg{v: v, pk: t.prefixed(col)})
	return "?"
}

func (b *builder) stmt() stmt { return stmt{cql: b.sb.String(), args: b.args} }

// whereKey writes "k1 = ? AND k2 = ? ..." for the full primary key.
func (b *builder) whereKey(t *relTable, partition, clustering storage.Values) {
	for i, c := range t.PartitionKey {
		if i > 0 {
			b.w(" AND ")
		}
		b.w(t.q(c.Name), " = ", b.arg(t, c.Name, partition[c.Name]))
	}
	for _, c := range t.ClusteringKey {
		b.w(" AND ", t.q(c.Name), " = ", b.arg(t, c.Name, clustering[c.Name]))
	}
}

// selectList writes "SELECT cols, existsCol FROM table WHERE " and returns
// the columns selected before existsCol: the projection, or every column.
// existsCol is always read: it makes Cassandra return a row whose selected
// columns are all NULL.
func (b *builder) selectList(t *relTable, proj []string) []string {
	b.w("SELECT ")
	if len(proj) == 0 {
		proj = t.cols
	}
	for _, c := range proj {
		b.w(t.q(c), ", ")
	}
	b.w(existsCol, " FROM ", t.qname, " WHERE ")
	return proj
}

func getCQL(t *relTable, g *storage.Get) (stmt, []string) {
	var b builder
	cols := b.selectList(t, g.Projection)
	b.whereKey(t, g.Partition, g.Clustering)
	return b.stmt(), cols
}

// keyHolds evaluates a condition's expressions on key columns, which
// Cassandra does not accept in an IF clause ("PRIMARY KEY column cannot
// have IF conditions"): their values are the request's own, so the answer
// does not depend on the stored row. It returns false if one of them does
// not hold.
func keyHolds(t *relTable, c *storage.Condition, partition, clustering storage.Values) bool {
	if c == nil || c.Kind != storage.CondIf {
		return true
	}
	for _, e := range c.Exprs {
		_, role, _ := t.Lookup(e.Column)
		switch role {
		case storage.RolePartition:
			if !e.Eval(partition[e.Column]) {
				return false
			}
		case storage.RoleClustering:
			if !e.Eval(clustering[e.Column]) {
				return false
			}
		}
	}
	return true
}

// condition writes the IF clause of a write. Every write is a lightweight
// transaction (see the package doc), so a write without a condition gets
// one that always holds. Expressions on key columns are left out: the
// caller checked them with keyHolds.
func (b *builder) condition(t *relTable, c *storage.Condition) {
	b.w(" IF ")
	switch {
	case c == nil:
		b.w(existsCol, " IN (null, true)")
		return
	case c.Kind == storage.CondIfNotExists:
		b.w(existsCol, " = null")
		return
	}
	b.w(existsCol, " = true") // IfExists, and If, which requires the row
	if c.Kind != storage.CondIf {
		return
	}
	for _, e := range c.Exprs {
		if _, role, _ := t.Lookup(e.Column); role != storage.RoleValue {
			continue
		}
		b.w(" AND ")
		b.expr(t, e)
	}
}

// Zero operands of DOUBLE comparisons. Cassandra compares doubles as Java's
// Double.compare does: NaN equals NaN and is above +Inf, as in kiroku, but
// -0 is below +0 where kiroku has them equal. A comparison with either zero
// is therefore rewritten to one that treats both alike: = 0 is IN (-0, +0),
// <> 0 is <> -0 AND <> +0, < 0 is < -0, <= 0 is <= +0, > 0 is > +0 and
// >= 0 is >= -0. Any other operand orders -0 and +0 alike already.
var (
	negZero = storage.Double(math.Copysign(0, -1))
	posZero = storage.Double(0)
)

func isZero(v storage.Value) bool {
	return v.Type() == storage.TypeDouble && !v.IsNull() && v.AsDouble() == 0
}

// expr writes one condition expression on a value column. A comparison
// with a NULL column is false in kiroku, as in SQL; in Cassandra, col <> v
// holds when col is NULL, so <> also requires col <> null (not NULL). The
// other comparisons are already false on NULL.
func (b *builder) expr(t *relTable, e storage.Expr) {
	col := t.q(e.Column)
	zero := isZero(e.Value)
	switch e.Op {
	case storage.OpIsNull:
		b.w(col, " = null")
	case storage.OpIsNotNull:
		b.w(col, " != null")
	case storage.OpEq:
		if zero {
			b.w(col, " IN (", b.arg(t, e.Column, negZero), ", ", b.arg(t, e.Column, posZero), ")")
		} else {
			b.w(col, " = ", b.arg(t, e.Column, e.Value))
		}
	case storage.OpNe:
		if zero {
			b.w(col, " != ", b.arg(t, e.Column, negZero), " AND ", col, " != ", b.arg(t, e.Column, posZero))
		} else {
			b.w(col, " != ", b.arg(t, e.Column, e.Value))
		}
		b.w(" AND ", col, " != null")
	case storage.OpLt, storage.OpLe, storage.OpGt, storage.OpGe:
		v := e.Value
		if zero {
			v = posZero
			if e.Op == storage.OpLt || e.Op == storage.OpGe {
				v = negZero
			}
		}
		b.w(col, " ", e.Op.String(), " ", b.arg(t, e.Column, v))
	default:
		panic(fmt.Sprintf("cassandra: operator %v", e.Op))
	}
}

// rowWrite is what one statement does to one row: the folded effect of
// the mutations of a Mutate that address that row (or of one Put or
// Delete), in their order.
type rowWrite struct {
	partition, clustering storage.Values
	del                   bool           // the row ends deleted
	set                   storage.Values // value columns to set, when !del
	reset                 bool           // a delete came first: every value column not in set becomes NULL
	cond                  *storage.Condition
	skip                  bool // a Skippable put: a condition that fails skips it
	first                 int  // index of the mutation whose condition this is
	// guard, once set, replaces a skipped put: the statement writes
	// nothing new and requires the row to be as it was when the put's
	// condition failed, so that the skip and the rest of the batch are
	// atomic together.
	guard *guard
}

// guard is the state of a row a skipped put found: whether it exists and
// the values of the columns its condition names.
type guard struct {
	exists bool
	vals   storage.Values
}

func (w *rowWrite) skippable() bool { return w.skip && w.guard == nil }

// guardSkip turns the write of a Skippable put whose condition failed on
// row (nil if absent) into its guard.
func (w *rowWrite) guardSkip(t *relTable, row storage.Row) {
	g := &guard{exists: row != nil && !row[existsName].IsNull(), vals: storage.Values{}}
	if g.exists && w.cond != nil {
		for _, e := range w.cond.Exprs {
			if typ, role, _ := t.Lookup(e.Column); role == storage.RoleValue {
				v, ok := row[e.Column]
				if !ok {
					v = storage.NullOf(typ)
				}
				g.vals[e.Column] = v
			}
		}
	}
	w.guard = g
}

// writeCQL returns the statement of w: an UPDATE or DELETE with an IF
// clause, always.
func writeCQL(t *relTable, w *rowWrite) stmt {
	var b builder
	if g := w.guard; g != nil {
		if !g.exists { // a tombstone on an absent row: nothing changes
			b.w("DELETE FROM ", t.qname, " WHERE ")
			b.whereKey(t, w.partition, w.clustering)
			b.w(" IF ", existsCol, " = null")
			return b.stmt()
		}
		b.w("UPDATE ", t.qname, " SET ", existsCol, " = true WHERE ")
		b.whereKey(t, w.partition, w.clustering)
		b.w(" IF ", existsCol, " = true")
		for _, c := range t.Columns {
			if v, ok := g.vals[c.Name]; ok {
				b.w(" AND ")
				if v.IsNull() {
					b.expr(t, storage.IsNull(c.Name))
				} else {
					b.expr(t, storage.Eq(c.Name, v))
				}
			}
		}
		return b.stmt()
	}
	if w.del {
		b.w("DELETE FROM ", t.qname, " WHERE ")
	} else {
		b.w("UPDATE ", t.qname, " SET ")
		for i, c := range t.Columns { // schema order: one statement text per shape
			v, ok := w.set[c.Name]
			if !ok && !w.reset {
				continue
			}
			if !ok {
				v = storage.NullOf(c.Type)
			}
			b.w(t.qcols[len(t.PartitionKey)+len(t.ClusteringKey)+i], " = ", b.arg(t, c.Name, v), ", ")
		}
		b.w(existsCol, " = true WHERE ")
	}
	b.whereKey(t, w.partition, w.clustering)
	b.condition(t, w.cond)
	return b.stmt()
}

// putWrite and deleteWrite are the rowWrite of one Put or Delete.
func putWrite(p *storage.Put) *rowWrite {
	return &rowWrite{partition: p.Partition, clustering: p.Clustering, set: p.Values, cond: p.Condition}
}

func deleteWrite(d *storage.Delete) *rowWrite {
	return &rowWrite{partition: d.Partition, clustering: d.Clustering, del: true, cond: d.Condition}
}

// fold groups the checked mutations of a Mutate by row, in order of each
// row's first mutation. A Cassandra batch applies its statements with one
// timestamp and checks every condition against the rows as they were
// before it, so mutations of one row are merged into one statement that
// has their combined effect: a later put's values win, a delete clears the
// row (a put after it starts from an empty row). A condition on a row that
// an earlier mutation of the same Mutate writes would have to be judged on
// a state the batch never sees, and is refused (ErrInvalidArgument).
func fold(t *relTable, ms []storage.Mutation) ([]*rowWrite, error) {
	var out []*rowWrite
	byKey := map[string]*rowWrite{}
	for i, m := range ms {
		var w *rowWrite
		switch m := m.(type) {
		case *storage.Put:
			w = putWrite(m)
			w.skip = m.Skippable
		case *storage.Delete:
			w = deleteWrite(m)
		}
		w.first = i
		k := clusteringKey(t, w.clustering)
		prev, ok := byKey[k]
		if !ok {
			if !w.del {
				w.set = cloneValues(w.set)
			}
			byKey[k] = w
			out = append(out, w)
			continue
		}
		if prev.skip {
			return nil, &storage.Error{Kind: storage.ErrInvalidArgument, Op: "mutate", Namespace: t.Namespace, Table: t.Name,
				Detail: fmt.Sprintf("mutation %d writes the row of mutation %d, a Skippable put: on Cassandra a Skippable put must be the only mutation of its row in a Mutate", i+1, prev.first+1)}
		}
		if w.cond != nil {
			return nil, &storage.Error{Kind: storage.ErrInvalidArgument, Op: "mutate", Namespace: t.Namespace, Table: t.Name,
				Detail: fmt.Sprintf("mutation %d has a condition on a row that mutation %d also writes: on Cassandra a Mutate judges every condition on the rows as they were before it", i+1, prev.first+1)}
		}
		switch {
		case w.del:
			prev.del, prev.set, prev.reset = true, nil, false
		case prev.del:
			prev.del, prev.set, prev.reset = false, cloneValues(w.set), true
		default:
			for c, v := range w.set {
				prev.set[c] = v
			}
		}
	}
	return out, nil
}

func cloneValues(v storage.Values) storage.Values {
	out := make(storage.Values, len(v))
	for k, x := range v {
		out[k] = x
	}
	return out
}

// clusteringKey is a map key for a row of one partition: its clustering
// values, typed and length-prefixed.
func clusteringKey(t *relTable, clustering storage.Values) string {
	var b strings.Builder
	for _, c := range t.ClusteringKey {
		enc := encode(clustering[c.Name], false)
		b.WriteString(strconv.Itoa(len(enc)))
		b.WriteByte(':')
		b.Write(enc)
	}
	return b.String()
}

// ---- scans ------------------------------------------------------------------

// scanPlan is the one CQL query of a Scan and what to do with its rows.
//
// A bound of a Scan is a prefix of the clustering key compared in
// clustering order, where a DESC column compares backwards. CQL's
// multi-column slice (c1, c2) >= (v1, v2) compares in each column's
// natural order whatever its clustering order, so it states a bound
// exactly only when the bound's columns all share one direction (for DESC
// columns the comparison flips). A bound whose columns mix directions is
// stated on its leading run of same-direction columns, inclusively, which
// can only let more rows through, and the rows are filtered here: those
// that share the run's values with the bound, and only those, may fall
// outside it, and the query reads them at one edge of the range. This
// keeps a scan one query — a Scan is atomic, which splitting it into
// several queries would not be — at the cost of reading those edge rows.
type scanPlan struct {
	stmt  stmt
	cols  []string // the columns selected before existsCol
	proj  []string // the columns returned: a prefix of cols
	exact bool     // the query returns exactly the range: no filtering, its LIMIT is the scan's
	empty bool     // the bounds contradict each other: no query at all
}

func scanCQL(t *relTable, s *storage.Scan, pageLimit bool) scanPlan {
	var b builder
	var p scanPlan
	p.proj = s.Projection
	if len(p.proj) == 0 {
		p.proj = t.cols
	}
	p.exact = boundExact(t, s.Start) && boundExact(t, s.End)
	sel := p.proj
	if !p.exact { // the filter needs every bound column
		sel = slices.Clone(p.proj)
		for _, c := range t.ClusteringKey {
			if !slices.Contains(sel, c.Name) {
				sel = append(sel, c.Name)
			}
		}
	}
	p.cols = b.selectList(t, sel)
	for i, c := range t.PartitionKey {
		if i > 0 {
			b.w(" AND ")
		}
		b.w(t.q(c.Name), " = ", b.arg(t, c.Name, s.Partition[c.Name]))
	}
	if s.Start != nil && s.End != nil && cmpBounds(t, s.Start, s.End) > 0 {
		p.empty = true
	}
	b.bound(t, s.Start, true)
	b.bound(t, s.End, false)
	if s.Order == storage.Desc && len(t.ClusteringKey) > 0 {
		b.w(" ORDER BY ")
		for i, c := range t.ClusteringKey {
			if i > 0 {
				b.w(", ")
			}
			b.w(t.q(c.Name), " ", (1 - c.Order).String())
		}
	}
	if s.Limit > 0 && p.exact && pageLimit {
		b.w(" LIMIT ", strconv.Itoa(s.Limit))
	}
	p.stmt = b.stmt()
	return p
}

// run is the length of the leading run of b's columns that share the first
// one's direction.
func run(t *relTable, b *storage.Bound) int {
	n := 1
	for n < len(b.Key) && t.ClusteringKey[n].Order == t.ClusteringKey[0].Order {
		n++
	}
	return n
}

func boundExact(t *relTable, b *storage.Bound) bool { return b == nil || run(t, b) == len(b.Key) }

// bound writes " AND (c1, ..) op (v1, ..)" for one end of a scan: the
// whole bound when its columns share a direction, else its leading run,
// inclusively. "After" in clustering order is > for ASC and < for DESC.
func (b *builder) bound(t *relTable, bd *storage.Bound, start bool) {
	if bd == nil {
		return
	}
	n := run(t, bd)
	incl := bd.Inclusive || n < len(bd.Key)
	op := "<"
	if (t.ClusteringKey[0].Order == storage.Asc) == start {
		op = ">"
	}
	if incl {
		op += "="
	}
	vals := t.BoundValues(bd)
	var names, ph []string
	for i, c := range t.ClusteringKey[:n] {
		names = append(names, t.q(c.Name))
		ph = append(ph, b.arg(t, c.Name, vals[i]))
	}
	b.w(" AND (", strings.Join(names, ", "), ") ", op, " (", strings.Join(ph, ", "), ")")
}

// cmpPrefix compares the first len(bound) clustering values of a row with a
// bound, in clustering order.
func cmpPrefix(t *relTable, row []storage.Value, bound []storage.Value) int {
	for i, v := range bound {
		r := storage.Compare(row[i], v)
		if t.ClusteringKey[i].Order == storage.Desc {
			r = -r
		}
		if r != 0 {
			return r
		}
	}
	return 0
}

// cmpBounds compares a scan's start and end on their common prefix; a
// positive result means the range is empty.
func cmpBounds(t *relTable, start, end *storage.Bound) int {
	s, e := t.BoundValues(start), t.BoundValues(end)
	n := min(len(s), len(e))
	return cmpPrefix(t, s[:n], e[:n])
}

// inRange says where a row's clustering values lie with respect to a
// scan's bounds: -1 before the start, 0 inside, 1 after the end (in
// clustering order).
func inRange(t *relTable, s *storage.Scan, ck []storage.Value) int {
	if s.Start != nil {
		c := cmpPrefix(t, ck, t.BoundValues(s.Start))
		if c < 0 || c == 0 && !s.Start.Inclusive {
			return -1
		}
	}
	if s.End != nil {
		c := cmpPrefix(t, ck, t.BoundValues(s.End))
		if c > 0 || c == 0 && !s.End.Inclusive {
			return 1
		}
	}
	return 0
}
