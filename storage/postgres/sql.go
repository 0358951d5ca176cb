package postgres

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kiroku-db/kiroku/storage"
)

// This file turns checked storage operations into SQL. Everything here is a
// pure function of the schema and the operation, so it is tested without a
// server; identifiers are always quoted, values always bound as parameters.

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// relTable is a table's schema with the name of the SQL relation that holds
// it: the kiroku name, '$', and an incarnation tag chosen at CREATE TABLE.
// A table dropped and created again by another process has a new relation,
// so a stale cached schema meets "undefined table" instead of writing by the
// old definition (PostgreSQL would silently cast a BIGINT into a new TEXT
// column, for one). '$' cannot occur in kiroku names, so no relation name
// collides with another table's.
type relTable struct {
	*storage.Table
	rel string
	// Built once by newRelTable, since statements are built per call and
	// quoting an identifier costs more than the rest of a statement.
	qname   string   // the relation's quoted, qualified name
	cols    []string // ColumnNames
	qcols   []string // cols quoted
	allCols string   // every column quoted, comma-separated
	keyCols string   // the key columns quoted, comma-separated
}

func newRelTable(t *storage.Table, rel string) *relTable {
	rt := &relTable{Table: t, rel: rel, qname: pgx.Identifier{t.Namespace, rel}.Sanitize(), cols: t.ColumnNames()}
	rt.qcols = quoteAll(rt.cols)
	rt.allCols = strings.Join(rt.qcols, ", ")
	rt.keyCols = strings.Join(rt.qcols[:len(rt.keys())], ", ")
	return rt
}

// q returns a column's quoted identifier. A table has few columns: a scan
// of them costs about what a map lookup would.
func (t *relTable) q(name string) string {
	if i := slices.Index(t.cols, name); i >= 0 {
		return t.qcols[i]
	}
	return ident(name)
}

// keyValue is key column name's value, from the partition or the
// clustering key.
func keyValue(partition, clustering storage.Values, name string) storage.Value {
	if v, ok := partition[name]; ok {
		return v
	}
	return clustering[name]
}

// keys lists the key columns' names: partition key, then clustering key.
func (t *relTable) keys() []string { return t.cols[:len(t.PartitionKey)+len(t.ClusteringKey)] }

// placeholders are "$1" to "$64", so binding a parameter formats nothing.
var placeholders = func() (ph [65]string) {
	for i := range ph {
		ph[i] = "$" + strconv.Itoa(i)
	}
	return ph
}()

func sqlType(t storage.DataType) string {
	switch t {
	case storage.TypeBoolean:
		return "boolean"
	case storage.TypeBigInt:
		return "bigint"
	case storage.TypeDouble:
		return "double precision"
	case storage.TypeText:
		// Byte order, which is code point order for UTF-8: the same order on
		// every backend, whatever the server's locale.
		return `text COLLATE "C"`
	case storage.TypeBlob:
		return "bytea"
	case storage.TypeTimestamp:
		return "timestamptz"
	}
	panic(fmt.Sprintf("postgres: no SQL type for %v", t))
}

// createTableSQL returns the statements that create t: the table with its
// primary key, and, when a clustering column is DESC, an index in exactly
// the clustering order so scans in either direction read it in order.
func createTableSQL(t *relTable) []string {
	var cols []string
	for _, c := range t.PartitionKey {
		cols = append(cols, ident(c.Name)+" "+sqlType(c.Type)+" NOT NULL")
	}
	for _, c := range t.ClusteringKey {
		cols = append(cols, ident(c.Name)+" "+sqlType(c.Type)+" NOT NULL")
	}
	for _, c := range t.Columns {
		cols = append(cols, ident(c.Name)+" "+sqlType(c.Type))
	}
	stmts := []string{fmt.Sprintf("CREATE TABLE %s (%s, CONSTRAINT %s PRIMARY KEY (%s))",
		t.qname, strings.Join(cols, ", "), ident(t.rel+"$pk"), t.keyCols)}
	mixed := false
	for _, c := range t.ClusteringKey {
		mixed = mixed || c.Order == storage.Desc
	}
	if mixed {
		idx := quoteAll(namesOf(t.PartitionKey))
		for _, c := range t.ClusteringKey {
			idx = append(idx, ident(c.Name)+" "+c.Order.String())
		}
		stmts = append(stmts, fmt.Sprintf("CREATE INDEX %s ON %s (%s)",
			ident(t.rel+"$order"), t.qname, strings.Join(idx, ", ")))
	}
	return stmts
}

