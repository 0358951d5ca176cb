package storage

import (
	"fmt"
	"regexp"
	"strings"
)

// Order is the direction of a clustering-key column, or of a scan.
type Order uint8

const (
	// Asc is ascending order; for a scan, the table's clustering order.
	Asc Order = iota
	// Desc is descending order; for a scan, the reverse of the table's
	// clustering order.
	Desc
)

func (o Order) String() string {
	if o == Desc {
		return "DESC"
	}
	return "ASC"
}

// MarshalText encodes the order as "ASC" or "DESC".
func (o Order) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (o *Order) UnmarshalText(b []byte) error {
	switch strings.ToUpper(string(b)) {
	case "ASC":
		*o = Asc
	case "DESC":
		*o = Desc
	default:
		return fmt.Errorf("storage: unknown order %q", b)
	}
	return nil
}

// Column is a named, typed column.
type Column struct {
	Name string   `json:"name"`
	Type DataType `json:"type"`
}

// ClusteringColumn is a column of the clustering key with its sort order.
type ClusteringColumn struct {
	Name  string   `json:"name"`
	Type  DataType `json:"type"`
	Order Order    `json:"order"`
}

// Table is a table's schema: the multi-dimensional map of Apollo Storage.
// A row is addressed by its partition key (which rows live together) and its
// clustering key (their order inside the partition); the value columns hold
// the data and may be NULL. Key columns are never NULL and never DOUBLE.
type Table struct {
	Namespace     string             `json:"namespace"`
	Name          string             `json:"name"`
	PartitionKey  []Column           `json:"partition_key"`
	ClusteringKey []ClusteringColumn `json:"clustering_key,omitempty"`
	Columns       []Column           `json:"columns,omitempty"`
}

// Limits on names and schemas; see the package documentation.
const (
	MaxNameLen    = 48
	MaxColumns    = 128
	MaxKeyColumns = 16
)

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// CheckName validates a namespace, table or column name: 1 to MaxNameLen
// characters of lower-case ASCII letters, digits and '_', starting with a
// letter. what names the kind of name in the error.
func CheckName(what, name string) error {
	switch {
	case name == "":
		return newError(ErrInvalidName, "", "", what+" name is empty")
	case len(name) > MaxNameLen:
		return newError(ErrInvalidName, "", "", fmt.Sprintf("%s name %q is longer than %d bytes", what, name, MaxNameLen))
	case !nameRE.MatchString(name):
		return newError(ErrInvalidName, "", "", fmt.Sprintf("%s name %q: use lower-case letters, digits and _, starting with a letter", what, name))
	}
	return nil
}

// CheckNamespaceName is CheckName plus the reserved names: "public",
// "information_schema", names starting with "pg_" and names starting with
// "kiroku".
func CheckNamespaceName(name string) error {
	if err := CheckName("namespace", name); err != nil {
		return err
	}
	if name == "public" || name == "information_schema" || strings.HasPrefix(name, "pg_") || strings.HasPrefix(name, "kiroku") {
		return newError(ErrInvalidName, "", "", fmt.Sprintf("namespace name %q is reserved", name))
	}
	return nil
}

// CheckTableName validates a namespace name (CheckNamespaceName) and a
// table name.
func CheckTableName(namespace, table string) error {
	if err := CheckNamespaceName(namespace); err != nil {
		return err
	}
	return CheckName("table", table)
}

