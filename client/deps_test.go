package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSDKStaysSmall: an application that links the SDK must not pull in
// the server or the storage backends behind it.
func TestSDKStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kiroku-db/kiroku/client").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/kiroku-db/kiroku/server", "github.com/kiroku-db/kiroku/engine",
			"github.com/kiroku-db/kiroku/wal", "github.com/kiroku-db/kiroku/storage/", "github.com/jackc/pgx",
			"github.com/cockroachdb/pebble"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") || strings.HasSuffix(banned, "/") && strings.HasPrefix(dep, banned) {
				t.Errorf("the client SDK depends on %s", dep)
			}
		}
	}
}
