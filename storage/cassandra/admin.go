package cassandra

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/kiroku-db/kiroku/storage"
)

// The catalog (see the package doc) is one partition (part = 0) of the
// table kiroku_catalog, clustered by (namespace, name):
//
//	namespace  name   columns
//	''         ''     version: the catalog's layout version
//	ns         ''     gen: a UUID every CreateTable in ns replaces
//	ns         table  state (creating | ready | dropping), relation, id, definition
//
// Every write to it is a lightweight transaction and every read is at the
// serial consistency, so catalog changes are linearizable.

// Table states in the catalog.
const (
	stateCreating = "creating"
	stateReady    = "ready"
	stateDropping = "dropping"
)

// ddlAttempts bounds the retries of a catalog change that lost a race with
// another process's change to the same namespace.
const ddlAttempts = 20

// catalogCAS runs a conditional catalog write and returns whether it was
// applied, and the current row if it was not.
func (db *DB) catalogCAS(ctx context.Context, op, q string, args ...any) (bool, map[string]any, error) {
	row := map[string]any{}
	applied, err := db.session.Query(q, args...).Consistency(db.cfg.consistency).SerialConsistency(db.cfg.serial).
		MapScanCASContext(ctx, row)
	if err != nil {
		return false, nil, mapErr(op, "", "", err, true)
	}
	return applied, row, nil
}

// catalogEntry is a table's row of the catalog.
type catalogEntry struct {
	name, state, relation, id, definition string
}

// readNamespace reads a namespace's rows: whether it exists, its gen, and
// its tables in name order.
func (db *DB) readNamespace(ctx context.Context, op, ns string) (exists bool, gen string, tables []catalogEntry, err error) {
	iter := db.session.Query(`SELECT name, gen, state, relation, id, definition FROM `+db.catalog+
		` WHERE part = 0 AND namespace = ?`, ns).Consistency(db.cfg.serial).IterContext(ctx)
	var e catalogEntry
	var g string
	for iter.Scan(&e.name, &g, &e.state, &e.relation, &e.id, &e.definition) {
		if e.name == "" {
			exists, gen = true, g
		} else {
			tables = append(tables, e)
		}
	}
	if err := iter.Close(); err != nil {
		return false, "", nil, mapErr(op, ns, "", err, false)
	}
	return exists, gen, tables, nil
}

// readTable reads a table's row of the catalog; ok is false if there is none.
func (db *DB) readTable(ctx context.Context, op, ns, name string) (e catalogEntry, ok bool, err error) {
	e.name = name
	err = db.session.Query(`SELECT state, relation, id, definition FROM `+db.catalog+
		` WHERE part = 0 AND namespace = ? AND name = ?`, ns, name).Consistency(db.cfg.serial).
		ScanContext(ctx, &e.state, &e.relation, &e.id, &e.definition)
	if errors.Is(err, gocql.ErrNotFound) {
		return e, false, nil
	}
	if err != nil {
		return e, false, mapErr(op, ns, name, err, false)
	}
	return e, true, nil
}

func (db *DB) requireNamespace(ctx context.Context, op, ns string) error {
	exists, _, _, err := db.readNamespace(ctx, op, ns)
	if err == nil && !exists {
		err = &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: ns}
	}
	return err
}

func newUUID() string {
	u, err := gocql.RandomUUID()
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return u.String()
}

// CreateNamespace implements storage.Admin.
func (db *DB) CreateNamespace(ctx context.Context, name string) error {
	const op = "create namespace"
	if err := db.checkOpen(op); err != nil {
		return err
	}
	if err := storage.CheckNamespaceName(name); err != nil {
		return storage.WithOp(err, op)
	}
	applied, _, err := db.catalogCAS(ctx, op, `UPDATE `+db.catalog+
		` SET gen = ? WHERE part = 0 AND namespace = ? AND name = '' IF gen = null`, newUUID(), name)
	if err == nil && !applied {
		err = &storage.Error{Kind: storage.ErrNamespaceExists, Op: op, Namespace: name}
	}
	return err
}

