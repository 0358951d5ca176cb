package cassandra

import (
	"context"
	"encoding/json"

	"github.com/kiroku-db/kiroku/storage"
)

// ClaimOnly does the first step of CreateTable and stops, as a process
// that died right after it would.
func ClaimOnly(ctx context.Context, db *DB, t *storage.Table) error {
	def, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return db.claimTable(ctx, "create table", newRelTable(db.cfg.Keyspace, t, relationName(t.Namespace, t.Name), newUUID()), string(def))
}

// MarkDropping does the first step of DropTable and stops, as a process
// that died right after it would.
func MarkDropping(ctx context.Context, db *DB, ns, table string) error {
	e, _, err := db.readTable(ctx, "drop table", ns, table)
	if err != nil {
		return err
	}
	_, _, err = db.catalogCAS(ctx, "drop table", `UPDATE `+db.catalog+` SET state = ? WHERE part = 0 AND namespace = ? AND name = ? IF relation = ?`,
		stateDropping, ns, table, e.relation)
	return err
}

// Relations lists the CQL tables of db's keyspace.
func Relations(ctx context.Context, db *DB) ([]string, error) {
	iter := db.session.Query(`SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?`, db.cfg.Keyspace).IterContext(ctx)
	var out []string
	var name string
	for iter.Scan(&name) {
		out = append(out, name)
	}
	return out, iter.Close()
}
