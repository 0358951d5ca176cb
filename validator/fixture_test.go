package validator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
	"github.com/kiroku-db/kiroku/storage/postgres"
)

const adminToken = "0123456789abcdef0123"

// startLedger starts a real kiroku server on the embedded engine.
func startLedger(t *testing.T) *server.Running {
	t.Helper()
	return startLedgerAt(t, t.TempDir())
}

// startLedgerAt starts a real kiroku server on the embedded engine with its
// data (and proof key) in dir.
func startLedgerAt(t *testing.T, dir string) *server.Running {
	t.Helper()
	o := server.Options{DataDir: dir, Listen: "127.0.0.1:0", AdminToken: adminToken,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o.Engine.EpochInterval = 5 * time.Millisecond
	r, err := server.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(time.Second) })
	return r
}

// dialLedger returns a client of addr with a registered HMAC identity.
func dialLedger(t *testing.T, addr, entity string) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Config{Server: addr, Entity: entity, Secret: bytes.Repeat([]byte(entity[:1]), 32), AdminToken: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.RegisterSecret(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// openEngineDB opens a Validator database on its own embedded engine.
func openEngineDB(t testing.TB) storage.Backend {
	t.Helper()
	db, err := engine.Open(engine.Config{Dir: t.TempDir(), EpochInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openPostgresDB opens a Validator database on PostgreSQL; the caller
// gives each test a namespace of its own, so tests do not see each
// other's logs.
func openPostgresDB(t *testing.T) storage.Backend {
	t.Helper()
	b, err := postgres.Open(context.Background(), postgres.Config{DSN: testenv.PostgresDSN(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// openCassandraDB opens a Validator database on Cassandra, with the
// transactions of storage/coordinator.
func openCassandraDB(t *testing.T) storage.Backend {
	t.Helper()
	b, err := backends.Open(context.Background(), "cassandra", backends.Config{Contacts: testenv.CassandraContacts(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// eachDB runs fn on an engine Validator database and, each in a
// namespace of its own, on PostgreSQL and on Cassandra.
func eachDB(t *testing.T, fn func(t *testing.T, db storage.Backend, ns string)) {
	own := func(t *testing.T) string {
		return fmt.Sprintf("%s_%d", strings.ToLower(strings.Map(nameRune, t.Name()[:min(len(t.Name()), 24)])), rand.Uint64())
	}
	t.Run("engine", func(t *testing.T) { fn(t, openEngineDB(t), DefaultNamespace) })
	t.Run("postgres", func(t *testing.T) { fn(t, openPostgresDB(t), own(t)) })
	t.Run("cassandra", func(t *testing.T) { fn(t, openCassandraDB(t), own(t)) })
}

// nameRune keeps what a namespace name may hold and maps the rest to _.
func nameRune(r rune) rune {
	if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
		return r
	}
	return '_'
}

func openValidator(t *testing.T, db storage.Backend, ns string, c *client.Client, clock ClockConfig) *Validator {
	t.Helper()
	v, err := Open(context.Background(), Config{DB: db, Namespace: ns, Client: c, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func validate(t *testing.T, v *Validator, s Scope) *Report {
	t.Helper()
	rep, err := v.Validate(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