// DropNamespace implements storage.Admin. It deletes the namespace's row
// only if its gen is the one it read when it saw no tables: a CreateTable
// in between changes the gen, and the namespace is read again.
func (db *DB) DropNamespace(ctx context.Context, name string) error {
	const op = "drop namespace"
	if err := db.checkOpen(op); err != nil {
		return err
	}
	if err := storage.CheckNamespaceName(name); err != nil {
		return storage.WithOp(err, op)
	}
	for range ddlAttempts {
		exists, gen, tables, err := db.readNamespace(ctx, op, name)
		if err != nil {
			return err
		}
		if !exists {
			return &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: name}
		}
		live := 0
		for _, t := range tables {
			if t.state == stateDropping { // a drop left half done: finish it
				if err := db.finishDrop(ctx, op, name, t); err != nil {
					return err
				}
				continue
			}
			live++
		}
		if live > 0 {
			return &storage.Error{Kind: storage.ErrNamespaceNotEmpty, Op: op, Namespace: name, Detail: fmt.Sprintf("%d tables left", live)}
		}
		if len(tables) > 0 {
			continue // read again after finishing drops
		}
		applied, _, err := db.catalogCAS(ctx, op, `DELETE FROM `+db.catalog+
			` WHERE part = 0 AND namespace = ? AND name = '' IF gen = ?`, name, gen)
		if err != nil || applied {
			return err
		}
	}
	return &storage.Error{Kind: storage.ErrConflict, Op: op, Namespace: name, Detail: "the namespace kept changing"}
}

// ListNamespaces implements storage.Admin.
func (db *DB) ListNamespaces(ctx context.Context) ([]string, error) {
	const op = "list namespaces"
	if err := db.checkOpen(op); err != nil {
		return nil, err
	}
	iter := db.session.Query(`SELECT namespace, name FROM ` + db.catalog + ` WHERE part = 0`).
		Consistency(db.cfg.serial).IterContext(ctx)
	out := []string{}
	var ns, name string
	for iter.Scan(&ns, &name) {
		if ns != "" && name == "" {
			out = append(out, ns) // in clustering order: sorted bytewise
		}
	}
	if err := iter.Close(); err != nil {
		return nil, mapErr(op, "", "", err, false)
	}
	return out, nil
}

// ListTables implements storage.Admin.
func (db *DB) ListTables(ctx context.Context, namespace string) ([]string, error) {
	const op = "list tables"
	if err := db.checkOpen(op); err != nil {
		return nil, err
	}
	if err := storage.CheckNamespaceName(namespace); err != nil {
		return nil, storage.WithOp(err, op)
	}
	exists, _, tables, err := db.readNamespace(ctx, op, namespace)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: namespace}
	}
	out := []string{}
	for _, t := range tables {
		if t.state != stateDropping {
			out = append(out, t.name)
		}
	}
	return out, nil
}

// relationName names a new table's CQL table: its namespace and name, cut
// to 12 bytes each so that the whole is at most Cassandra's 48 characters,
// and 16 random hex digits.
func relationName(ns, table string) string {
	var r [8]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%.12s_%.12s_%s", ns, table, hex.EncodeToString(r[:]))
}

// CreateTable implements storage.Admin: the catalog row first (with the
// namespace's gen, in one conditional batch that requires the namespace),
// then the CQL table.
func (db *DB) CreateTable(ctx context.Context, t *storage.Table) error {
	const op = "create table"
	if err := db.checkOpen(op); err != nil {
		return err
	}
	if t == nil {
		return &storage.Error{Kind: storage.ErrInvalidSchema, Op: op, Detail: "nil table"}
	}
	t = t.Clone()
	if err := t.Validate(); err != nil {
		return storage.WithOp(err, op)
	}
	def, err := json.Marshal(t)
	if err != nil {
		return err
	}
	rt := newRelTable(db.cfg.Keyspace, t, relationName(t.Namespace, t.Name), newUUID())
	if err := db.claimTable(ctx, op, rt, string(def)); err != nil {
		return err
	}
	if err := db.finishCreate(ctx, op, rt); err != nil {
		return err
	}
	db.cache(rt)
	return nil
}

