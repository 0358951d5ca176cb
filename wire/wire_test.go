package wire

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kiroku-db/kiroku/ledger"
)

// TestEveryKindHasACode: each ledger error kind maps to a gRPC code of its
// own meaning, so a kind added to the ledger without a mapping here fails
// instead of reaching clients as Internal.
func TestEveryKindHasACode(t *testing.T) {
	for _, k := range ledger.Kinds() {
		if c := Code(k); c == codes.Internal || c == codes.OK || c == codes.Unknown {
			t.Errorf("kind %s maps to %v", k, c)
		}
	}
}
