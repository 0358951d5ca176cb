package storage

import (
	"fmt"
	"slices"
	"sort"
)

// Values maps column names to values: a key, the columns a Put writes, or a
// row read back. Order does not matter; the schema gives the order.
type Values map[string]Value

// Row is one row read by Get or Scan: the projected columns by name.
type Row = Values

// Get reads one row by its full primary key.
type Get struct {
	Namespace, Table string
	Partition        Values   // every partition-key column
	Clustering       Values   // every clustering-key column (nil when the table has none)
	Projection       []string // columns to return; empty returns every column
}

// Bound is one end of a scan: a prefix of the clustering key (the first k
// clustering columns, 1 ≤ k ≤ all) and whether rows matching it are included.
// An inclusive start includes every row whose clustering key begins with the
// prefix; an exclusive start skips them all; likewise for the end.
type Bound struct {
	Key       Values
	Inclusive bool
}

// Scan reads rows of one partition in clustering order.
type Scan struct {
	Namespace, Table string
	Partition        Values
	// Start and End bound the clustering key, in the table's clustering order
	// (whatever the scan's direction): Start is where that order begins, End
	// where it ends. nil means unbounded. If Start lies after End the scan is
	// empty.
	Start, End *Bound
	// Order Asc returns rows in the table's clustering order (each column ASC
	// or DESC as declared); Desc returns them in exactly the reverse order.
	Order Order
	// Limit is the maximum number of rows; 0 means no limit.
	Limit      int
	Projection []string
}

// Put writes the given value columns of one row, creating the row if it does
// not exist. Columns not named keep their value (NULL for a new row).
type Put struct {
	Namespace, Table string
	Partition        Values
	Clustering       Values
	Values           Values     // value columns to set; Null() sets NULL
	Condition        *Condition // nil writes unconditionally
	// Deferred, with a condition in a transaction, lets the backend
	// report that the condition does not hold when the transaction next
	// reaches its server, or at Commit, rather than from Put: a backend
	// that queues writes can then send this one with what follows, where
	// an answer now costs a round trip of its own. A deferred failure ends
	// the transaction with ErrConditionNotMet, and none of its writes
	// commit. A single Put, outside a transaction, answers at once.
	// Deferred without a condition is ErrInvalidArgument.
	Deferred bool
	// Skippable, with a condition, makes a condition that does not hold
	// skip the put rather than fail it: the put writes nothing and returns
	// nil, and the caller does not learn which happened. Since no answer is
	// needed, a backend that queues writes sends it with what follows, as it
	// does an unconditional put. Skippable without a condition, or with
	// Deferred, is ErrInvalidArgument.
	Skippable bool
}

// Delete removes one row. Deleting a missing row without a condition succeeds.
type Delete struct {
	Namespace, Table string
	Partition        Values
	Clustering       Values
	Condition        *Condition // nil, IfExists or If; IfNotExists is rejected
}

// Expect asks, in a transaction, that one row meet a condition: the
// transaction commits only if it does, as the transaction sees the row, and
// Expect writes nothing. It is a read whose only answer is whether to go
// on, so a backend that queues writes sends it with what follows, as it
// does a Deferred put, and its failure may likewise come from a later call
// or Commit: ErrConditionNotMet, and none of the transaction's writes
// commit. Like any read, the row must not change before the transaction
// commits, or the transaction conflicts.
type Expect struct {
	Namespace, Table string
	Partition        Values
	Clustering       Values
	Condition        *Condition // IfExists, IfNotExists or If; nil is ErrInvalidArgument
}

// Mutation is a *Put or a *Delete, for Mutate.
type Mutation interface {
	target() (namespace, table string, partition, clustering Values)
}

// MutationTable returns the namespace and table a mutation addresses.
func MutationTable(m Mutation) (namespace, table string) {
	ns, tb, _, _ := m.target()
	return ns, tb
}

func (p *Put) target() (string, string, Values, Values) {
	return p.Namespace, p.Table, p.Partition, p.Clustering
}
func (d *Delete) target() (string, string, Values, Values) {
	return d.Namespace, d.Table, d.Partition, d.Clustering
}

// ConditionKind says what a Condition checks.
type ConditionKind uint8

const (
	CondIfExists    ConditionKind = iota + 1 // the row exists
	CondIfNotExists                          // the row does not exist (Put only)
	CondIf                                   // the row exists and every expression holds
)

