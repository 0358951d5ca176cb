package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kiroku-db/kiroku/storage"
)

// DDL runs in one PostgreSQL transaction with the metadata change, under an
// advisory lock, so a crash or a concurrent process never sees a table
// without its schema or the other way round.

func namespaceExists(ctx context.Context, q pgx.Tx, name string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM kiroku_meta.namespaces WHERE name = $1`, name).Scan(&n)
	return n > 0, err
}

// namespaceDDL checks the name, then runs fn under the DDL lock with
// whether the namespace exists.
func (b *Backend) namespaceDDL(ctx context.Context, op, name string, fn func(tx pgx.Tx, exists bool) error) error {
	if err := b.checkOpen(op); err != nil {
		return err
	}
	if err := storage.CheckNamespaceName(name); err != nil {
		return storage.WithOp(err, op)
	}
	return b.inTx(ctx, op, func(tx pgx.Tx) error {
		ok, err := namespaceExists(ctx, tx, name)
		if err != nil {
			return err
		}
		return fn(tx, ok)
	})
}

// CreateNamespace implements storage.Admin.
func (b *Backend) CreateNamespace(ctx context.Context, name string) error {
	const op = "create namespace"
	return b.namespaceDDL(ctx, op, name, func(tx pgx.Tx, exists bool) error {
		if exists {
			return &storage.Error{Kind: storage.ErrNamespaceExists, Op: op, Namespace: name}
		}
		var other int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&other); err != nil {
			return err
		}
		if other > 0 {
			return &storage.Error{Kind: storage.ErrNamespaceExists, Op: op, Namespace: name,
				Detail: "a PostgreSQL schema of that name exists outside kiroku"}
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+ident(name)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO kiroku_meta.namespaces (name) VALUES ($1)`, name)
		return err
	})
}

// DropNamespace implements storage.Admin.
func (b *Backend) DropNamespace(ctx context.Context, name string) error {
	const op = "drop namespace"
	return b.namespaceDDL(ctx, op, name, func(tx pgx.Tx, exists bool) error {
		if !exists {
			return &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: name}
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM kiroku_meta.tables WHERE namespace = $1`, name).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return &storage.Error{Kind: storage.ErrNamespaceNotEmpty, Op: op, Namespace: name,
				Detail: fmt.Sprintf("%d tables left", n)}
		}
		if _, err := tx.Exec(ctx, "DROP SCHEMA "+ident(name)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM kiroku_meta.namespaces WHERE name = $1`, name)
		return err
	})
}

// ListNamespaces implements storage.Admin.
func (b *Backend) ListNamespaces(ctx context.Context) ([]string, error) {
	return b.listNames(ctx, "list namespaces", `SELECT name FROM kiroku_meta.namespaces ORDER BY name`)
}

// ListTables implements storage.Admin.
func (b *Backend) ListTables(ctx context.Context, namespace string) ([]string, error) {
	const op = "list tables"
	if err := storage.CheckNamespaceName(namespace); err != nil {
		return nil, storage.WithOp(err, op)
	}
	names, err := b.listNames(ctx, op, `SELECT name FROM kiroku_meta.tables WHERE namespace = $1 ORDER BY name`, namespace)
	if err != nil || len(names) > 0 {
		return names, err
	}
	if err := b.requireNamespace(ctx, b.pool, op, namespace); err != nil {
		return nil, err
	}
	return []string{}, nil
}

func (b *Backend) listNames(ctx context.Context, op, q string, args ...any) ([]string, error) {
	if err := b.checkOpen(op); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, mapErr(op, "", "", err, false)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, mapErr(op, "", "", err, false)
	}
	if names == nil {
		names = []string{}
	}
	return names, nil
}

func (b *Backend) requireNamespace(ctx context.Context, q querier, op, namespace string) error {
	var n int
	rows, err := q.Query(ctx, `SELECT count(*) FROM kiroku_meta.namespaces WHERE name = $1`, namespace)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&n}, func() error { return nil })
	}
	if err != nil {
		return mapErr(op, namespace, "", err, false)
	}
	if n == 0 {
		return &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: namespace}
	}
	return nil
}