// Validate checks the schema: names, at least one partition-key column,
// known types, no DOUBLE in keys, no duplicate columns, the column limits.
func (t *Table) Validate() error {
	fail := func(kind error, col, detail string) error {
		return &Error{Kind: kind, Op: "create table", Namespace: t.Namespace, Table: t.Name, Column: col, Detail: detail}
	}
	if err := CheckNamespaceName(t.Namespace); err != nil {
		return err
	}
	if err := CheckName("table", t.Name); err != nil {
		return err
	}
	if len(t.PartitionKey) == 0 {
		return fail(ErrInvalidSchema, "", "a table needs at least one partition-key column")
	}
	if n := len(t.PartitionKey) + len(t.ClusteringKey); n > MaxKeyColumns {
		return fail(ErrInvalidSchema, "", fmt.Sprintf("%d key columns, at most %d", n, MaxKeyColumns))
	}
	if n := len(t.PartitionKey) + len(t.ClusteringKey) + len(t.Columns); n > MaxColumns {
		return fail(ErrInvalidSchema, "", fmt.Sprintf("%d columns, at most %d", n, MaxColumns))
	}
	seen := map[string]bool{}
	check := func(name string, typ DataType, key bool) error {
		if err := CheckName("column", name); err != nil {
			e := err.(*Error)
			e.Op, e.Namespace, e.Table = "create table", t.Namespace, t.Name
			return e
		}
		if seen[name] {
			return fail(ErrInvalidSchema, name, "duplicate column")
		}
		seen[name] = true
		if !typ.Valid() {
			return fail(ErrInvalidSchema, name, fmt.Sprintf("unknown type %v", typ))
		}
		if key && typ == TypeDouble {
			return fail(ErrInvalidSchema, name, "DOUBLE cannot be a key column")
		}
		return nil
	}
	for _, c := range t.PartitionKey {
		if err := check(c.Name, c.Type, true); err != nil {
			return err
		}
	}
	for _, c := range t.ClusteringKey {
		if err := check(c.Name, c.Type, true); err != nil {
			return err
		}
		if c.Order != Asc && c.Order != Desc {
			return fail(ErrInvalidSchema, c.Name, "order must be ASC or DESC")
		}
	}
	for _, c := range t.Columns {
		if err := check(c.Name, c.Type, false); err != nil {
			return err
		}
	}
	return nil
}

// ColumnRole says what part of the row a column is.
type ColumnRole uint8

const (
	RolePartition ColumnRole = iota + 1
	RoleClustering
	RoleValue
)

// Lookup returns a column's type and role.
func (t *Table) Lookup(name string) (DataType, ColumnRole, bool) {
	for _, c := range t.PartitionKey {
		if c.Name == name {
			return c.Type, RolePartition, true
		}
	}
	for _, c := range t.ClusteringKey {
		if c.Name == name {
			return c.Type, RoleClustering, true
		}
	}
	for _, c := range t.Columns {
		if c.Name == name {
			return c.Type, RoleValue, true
		}
	}
	return 0, 0, false
}

// ColumnNames lists every column: partition key, clustering key, values.
func (t *Table) ColumnNames() []string {
	out := make([]string, 0, len(t.PartitionKey)+len(t.ClusteringKey)+len(t.Columns))
	for _, c := range t.PartitionKey {
		out = append(out, c.Name)
	}
	for _, c := range t.ClusteringKey {
		out = append(out, c.Name)
	}
	for _, c := range t.Columns {
		out = append(out, c.Name)
	}
	return out
}

// KeyNames lists the partition-key then clustering-key column names.
func (t *Table) KeyNames() []string {
	return t.ColumnNames()[:len(t.PartitionKey)+len(t.ClusteringKey)]
}

// Clone returns a deep copy.
func (t *Table) Clone() *Table {
	c := *t
	c.PartitionKey = append([]Column(nil), t.PartitionKey...)
	c.ClusteringKey = append([]ClusteringColumn(nil), t.ClusteringKey...)
	c.Columns = append([]Column(nil), t.Columns...)
	return &c
}

// Equal reports whether two schemas are the same.
func (t *Table) Equal(o *Table) bool {
	if t.Namespace != o.Namespace || t.Name != o.Name || len(t.PartitionKey) != len(o.PartitionKey) ||
		len(t.ClusteringKey) != len(o.ClusteringKey) || len(t.Columns) != len(o.Columns) {
		return false
	}
	for i := range t.PartitionKey {
		if t.PartitionKey[i] != o.PartitionKey[i] {
			return false
		}
	}
	for i := range t.ClusteringKey {
		if t.ClusteringKey[i] != o.ClusteringKey[i] {
			return false
		}
	}
	for i := range t.Columns {
		if t.Columns[i] != o.Columns[i] {
			return false
		}
	}
	return true
}