// Condition guards a Put or Delete. It is evaluated atomically with the
// write: if it does not hold, the call returns ErrConditionNotMet and writes
// nothing.
type Condition struct {
	Kind  ConditionKind
	Exprs []Expr // for CondIf: AND-joined, at least one
}

// IfExists, IfNotExists and If build conditions.
func IfExists() *Condition        { return &Condition{Kind: CondIfExists} }
func IfNotExists() *Condition     { return &Condition{Kind: CondIfNotExists} }
func If(exprs ...Expr) *Condition { return &Condition{Kind: CondIf, Exprs: exprs} }

// Op is a comparison operator of an Expr.
type Op uint8

const (
	OpEq Op = iota + 1
	OpNe
	OpLt
	OpLe
	OpGt
	OpGe
	OpIsNull
	OpIsNotNull
)

var opNames = [...]string{"", "=", "<>", "<", "<=", ">", ">=", "IS NULL", "IS NOT NULL"}

func (o Op) String() string {
	if o > 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Expr compares a column of the current row with a value. A comparison with
// a NULL column is false (as in SQL); use IsNull and IsNotNull for NULLs.
type Expr struct {
	Column string
	Op     Op
	Value  Value // unused for IsNull and IsNotNull
}

func Eq(col string, v Value) Expr { return Expr{col, OpEq, v} }
func Ne(col string, v Value) Expr { return Expr{col, OpNe, v} }
func Lt(col string, v Value) Expr { return Expr{col, OpLt, v} }
func Le(col string, v Value) Expr { return Expr{col, OpLe, v} }
func Gt(col string, v Value) Expr { return Expr{col, OpGt, v} }
func Ge(col string, v Value) Expr { return Expr{col, OpGe, v} }
func IsNull(col string) Expr      { return Expr{Column: col, Op: OpIsNull} }
func IsNotNull(col string) Expr   { return Expr{Column: col, Op: OpIsNotNull} }

// Eval evaluates the expression against a row's value of its column.
func (e Expr) Eval(v Value) bool {
	switch e.Op {
	case OpIsNull:
		return v.IsNull()
	case OpIsNotNull:
		return !v.IsNull()
	}
	if v.IsNull() {
		return false
	}
	c := Compare(v, e.Value)
	switch e.Op {
	case OpEq:
		return c == 0
	case OpNe:
		return c != 0
	case OpLt:
		return c < 0
	case OpLe:
		return c <= 0
	case OpGt:
		return c > 0
	case OpGe:
		return c >= 0
	}
	return false
}

// Limits bound the size of what is stored. Zero fields take the defaults.
type Limits struct {
	// MaxKeySize is the largest total size, in bytes, of a row's key values
	// (partition plus clustering; see Value.Size). 0 means DefaultMaxKeySize.
	// At most HardMaxKeySize, because PostgreSQL indexes cannot hold more.
	MaxKeySize int
	// MaxValueSize is the largest size, in bytes, of one value column.
	// 0 means DefaultMaxValueSize.
	MaxValueSize int
	// MaxWriteSize is the largest total size, in bytes, of one Put: its key
	// and every value it sets. 0 means DefaultMaxWriteSize. At most
	// HardMaxWriteSize, well under PostgreSQL's 1 GiB message limit.
	MaxWriteSize int
}

const (
	DefaultMaxKeySize   = 1024
	HardMaxKeySize      = 2048
	DefaultMaxValueSize = 4 << 20
	HardMaxValueSize    = 256 << 20
	DefaultMaxWriteSize = 16 << 20
	HardMaxWriteSize    = 512 << 20
)

// WithDefaults fills zero fields and validates the rest.
func (l Limits) WithDefaults() (Limits, error) {
	if l.MaxKeySize == 0 {
		l.MaxKeySize = DefaultMaxKeySize
	}
	if l.MaxValueSize == 0 {
		l.MaxValueSize = DefaultMaxValueSize
	}
	if l.MaxWriteSize == 0 {
		l.MaxWriteSize = max(DefaultMaxWriteSize, l.MaxValueSize)
	}
	if l.MaxKeySize < 0 || l.MaxKeySize > HardMaxKeySize {
		return l, fmt.Errorf("storage: MaxKeySize %d outside 1..%d", l.MaxKeySize, HardMaxKeySize)
	}
	if l.MaxValueSize < 0 || l.MaxValueSize > HardMaxValueSize {
		return l, fmt.Errorf("storage: MaxValueSize %d outside 1..%d", l.MaxValueSize, HardMaxValueSize)
	}
	if l.MaxWriteSize < l.MaxValueSize || l.MaxWriteSize > HardMaxWriteSize {
		return l, fmt.Errorf("storage: MaxWriteSize %d outside MaxValueSize..%d", l.MaxWriteSize, HardMaxWriteSize)
	}
	return l, nil
}

// ---- validation against a schema -------------------------------------------

func (t *Table) fail(kind error, op, col, detail string) error {
	return &Error{Kind: kind, Op: op, Namespace: t.Namespace, Table: t.Name, Column: col, Detail: detail}
}

// checkValue validates a non-key value (or condition operand) of column col.
func (t *Table) checkValue(op, col string, want DataType, v Value, lim Limits) error {
	if v.IsNull() {
		if v.typ != 0 && v.typ != want {
			return t.fail(ErrTypeMismatch, op, col, fmt.Sprintf("NULL of type %v for a %v column", v.typ, want))
		}
		return nil
	}
	if v.typ != want {
		return t.fail(ErrTypeMismatch, op, col, fmt.Sprintf("got %v, column is %v", v.typ, want))
	}
	if msg := v.checkContent(); msg != "" {
		return t.fail(ErrInvalidValue, op, col, msg)
	}
	if v.Size() > lim.MaxValueSize {
		return t.fail(ErrTooLarge, op, col, fmt.Sprintf("value of %d bytes, limit %d", v.Size(), lim.MaxValueSize))
	}
	return nil
}

// keyColumn is a column of a partition or clustering key.
type keyColumn interface {
	Column | ClusteringColumn
	nameType() (string, DataType)
}

func (c Column) nameType() (string, DataType)           { return c.Name, c.Type }
func (c ClusteringColumn) nameType() (string, DataType) { return c.Name, c.Type }

// checkKeyPart checks that vals holds exactly the given key columns.
func checkKeyPart[C keyColumn](t *Table, op, part string, cols []C, vals Values) (int, error) {
	size := 0
	for _, c := range cols {
		name, typ := c.nameType()
		v, ok := vals[name]
		if !ok {
			return 0, t.fail(ErrInvalidKey, op, name, "missing "+part+"-key column")
		}
		if v.IsNull() {
			return 0, t.fail(ErrInvalidKey, op, name, "key columns cannot be NULL")
		}
		if v.typ != typ {
			return 0, t.fail(ErrTypeMismatch, op, name, fmt.Sprintf("got %v, column is %v", v.typ, typ))
		}
		if msg := v.checkContent(); msg != "" {
			return 0, t.fail(ErrInvalidValue, op, name, msg)
		}
		size += v.Size()
	}
	if len(vals) != len(cols) {
		for name := range vals {
			if !slices.ContainsFunc(cols, func(c C) bool { n, _ := c.nameType(); return n == name }) {
				return 0, t.fail(ErrInvalidKey, op, name, "not a "+part+"-key column")
			}
		}
	}
	return size, nil
}

// CheckKey validates a full primary key: every partition and clustering
// column present with the right type, nothing extra, within MaxKeySize.
func (t *Table) CheckKey(op string, partition, clustering Values, lim Limits) error {
	ps, err := checkKeyPart(t, op, "partition", t.PartitionKey, partition)
	if err != nil {
		return err
	}
	cs, err := checkKeyPart(t, op, "clustering", t.ClusteringKey, clustering)
	if err != nil {
		return err
	}
	if ps+cs > lim.MaxKeySize {
		return t.fail(ErrTooLarge, op, "", fmt.Sprintf("key of %d bytes, limit %d", ps+cs, lim.MaxKeySize))
	}
	return nil
}

func (t *Table) checkProjection(op string, proj []string) error {
	for _, name := range proj {
		if _, _, ok := t.Lookup(name); !ok {
			return t.fail(ErrUnknownColumn, op, name, "in projection")
		}
	}
	return nil
}

// CheckGet validates a Get against the schema and limits.
func (t *Table) CheckGet(g *Get, lim Limits) error {
	if err := t.CheckKey("get", g.Partition, g.Clustering, lim); err != nil {
		return err
	}
	return t.checkProjection("get", g.Projection)
}

// CheckScan validates a Scan: the partition key, the bounds (each a prefix
// of the clustering key), order, limit and projection.
func (t *Table) CheckScan(s *Scan, lim Limits) error {
	const op = "scan"
	ps, err := checkKeyPart(t, op, "partition", t.PartitionKey, s.Partition)
	if err != nil {
		return err
	}
	if ps > lim.MaxKeySize {
		return t.fail(ErrTooLarge, op, "", fmt.Sprintf("partition key of %d bytes, limit %d", ps, lim.MaxKeySize))
	}
	for _, b := range []*Bound{s.Start, s.End} {
		if b == nil {
			continue
		}
		if err := t.checkBound(b); err != nil {
			return err
		}
	}
	if s.Order != Asc && s.Order != Desc {
		return t.fail(ErrInvalidArgument, op, "", fmt.Sprintf("order %d", s.Order))
	}
	if s.Limit < 0 {
		return t.fail(ErrInvalidArgument, op, "", fmt.Sprintf("negative limit %d", s.Limit))
	}
	return t.checkProjection(op, s.Projection)
}

func (t *Table) checkBound(b *Bound) error {
	const op = "scan"
	if len(b.Key) == 0 {
		return t.fail(ErrInvalidBound, op, "", "a bound needs at least one clustering column (use nil for no bound)")
	}
	for _, name := range sortedNames(b.Key) {
		if _, role, _ := t.Lookup(name); role != RoleClustering {
			return t.fail(ErrInvalidBound, op, name, "not a clustering-key column")
		}
	}
	for _, c := range t.ClusteringKey[:len(b.Key)] {
		v, ok := b.Key[c.Name]
		if !ok {
			return t.fail(ErrInvalidBound, op, c.Name, "bound columns must be a prefix of the clustering key; this column is missing")
		}
		if v.IsNull() {
			return t.fail(ErrInvalidBound, op, c.Name, "bound values cannot be NULL")
		}
		if v.typ != c.Type {
			return t.fail(ErrTypeMismatch, op, c.Name, fmt.Sprintf("got %v, column is %v", v.typ, c.Type))
		}
		if msg := v.checkContent(); msg != "" {
			return t.fail(ErrInvalidValue, op, c.Name, msg)
		}
	}
	return nil
}

// BoundValues returns a checked bound's values in clustering order.
func (t *Table) BoundValues(b *Bound) []Value {
	out := make([]Value, 0, len(b.Key))
	for _, c := range t.ClusteringKey[:len(b.Key)] {
		out = append(out, b.Key[c.Name])
	}
	return out
}

// KeyValues returns a checked key's values: partition columns then
// clustering columns, in schema order.
func (t *Table) KeyValues(partition, clustering Values) []Value {
	out := make([]Value, 0, len(t.PartitionKey)+len(t.ClusteringKey))
	for _, c := range t.PartitionKey {
		out = append(out, partition[c.Name])
	}
	for _, c := range t.ClusteringKey {
		out = append(out, clustering[c.Name])
	}
	return out
}

func (t *Table) checkCondition(op string, c *Condition, lim Limits) error {
	if c == nil {
		return nil
	}
	switch c.Kind {
	case CondIfExists, CondIfNotExists:
		if len(c.Exprs) != 0 {
			return t.fail(ErrInvalidArgument, op, "", "IfExists and IfNotExists take no expressions")
		}
		if c.Kind == CondIfNotExists && op == "delete" {
			return t.fail(ErrInvalidArgument, op, "", "IfNotExists does not apply to a delete")
		}
		return nil
	case CondIf:
	default:
		return t.fail(ErrInvalidArgument, op, "", fmt.Sprintf("unknown condition kind %d", c.Kind))
	}
	if len(c.Exprs) == 0 {
		return t.fail(ErrInvalidArgument, op, "", "If needs at least one expression")
	}
	for _, e := range c.Exprs {
		typ, _, ok := t.Lookup(e.Column)
		if !ok {
			return t.fail(ErrUnknownColumn, op, e.Column, "in condition")
		}
		switch e.Op {
		case OpIsNull, OpIsNotNull:
			continue
		case OpEq, OpNe, OpLt, OpLe, OpGt, OpGe:
		default:
			return t.fail(ErrInvalidArgument, op, e.Column, fmt.Sprintf("unknown operator %d", e.Op))
		}
		if e.Value.IsNull() {
			return t.fail(ErrInvalidArgument, op, e.Column, fmt.Sprintf("%v NULL is never true; use IsNull or IsNotNull", e.Op))
		}
		if err := t.checkValue(op, e.Column, typ, e.Value, lim); err != nil {
			return err
		}
	}
	return nil
}

// CheckPut validates a Put: key, value columns (which must be value
// columns, not key columns), types, sizes and condition.
func (t *Table) CheckPut(p *Put, lim Limits) error {
	const op = "put"
	if err := t.CheckKey(op, p.Partition, p.Clustering, lim); err != nil {
		return err
	}
	total := 0
	for _, v := range p.Partition {
		total += v.Size()
	}
	for _, v := range p.Clustering {
		total += v.Size()
	}
	// Map order first, without sorting; a put that fails is checked again
	// in name order, so that the error names the same column every time.
	for name, v := range p.Values {
		if t.checkPutValue(op, name, v, lim) != nil {
			return t.firstBadValue(op, p.Values, lim)
		}
		total += v.Size()
	}
	if total > lim.MaxWriteSize {
		return t.fail(ErrTooLarge, op, "", fmt.Sprintf("put of %d bytes, limit %d", total, lim.MaxWriteSize))
	}
	if p.Deferred && p.Condition == nil {
		return t.fail(ErrInvalidArgument, op, "", "Deferred takes a condition")
	}
	if p.Skippable && (p.Condition == nil || p.Deferred) {
		return t.fail(ErrInvalidArgument, op, "", "Skippable takes a condition, and not Deferred")
	}
	return t.checkCondition(op, p.Condition, lim)
}

// firstBadValue returns the error of the first bad column of vs in name
// order.
func (t *Table) firstBadValue(op string, vs Values, lim Limits) error {
	for _, name := range sortedNames(vs) {
		if err := t.checkPutValue(op, name, vs[name], lim); err != nil {
			return err
		}
	}
	return nil
}

func (t *Table) checkPutValue(op, name string, v Value, lim Limits) error {
	typ, role, ok := t.Lookup(name)
	if !ok {
		return t.fail(ErrUnknownColumn, op, name, "")
	}
	if role != RoleValue {
		return t.fail(ErrInvalidArgument, op, name, "key columns go in Partition and Clustering, not Values")
	}
	return t.checkValue(op, name, typ, v, lim)
}

// CheckDelete validates a Delete.
func (t *Table) CheckDelete(d *Delete, lim Limits) error {
	if err := t.CheckKey("delete", d.Partition, d.Clustering, lim); err != nil {
		return err
	}
	return t.checkCondition("delete", d.Condition, lim)
}

// CheckExpect validates an Expect.
func (t *Table) CheckExpect(e *Expect, lim Limits) error {
	const op = "expect"
	if err := t.CheckKey(op, e.Partition, e.Clustering, lim); err != nil {
		return err
	}
	if e.Condition == nil {
		return t.fail(ErrInvalidArgument, op, "", "Expect takes a condition")
	}
	return t.checkCondition(op, e.Condition, lim)
}

// CheckMutation validates one Put or Delete.
func (t *Table) CheckMutation(m Mutation, lim Limits) error {
	switch m := m.(type) {
	case *Put:
		return t.CheckPut(m, lim)
	case *Delete:
		return t.CheckDelete(m, lim)
	}
	return t.fail(ErrInvalidArgument, "mutate", "", fmt.Sprintf("unknown mutation %T", m))
}

// CheckMutationTarget checks that every mutation addresses the same table
// and partition, which Mutate requires for atomicity, and returns that table.
func CheckMutationTarget(ms []Mutation) (namespace, table string, err error) {
	if len(ms) == 0 {
		return "", "", newError(ErrInvalidArgument, "mutate", "", "no mutations")
	}
	for i, m := range ms {
		if m == nil || m == (*Put)(nil) || m == (*Delete)(nil) {
			return "", "", newError(ErrInvalidArgument, "mutate", "", fmt.Sprintf("mutation %d is nil", i))
		}
	}
	ns, tb, part, _ := ms[0].target()
	for i, m := range ms[1:] {
		ns2, tb2, part2, _ := m.target()
		if ns2 != ns || tb2 != tb {
			return "", "", newError(ErrInvalidArgument, "mutate", "",
				fmt.Sprintf("mutation %d is on %s.%s, the first on %s.%s: a Mutate covers one partition of one table", i+1, ns2, tb2, ns, tb))
		}
		if !sameValues(part, part2) {
			return "", "", newError(ErrInvalidArgument, "mutate", "",
				fmt.Sprintf("mutation %d is on another partition: a Mutate covers one partition", i+1))
		}
	}
	return ns, tb, nil
}

func sameValues(a, b Values) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !v.Equal(w) {
			return false
		}
	}
	return true
}

func sortedNames(v Values) []string {
	names := make([]string, 0, len(v))
	for k := range v {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