func namesOf(cols []storage.Column) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.Name
	}
	return out
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = ident(n)
	}
	return out
}

// builder accumulates a statement's text and arguments.
type builder struct {
	sb   strings.Builder
	args []any
}

func (b *builder) w(s ...string) {
	if b.sb.Cap() == 0 {
		b.sb.Grow(256) // most statements fit: one allocation, not a growing few
	}
	for _, x := range s {
		b.sb.WriteString(x)
	}
}

// arg binds v and returns its placeholder.
func (b *builder) arg(v storage.Value) string {
	if b.args == nil {
		b.args = make([]any, 0, 8)
	}
	b.args = append(b.args, goValue(v))
	if n := len(b.args); n < len(placeholders) {
		return placeholders[n]
	}
	return "$" + strconv.Itoa(len(b.args))
}

// goValue converts a value to what pgx binds to the column's SQL type.
func goValue(v storage.Value) any {
	if v.IsNull() {
		return nil
	}
	switch v.Type() {
	case storage.TypeBoolean:
		return v.AsBool()
	case storage.TypeBigInt:
		return v.AsBigInt()
	case storage.TypeDouble:
		return v.AsDouble()
	case storage.TypeText:
		return v.AsText()
	case storage.TypeBlob:
		b := v.AsBlob()
		if b == nil {
			b = []byte{} // nil would bind as NULL
		}
		return b
	case storage.TypeTimestamp:
		return v.AsTime()
	}
	panic(fmt.Sprintf("postgres: cannot bind %v", v))
}

// fromGo converts what pgx decoded back into a value of type t.
func fromGo(t storage.DataType, x any) (storage.Value, error) {
	if x == nil {
		return storage.NullOf(t), nil
	}
	switch t {
	case storage.TypeBoolean:
		if b, ok := x.(bool); ok {
			return storage.Bool(b), nil
		}
	case storage.TypeBigInt:
		if i, ok := x.(int64); ok {
			return storage.BigInt(i), nil
		}
	case storage.TypeDouble:
		if f, ok := x.(float64); ok {
			return storage.Double(f), nil
		}
	case storage.TypeText:
		if s, ok := x.(string); ok {
			return storage.Text(s), nil
		}
	case storage.TypeBlob:
		if b, ok := x.([]byte); ok {
			return storage.Blob(b), nil
		}
	case storage.TypeTimestamp:
		if ts, ok := x.(time.Time); ok {
			return storage.Timestamp(ts), nil
		}
	}
	return storage.Value{}, fmt.Errorf("postgres: column of type %v decoded as %T", t, x)
}

// whereKey writes "k1 = $1 AND k2 = $2 ..." for the full primary key.
func (b *builder) whereKey(t *relTable, partition, clustering storage.Values) {
	for i, name := range t.keys() {
		if i > 0 {
			b.w(" AND ")
		}
		b.w(t.qcols[i], " = ", b.arg(keyValue(partition, clustering, name)))
	}
}

// conditionExprs writes " AND expr ..." for a CondIf condition.
func (b *builder) conditionExprs(t *relTable, c *storage.Condition) {
	if c == nil || c.Kind != storage.CondIf {
		return
	}
	for _, e := range c.Exprs {
		b.w(" AND ", t.q(e.Column), " ")
		switch e.Op {
		case storage.OpIsNull, storage.OpIsNotNull:
			b.w(e.Op.String())
		default:
			b.w(e.Op.String(), " ", b.arg(e.Value))
		}
	}
}

