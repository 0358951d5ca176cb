package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/storage/coordinator"
	"github.com/kiroku-db/kiroku/storage/postgres"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

// storeOnly hides a backend's own transactions: the coordinator's are
// tested over the store alone.
type storeOnly struct{ storage.Store }

// TestConformanceOverEngine runs the whole conformance suite on the
// coordinator's transactions over the embedded engine's single
// operations.
func TestConformanceOverEngine(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.Backend {
		dir := engineDir(t)
		db, err := engine.Open(engine.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		c, err := coordinator.Open(context.Background(), storeOnly{db}, coordinator.Config{})
		if err != nil {
			db.Close()
			t.Fatal(err)
		}
		return c
	})
}

// engineDir is one directory per test, shared by its reopenings.
var dirs = map[string]string{}

func engineDir(t *testing.T) string {
	if d, ok := dirs[t.Name()]; ok {
		return d
	}
	d := t.TempDir()
	dirs[t.Name()] = d
	return d
}

// TestConformanceOverPostgres runs the suite on the coordinator's
// transactions over PostgreSQL's single operations (each its own
// statement), not PostgreSQL's transactions.
func TestConformanceOverPostgres(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	storagetest.Run(t, func(t *testing.T) storage.Backend {
		pg, err := postgres.Open(context.Background(), postgres.Config{DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		c, err := coordinator.Open(context.Background(), storeOnly{pg}, coordinator.Config{Namespace: "coordtest"})
		if err != nil {
			pg.Close()
			t.Fatal(err)
		}
		return c
	})
}

// TestConformanceOverCassandra runs the whole suite on the coordinator's
// transactions over Cassandra, which has none of its own.
func TestConformanceOverCassandra(t *testing.T) {
	contacts := strings.Split(testenv.CassandraContacts(t), ",")
	storagetest.Run(t, func(t *testing.T) storage.Backend {
		cs, err := cassandra.Open(context.Background(), cassandra.Config{Contacts: contacts})
		if err != nil {
			t.Fatal(err)
		}
		c, err := coordinator.Open(context.Background(), cs, coordinator.Config{})
		if err != nil {
			cs.Close()
			t.Fatal(err)
		}
		return c
	})
}
