// Package testenv tells tests where the services they need are.
//
// Tests that need an external service (PostgreSQL, Cassandra)
// read its address from an environment variable. Under a plain `go test`
// without it they skip with a message saying how to run them; the project's
// test command (scripts/test.sh) starts the services and sets
// KIROKU_REQUIRE_SERVICES=1, which turns a missing service into a failure.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// PostgresDSN returns the DSN of the test PostgreSQL server, skipping (or,
// when services are required, failing) the test if there is none.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return need(t, "KIROKU_PG_DSN", "PostgreSQL")
}

// CassandraContacts returns the test Cassandra's contact points
// (host:port,...), skipping (or, when services are required, failing) the
// test if there are none.
func CassandraContacts(t testing.TB) string {
	t.Helper()
	return need(t, "KIROKU_CASSANDRA_CONTACTS", "Cassandra")
}

// CassandraCluster returns the contact points (host:port,...) and the
// scripts/cassandra.sh state file of the test Cassandra cluster of three
// nodes, which tests of node failures stop and start (CassandraScript),
// skipping (or, when services are required, failing) the test if there is
// none. Such a test must leave every node running when it ends.
func CassandraCluster(t testing.TB) (contacts, state string) {
	t.Helper()
	contacts = need(t, "KIROKU_CASSANDRA_CLUSTER_CONTACTS", "three-node Cassandra")
	return contacts, need(t, "KIROKU_CASSANDRA_CLUSTER_STATE", "three-node Cassandra")
}

// CassandraScript runs scripts/cassandra.sh with args (e.g. "stop-node",
// "2") on the cluster whose state file is state, and returns its error
// with what the script printed.
func CassandraScript(state string, args ...string) error {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return errors.New("testenv: cannot locate the repository")
	}
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "cassandra.sh")
	cmd := exec.Command(script, args...)
	cmd.Env = append(os.Environ(), "KIROKU_CASSANDRA_STATE="+state)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/cassandra.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func need(t testing.TB, env, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v != "" {
		return v
	}
	msg := what + " tests need " + env + "; run scripts/test.sh, which starts a throwaway " + what + " and sets it"
	if os.Getenv("KIROKU_REQUIRE_SERVICES") != "" {
		t.Fatal(msg + " (KIROKU_REQUIRE_SERVICES is set, so a missing service is a failure)")
	}
	t.Skip(msg)
	return ""
}

// Count returns the positive count set in env, or def (short under
// -short) when env is unset. A value that is not a positive count fails
// the test: a typo must not run zero seeds and pass.
func Count(t testing.TB, env string, def, short int) int {
	t.Helper()
	if s := os.Getenv(env); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive count", env, s)
		}
		return n
	}
	if testing.Short() {
		return short
	}
	return def
}