// selectList writes "SELECT cols FROM table WHERE " and returns the
// columns selected: the projection, or every column.
func (b *builder) selectList(t *relTable, proj []string) []string {
	b.w("SELECT ")
	if len(proj) == 0 {
		b.w(t.allCols)
		proj = t.cols
	} else {
		for i, c := range proj {
			if i > 0 {
				b.w(", ")
			}
			b.w(t.q(c))
		}
	}
	b.w(" FROM ", t.qname, " WHERE ")
	return proj
}

func getSQL(t *relTable, g *storage.Get) (string, []any, []string) {
	var b builder
	cols := b.selectList(t, g.Projection)
	b.whereKey(t, g.Partition, g.Clustering)
	return b.sb.String(), b.args, cols
}

// putSQL returns the statement for a Put. For conditional puts, zero rows
// affected means the condition did not hold; the check and the write are one
// statement, so no other writer can slip in between. A transaction's
// Deferred put fails the transaction instead: with IfNotExists it is a
// plain INSERT (a unique violation if the row exists), with another
// condition an UPDATE that divides by zero if it updated nothing
// (deferredSQL).
func putSQL(t *relTable, p *storage.Put) (string, []any) {
	return buildPut(t, p, false)
}

// deferredSQL is the plain INSERT of a Deferred put.
func deferredSQL(t *relTable, p *storage.Put) (string, []any) { return buildPut(t, p, true) }

func buildPut(t *relTable, p *storage.Put, plain bool) (string, []any) {
	var b builder
	// The value columns set, in schema order: the statement's text is the
	// same for every put of one shape, so pgx reuses its prepared statement.
	nk := len(t.PartitionKey) + len(t.ClusteringKey)
	var vbuf [8]storage.Value
	var sbuf [8]int
	vals, set := vbuf[:0], sbuf[:0] // set: indexes into t.cols
	for i, name := range t.cols[nk:] {
		if v, ok := p.Values[name]; ok {
			vals, set = append(vals, v), append(set, nk+i)
		}
	}
	if p.Condition != nil && p.Condition.Kind != storage.CondIfNotExists {
		// IfExists or If: update the existing row only. Deferred, the
		// statement divides by the count of rows updated, so a condition
		// that does not hold fails it (division_by_zero), and with it the
		// transaction, without anyone reading its answer.
		if plain {
			b.w("WITH u AS (")
		}
		b.w("UPDATE ", t.qname, " SET ")
		if len(vals) == 0 {
			k := t.qcols[0]
			b.w(k, " = ", k) // touch the row: it is written, so it conflicts like a write
		}
		for i, c := range set {
			if i > 0 {
				b.w(", ")
			}
			b.w(t.qcols[c], " = ", b.arg(vals[i]))
		}
		b.w(" WHERE ")
		b.whereKey(t, p.Partition, p.Clustering)
		b.conditionExprs(t, p.Condition)
		if plain {
			b.w(" RETURNING 1) SELECT 1 / count(*) FROM u")
		}
		return b.sb.String(), b.args
	}
	b.w("INSERT INTO ", t.qname, " (", t.keyCols)
	for _, c := range set {
		b.w(", ", t.qcols[c])
	}
	b.w(") VALUES (")
	for i, name := range t.keys() {
		if i > 0 {
			b.w(", ")
		}
		b.w(b.arg(keyValue(p.Partition, p.Clustering, name)))
	}
	for _, v := range vals {
		b.w(", ", b.arg(v))
	}
	if plain {
		b.w(")")
		return b.sb.String(), b.args
	}
	b.w(") ON CONFLICT (", t.keyCols, ") DO ")
	if p.Condition != nil || len(vals) == 0 {
		b.w("NOTHING")
		return b.sb.String(), b.args
	}
	b.w("UPDATE SET ")
	for i, c := range set {
		if i > 0 {
			b.w(", ")
		}
		b.w(t.qcols[c], " = EXCLUDED.", t.qcols[c])
	}
	return b.sb.String(), b.args
}

