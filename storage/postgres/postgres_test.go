package postgres_test

import (
	"context"
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
		want   []string // what the failures must say
	}{
		// Snapshot isolation: write skew, phantoms, and cycles in the history.
		{"repeatable read", "WriteSkew|Phantom|History", []string{"--- FAIL: TestSuiteDetectsWeakIsolation/WriteSkew",
			"--- FAIL: TestSuiteDetectsWeakIsolation/Phantom", "--- FAIL: TestSuiteDetectsWeakIsolation/History"}},
		// Read committed: lost updates too.
		{"read committed", "LostUpdate|Bank", []string{"--- FAIL: TestSuiteDetectsWeakIsolation/LostUpdate",
			"--- FAIL: TestSuiteDetectsWeakIsolation/Bank"}},
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