// claimTable writes a new table's catalog row, in state creating, and
// replaces its namespace's gen, in one conditional batch that requires the
// namespace to exist and the table not to.
func (db *DB) claimTable(ctx context.Context, op string, rt *relTable, def string) error {
	t := rt.Table
	for range ddlAttempts {
		b := db.session.Batch(gocql.UnloggedBatch).Consistency(db.cfg.consistency).SerialConsistency(db.cfg.serial)
		b.Query(`UPDATE `+db.catalog+` SET gen = ? WHERE part = 0 AND namespace = ? AND name = '' IF gen != null`,
			newUUID(), t.Namespace)
		b.Query(`UPDATE `+db.catalog+` SET state = ?, relation = ?, id = ?, definition = ? WHERE part = 0 AND namespace = ? AND name = ? IF state = null`,
			stateCreating, rt.rel, rt.id, def, t.Namespace, t.Name)
		applied, iter, err := b.MapExecCASContext(ctx, map[string]any{})
		if iter != nil {
			_ = iter.Close()
		}
		if err != nil {
			return mapErr(op, t.Namespace, t.Name, err, true)
		}
		if applied {
			return nil
		}
		exists, _, tables, err := db.readNamespace(ctx, op, t.Namespace)
		switch {
		case err != nil:
			return err
		case !exists:
			return &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: t.Namespace, Table: t.Name}
		}
		for _, e := range tables {
			if e.name == t.Name {
				return &storage.Error{Kind: storage.ErrTableExists, Op: op, Namespace: t.Namespace, Table: t.Name}
			}
		}
	}
	return &storage.Error{Kind: storage.ErrConflict, Op: op, Namespace: t.Namespace, Table: t.Name, Detail: "the namespace kept changing"}
}

// finishCreate creates the CQL table of a catalog row in state creating
// and marks it ready. Any process may run it: the CQL table's name and id
// are the row's, so every run makes the same table. If the row was dropped
// meanwhile, the CQL table just made is dropped again.
func (db *DB) finishCreate(ctx context.Context, op string, rt *relTable) error {
	if err := db.ddl(ctx, op, createTableCQL(rt)); err != nil {
		return withTable(err, rt.Namespace, rt.Name)
	}
	applied, _, err := db.catalogCAS(ctx, op, `UPDATE `+db.catalog+
		` SET state = ? WHERE part = 0 AND namespace = ? AND name = ? IF state = ? AND relation = ?`,
		stateReady, rt.Namespace, rt.Name, stateCreating, rt.rel)
	if err != nil || applied {
		return err
	}
	e, ok, err := db.readTable(ctx, op, rt.Namespace, rt.Name)
	if err != nil {
		return err
	}
	if !ok || e.relation != rt.rel {
		// Dropped (and perhaps created again) while this creation ran.
		return db.ddl(ctx, op, "DROP TABLE IF EXISTS "+rt.qname)
	}
	return nil // another process finished it
}

// finishDrop drops the CQL table of a catalog row in state dropping and
// deletes the row. Any process may run it.
func (db *DB) finishDrop(ctx context.Context, op, ns string, e catalogEntry) error {
	if err := db.ddl(ctx, op, "DROP TABLE IF EXISTS "+db.ks+"."+ident(e.relation)); err != nil {
		return withTable(err, ns, e.name)
	}
	_, _, err := db.catalogCAS(ctx, op, `DELETE FROM `+db.catalog+
		` WHERE part = 0 AND namespace = ? AND name = ? IF relation = ?`, ns, e.name, e.relation)
	return err
}