// CreateTable implements storage.Admin.
func (b *Backend) CreateTable(ctx context.Context, t *storage.Table) error {
	const op = "create table"
	if err := b.checkOpen(op); err != nil {
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
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	rt := newRelTable(t, t.Name+"$"+hex.EncodeToString(tag[:]))
	err = b.inTx(ctx, op, func(tx pgx.Tx) error {
		ok, err := namespaceExists(ctx, tx, t.Namespace)
		if err != nil {
			return err
		}
		if !ok {
			return &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: t.Namespace, Table: t.Name}
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM kiroku_meta.tables WHERE namespace = $1 AND name = $2`,
			t.Namespace, t.Name).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return &storage.Error{Kind: storage.ErrTableExists, Op: op, Namespace: t.Namespace, Table: t.Name}
		}
		for _, q := range createTableSQL(rt) {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO kiroku_meta.tables (namespace, name, relation, definition) VALUES ($1, $2, $3, $4)`,
			t.Namespace, t.Name, rt.rel, def)
		return err
	})
	if err == nil {
		b.cache(rt)
	}
	return err
}

// DropTable implements storage.Admin.
func (b *Backend) DropTable(ctx context.Context, namespace, table string) error {
	const op = "drop table"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	if err := storage.CheckTableName(namespace, table); err != nil {
		return storage.WithOp(err, op)
	}
	defer b.uncache(namespace, table)
	return b.inTx(ctx, op, func(tx pgx.Tx) error {
		var rel string
		err := tx.QueryRow(ctx, `DELETE FROM kiroku_meta.tables WHERE namespace = $1 AND name = $2 RETURNING relation`,
			namespace, table).Scan(&rel)
		if errors.Is(err, pgx.ErrNoRows) {
			ok, err := namespaceExists(ctx, tx, namespace)
			if err != nil {
				return err
			}
			kind := storage.ErrTableNotFound
			if !ok {
				kind = storage.ErrNamespaceNotFound
			}
			return &storage.Error{Kind: kind, Op: op, Namespace: namespace, Table: table}
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{namespace, rel}.Sanitize())
		return err
	})
}

// DescribeTable implements storage.Admin.
func (b *Backend) DescribeTable(ctx context.Context, namespace, table string) (*storage.Table, error) {
	t, err := b.table(ctx, "describe table", namespace, table)
	if err != nil {
		return nil, err
	}
	return t.Table.Clone(), nil
}

// table returns a table's schema, from the cache or the metadata table.
// The cache is filled on first use and by this process's DDL; a table
// dropped or replaced by another process is noticed when PostgreSQL reports
// its relation missing (see relTable).
func (b *Backend) table(ctx context.Context, op, namespace, table string) (*relTable, error) {
	return b.tableVia(ctx, b.pool, op, namespace, table)
}

// tableVia is table with the metadata read through q: a transaction looks
// schemas up on its own connection, so a pool of one connection cannot
// deadlock.
func (b *Backend) tableVia(ctx context.Context, q querier, op, namespace, table string) (*relTable, error) {
	if err := b.checkOpen(op); err != nil {
		return nil, err
	}
	key := namespace + "." + table
	b.mu.RLock()
	t := b.mu.tables[key]
	b.mu.RUnlock()
	if t != nil {
		return t, nil
	}
	if err := storage.CheckTableName(namespace, table); err != nil {
		return nil, storage.WithOp(err, op)
	}
	var def []byte
	var rel string
	rows, err := q.Query(ctx, `SELECT definition, relation FROM kiroku_meta.tables WHERE namespace = $1 AND name = $2`,
		namespace, table)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&def, &rel}, func() error { return nil })
	}
	if err == nil && def == nil {
		if err := b.requireNamespace(ctx, q, op, namespace); err != nil {
			return nil, err
		}
		return nil, &storage.Error{Kind: storage.ErrTableNotFound, Op: op, Namespace: namespace, Table: table}
	}
	if err != nil {
		return nil, mapErr(op, namespace, table, err, false)
	}
	schema := new(storage.Table)
	if err := json.Unmarshal(def, schema); err != nil {
		return nil, fmt.Errorf("storage: %s %s: corrupt schema in kiroku_meta.tables: %w", op, key, err)
	}
	if err := schema.Validate(); err != nil {
		return nil, fmt.Errorf("storage: %s %s: invalid schema in kiroku_meta.tables: %w", op, key, err)
	}
	t = newRelTable(schema, rel)
	b.cache(t)
	return t, nil
}

func (b *Backend) cache(t *relTable) {
	b.mu.Lock()
	b.mu.tables[t.Namespace+"."+t.Name] = t
	b.mu.Unlock()
}

func (b *Backend) uncache(namespace, table string) {
	b.mu.Lock()
	delete(b.mu.tables, namespace+"."+table)
	b.mu.Unlock()
}
