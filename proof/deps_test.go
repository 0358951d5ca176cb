package proof_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDepsStayLight: the SDK, the Validator and the Auditor import proof
// to sign and check records; it must stay the standard library and auth,
// never the ledger, its interpreter or storage.
func TestDepsStayLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kiroku-db/kiroku/proof").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(dep, "/")
		if !strings.Contains(first, ".") || strings.HasPrefix(dep, "vendor/") {
			continue // the standard library
		}
		if dep != "github.com/kiroku-db/kiroku/proof" && dep != "github.com/kiroku-db/kiroku/auth" {
			t.Errorf("proof depends on %s", dep)
		}
	}
}