// expectSQL returns the statement of an Expect, queued like a Deferred
// put's: it divides by zero, failing the transaction, unless the row meets
// the condition (for IfNotExists, unless there is no row).
func expectSQL(t *relTable, e *storage.Expect) (string, []any) {
	var b builder
	if e.Condition.Kind == storage.CondIfNotExists {
		b.w("SELECT 1 / (1 - count(*)) FROM ", t.qname, " WHERE ")
	} else {
		b.w("SELECT 1 / count(*) FROM ", t.qname, " WHERE ")
	}
	b.whereKey(t, e.Partition, e.Clustering)
	b.conditionExprs(t, e.Condition)
	return b.sb.String(), b.args
}

func deleteSQL(t *relTable, d *storage.Delete) (string, []any) {
	var b builder
	b.w("DELETE FROM ", t.qname, " WHERE ")
	b.whereKey(t, d.Partition, d.Clustering)
	b.conditionExprs(t, d.Condition)
	return b.sb.String(), b.args
}

// scanSQL returns the statement for a Scan, and the projected columns.
func scanSQL(t *relTable, s *storage.Scan) (string, []any, []string) {
	var b builder
	cols := b.selectList(t, s.Projection)
	for i, c := range t.PartitionKey {
		if i > 0 {
			b.w(" AND ")
		}
		b.w(t.q(c.Name), " = ", b.arg(s.Partition[c.Name]))
	}
	if s.Start != nil {
		b.w(" AND ")
		b.bound(t, s.Start, true)
	}
	if s.End != nil {
		b.w(" AND ")
		b.bound(t, s.End, false)
	}
	if len(t.ClusteringKey) > 0 {
		b.w(" ORDER BY ")
		for i, c := range t.ClusteringKey {
			if i > 0 {
				b.w(", ")
			}
			o := c.Order
			if s.Order == storage.Desc {
				o = 1 - o
			}
			b.w(t.q(c.Name), " ", o.String())
		}
	}
	if s.Limit > 0 {
		b.w(" LIMIT ", strconv.Itoa(s.Limit))
	}
	return b.sb.String(), b.args, cols
}

// bound writes the predicate for one end of a scan over a clustering-key
// prefix of k columns. "After" in clustering order is > for an ASC column
// and < for a DESC one. A start keeps rows whose prefix is after the bound
// (or equal, if inclusive); an end keeps rows whose prefix is before it.
// When the k columns share one direction, a row comparison says it and lets
// PostgreSQL use the index; otherwise the lexicographic order is spelled out.
func (b *builder) bound(t *relTable, bd *storage.Bound, start bool) {
	cc := t.ClusteringKey[:len(bd.Key)]
	vals := t.BoundValues(bd)
	strict := func(o storage.Order) string {
		if (o == storage.Asc) == start {
			return ">"
		}
		return "<"
	}
	uniform := true
	for _, c := range cc[1:] {
		uniform = uniform && c.Order == cc[0].Order
	}
	if uniform {
		op := strict(cc[0].Order)
		if bd.Inclusive {
			op += "="
		}
		names := make([]string, len(cc))
		ph := make([]string, len(cc))
		for i, c := range cc {
			names[i], ph[i] = t.q(c.Name), b.arg(vals[i])
		}
		if len(cc) == 1 {
			b.w(names[0], " ", op, " ", ph[0])
		} else {
			b.w("(", strings.Join(names, ", "), ") ", op, " (", strings.Join(ph, ", "), ")")
		}
		return
	}
	var terms []string
	for i := range cc {
		var parts []string
		for j := 0; j < i; j++ {
			parts = append(parts, t.q(cc[j].Name)+" = "+b.arg(vals[j]))
		}
		parts = append(parts, t.q(cc[i].Name)+" "+strict(cc[i].Order)+" "+b.arg(vals[i]))
		terms = append(terms, "("+strings.Join(parts, " AND ")+")")
	}
	if bd.Inclusive {
		var parts []string
		for j := range cc {
			parts = append(parts, t.q(cc[j].Name)+" = "+b.arg(vals[j]))
		}
		terms = append(terms, "("+strings.Join(parts, " AND ")+")")
	}
	b.w("(", strings.Join(terms, " OR "), ")")
}