// DropTable implements storage.Admin: the catalog row is marked dropping,
// the CQL table dropped, the row deleted.
func (db *DB) DropTable(ctx context.Context, namespace, table string) error {
	const op = "drop table"
	if err := db.checkOpen(op); err != nil {
		return err
	}
	if err := storage.CheckTableName(namespace, table); err != nil {
		return storage.WithOp(err, op)
	}
	defer db.uncache(namespace, table)
	for range ddlAttempts {
		e, ok, err := db.readTable(ctx, op, namespace, table)
		if err != nil {
			return err
		}
		if !ok {
			if err := db.requireNamespace(ctx, op, namespace); err != nil {
				return err
			}
			return &storage.Error{Kind: storage.ErrTableNotFound, Op: op, Namespace: namespace, Table: table}
		}
		if e.state == stateDropping { // another process is dropping it, or died doing so
			if err := db.finishDrop(ctx, op, namespace, e); err != nil {
				return err
			}
			return &storage.Error{Kind: storage.ErrTableNotFound, Op: op, Namespace: namespace, Table: table}
		}
		applied, _, err := db.catalogCAS(ctx, op, `UPDATE `+db.catalog+
			` SET state = ? WHERE part = 0 AND namespace = ? AND name = ? IF relation = ?`,
			stateDropping, namespace, table, e.relation)
		if err != nil {
			return err
		}
		if applied {
			e.state = stateDropping
			return db.finishDrop(ctx, op, namespace, e)
		}
	}
	return &storage.Error{Kind: storage.ErrConflict, Op: op, Namespace: namespace, Table: table, Detail: "the table kept changing"}
}

// DescribeTable implements storage.Admin.
func (db *DB) DescribeTable(ctx context.Context, namespace, table string) (*storage.Table, error) {
	t, err := db.table(ctx, "describe table", namespace, table)
	if err != nil {
		return nil, err
	}
	return t.Table.Clone(), nil
}

func withTable(err error, ns, table string) error {
	var se *storage.Error
	if errors.As(err, &se) && se.Namespace == "" {
		se.Namespace, se.Table = ns, table
	}
	return err
}

// table returns a table's schema, from the cache or the catalog. The cache
// is filled on first use and by this process's DDL; a table dropped or
// replaced by another process is noticed when Cassandra reports its CQL
// table missing (mapErr), which uncaches it. A table found half created is
// finished; one found half dropped is finished too, and not found.
func (db *DB) table(ctx context.Context, op, namespace, table string) (*relTable, error) {
	if err := db.checkOpen(op); err != nil {
		return nil, err
	}
	key := namespace + "." + table
	db.mu.RLock()
	t := db.mu.tables[key]
	db.mu.RUnlock()
	if t != nil {
		return t, nil
	}
	if err := storage.CheckTableName(namespace, table); err != nil {
		return nil, storage.WithOp(err, op)
	}
	e, ok, err := db.readTable(ctx, op, namespace, table)
	if err != nil {
		return nil, err
	}
	if ok && e.state == stateDropping {
		if err := db.finishDrop(ctx, op, namespace, e); err != nil {
			return nil, err
		}
		ok = false
	}
	if !ok {
		if err := db.requireNamespace(ctx, op, namespace); err != nil {
			return nil, err
		}
		return nil, &storage.Error{Kind: storage.ErrTableNotFound, Op: op, Namespace: namespace, Table: table}
	}
	schema := new(storage.Table)
	if err := json.Unmarshal([]byte(e.definition), schema); err != nil {
		return nil, fmt.Errorf("storage: %s %s: corrupt schema in the catalog: %w", op, key, err)
	}
	if err := schema.Validate(); err != nil {
		return nil, fmt.Errorf("storage: %s %s: invalid schema in the catalog: %w", op, key, err)
	}
	if schema.Namespace != namespace || schema.Name != table {
		return nil, fmt.Errorf("storage: %s %s: the catalog's schema is of %s.%s", op, key, schema.Namespace, schema.Name)
	}
	t = newRelTable(db.cfg.Keyspace, schema, e.relation, e.id)
	if e.state == stateCreating {
		if err := db.finishCreate(ctx, op, t); err != nil {
			return nil, err
		}
	}
	db.cache(t)
	return t, nil
}

func (db *DB) cache(t *relTable) {
	db.mu.Lock()
	db.mu.tables[t.Namespace+"."+t.Name] = t
	db.mu.Unlock()
}

func (db *DB) uncache(namespace, table string) {
	db.mu.Lock()
	delete(db.mu.tables, namespace+"."+table)
	db.mu.Unlock()
}
