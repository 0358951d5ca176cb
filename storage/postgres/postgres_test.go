package postgres_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/postgres"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

func open(t *testing.T) storage.Backend {
	t.Helper()
	b, err := postgres.Open(context.Background(), postgres.Config{DSN: testenv.PostgresDSN(t)})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return b
}

func TestConformance(t *testing.T) {
	testenv.PostgresDSN(t)
	storagetest.Run(t, open)
}

// TestSuiteDetectsWeakIsolation runs the conformance suite's concurrency
// checks against PostgreSQL at weaker isolation levels, in a subprocess, and
// requires them to fail with the anomaly each level allows. It shows the
// checks are able to fail: at SERIALIZABLE they pass because there is
// nothing to find, not because they cannot see.
func TestSuiteDetectsWeakIsolation(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	if level := os.Getenv("KIROKU_TEST_WEAK_ISOLATION"); level != "" {
		// The subprocess: run the suite at the weak level; it should fail.
		storagetest.Run(t, func(t *testing.T) storage.Backend {
			b, err := postgres.Open(context.Background(), postgres.WithIsolation(postgres.Config{DSN: dsn}, level))
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			return b
		})
		return
	}
	for _, c := range []struct {
		level  string
		checks string   // the subtests to run
		want   []string // each subtest's failure, and the anomaly it must name
	}{
		// Snapshot isolation: write skew, phantoms, and cycles in the history.
		{"repeatable read", "WriteSkew|Phantom|History", []string{
			"--- FAIL: TestSuiteDetectsWeakIsolation/WriteSkew", "write skew: both committed",
			"--- FAIL: TestSuiteDetectsWeakIsolation/Phantom", "phantom: 3 rows in the range",
			"--- FAIL: TestSuiteDetectsWeakIsolation/History", "history: dependency cycle"}},
		// Read committed: lost updates and inconsistent reads too.
		{"read committed", "LostUpdate|Bank", []string{
			"--- FAIL: TestSuiteDetectsWeakIsolation/LostUpdate", "transactional counter = ",
			"--- FAIL: TestSuiteDetectsWeakIsolation/Bank", "want 8000"}},
	} {
		t.Run(strings.ReplaceAll(c.level, " ", "_"), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestSuiteDetectsWeakIsolation$/^("+c.checks+")$", "-test.v")
			cmd.Env = append(os.Environ(), "KIROKU_TEST_WEAK_ISOLATION="+c.level)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed at %s; it must find anomalies:\n%s", c.level, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("at %s, expected %q in:\n%s", c.level, w, out)
				}
			}
		})
	}
}

// TestSchemaReplacedByAnotherProcess: one process caches a table's schema,
// another drops the table and creates it again with other types. The first
// must notice, reload the schema and judge its request by the new one.
func TestSchemaReplacedByAnotherProcess(t *testing.T) {
	ctx := context.Background()
	a, b := open(t), open(t)
	defer a.Close()
	defer b.Close()
	const ns = "replaced"
	_ = a.DropTable(ctx, ns, "t")
	_ = a.DropNamespace(ctx, ns)
	if err := a.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.DropTable(ctx, ns, "t"); _ = b.DropNamespace(ctx, ns) }()
	mk := func(db storage.Backend, typ storage.DataType) {
		t.Helper()
		if err := db.CreateTable(ctx, &storage.Table{Namespace: ns, Name: "t",
			PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
			Columns:      []storage.Column{{Name: "v", Type: typ}}}); err != nil {
			t.Fatal(err)
		}
	}
	put := func(db storage.Backend, v storage.Value) error {
		return db.Put(ctx, &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(1)}, Values: storage.Values{"v": v}})
	}
	mk(a, storage.TypeBigInt)
	if err := put(a, storage.BigInt(1)); err != nil { // a caches v BIGINT
		t.Fatal(err)
	}
	if err := b.DropTable(ctx, ns, "t"); err != nil {
		t.Fatal(err)
	}
	mk(b, storage.TypeText)
	if err := put(a, storage.BigInt(2)); !errors.Is(err, storage.ErrTypeMismatch) {
		t.Fatalf("put by the stale schema: %v, want ErrTypeMismatch under the new schema", err)
	}
	if err := put(a, storage.Text("two")); err != nil {
		t.Fatalf("put under the new schema: %v", err)
	}
	row, ok, err := b.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(1)}})
	if err != nil || !ok || row["v"].AsText() != "two" {
		t.Fatalf("read back: %v %v %v", row, ok, err)
	}

	// The same in a transaction whose only statement is a write queued for
	// COMMIT, of a shape no connection has prepared: the prepare fails on
	// the dropped relation, nothing runs, and the retry must reload the
	// schema rather than fail the same way until its attempts run out.
	if err := b.DropTable(ctx, ns, "t"); err != nil {
		t.Fatal(err)
	}
	mk(b, storage.TypeBigInt)
	err = storage.Update(ctx, a, func(tx storage.Txn) error {
		return tx.Put(ctx, &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(2)}})
	})
	if err != nil {
		t.Fatalf("transaction after the table was replaced: %v", err)
	}
	if _, ok, err := b.Get(ctx, &storage.Get{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(2)}}); err != nil || !ok {
		t.Fatalf("read back the transaction's put: %v %v", ok, err)
	}
}
