package client_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestSDKStaysSmall: an application that links the SDK must not pull in
// the server, the ledger (its contract interpreter, Starlark) or the
// storage layer and the backends behind it. The records it signs and
// checks are package proof's.
func TestSDKStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kiroku-db/kiroku/client").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	banned := []string{"github.com/kiroku-db/kiroku/server", "github.com/kiroku-db/kiroku/ledger",
		"github.com/kiroku-db/kiroku/storage", "github.com/kiroku-db/kiroku/engine", "github.com/kiroku-db/kiroku/wal",
		"go.starlark.net", "github.com/jackc/pgx", "github.com/cockroachdb/pebble"}
	for _, dep := range deps {
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") {
				t.Errorf("the client SDK depends on %s", dep)
			}
		}
	}
	if !slices.Contains(deps, "github.com/kiroku-db/kiroku/proof") {
		t.Errorf("the client SDK does not use package proof: %v", deps)
	}
}
