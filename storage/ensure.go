package storage

import (
	"context"
	"errors"
)

// EnsureTables makes namespace ns hold tables, each with its schema: it
// creates the namespace and the tables that are missing, and fails with an
// *Error of kind ErrInvalidSchema if one exists with another schema. It
// checks every existing table before it creates anything, so a store laid
// out by another program, or by another version, is left as it was. A
// table another process creates meanwhile is checked like an existing one.
func EnsureTables(ctx context.Context, a Admin, ns string, tables []*Table) error {
	if err := a.CreateNamespace(ctx, ns); err != nil && !errors.Is(err, ErrNamespaceExists) {
		return err
	}
	missing := make([]*Table, 0, len(tables))
	for _, t := range tables {
		switch have, err := a.DescribeTable(ctx, ns, t.Name); {
		case errors.Is(err, ErrTableNotFound):
			missing = append(missing, t)
		case err != nil:
			return err
		case !have.Equal(t):
			return schemaMismatch(ns, t.Name)
		}
	}
	for _, t := range missing {
		err := a.CreateTable(ctx, t)
		if errors.Is(err, ErrTableExists) { // another process created it meanwhile
			var have *Table
			if have, err = a.DescribeTable(ctx, ns, t.Name); err == nil && !have.Equal(t) {
				err = schemaMismatch(ns, t.Name)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func schemaMismatch(ns, table string) error {
	return &Error{Kind: ErrInvalidSchema, Op: "ensure table", Namespace: ns, Table: table,
		Detail: "the table exists with another schema"}
}
