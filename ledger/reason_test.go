package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kiroku-db/kiroku/storage"
)

// TestAbortReasonIsText: a contract's failure message is the contract's to
// write — a NUL, a long run of multi-byte characters cut at the limit, a
// NUL from its argument — and its abort must still be recorded, as valid
// text, on every backend; it was an untyped storage error, with the
// transaction's state unknown.
func TestAbortReasonIsText(t *testing.T) {
	backends(t, func(t *testing.T, b storage.Backend) {
		f := newFixture(t, b)
		ctx := context.Background()
		for i, c := range []struct{ src, arg string }{
			{"def invoke(ledger, args):\n    fail('a\\x00b')\n", `{}`},
			{"def invoke(ledger, args):\n    fail('a' + 'é' * 600)\n", `{}`},
			{"def invoke(ledger, args):\n    fail(args)\n", `"\u0000"`},
		} {
			id := "fails" + string(rune('a'+i))
			if err := f.register(f.hmac, id, c.src); err != nil {
				t.Fatal(err)
			}
			req := f.request(f.hmac, id, c.arg)
			if _, err := f.l.Execute(ctx, req); !errors.Is(err, ErrContractFailed) {
				t.Fatalf("%s: %v, want ErrContractFailed", id, err)
			}
			st, err := f.l.TxState(ctx, req.Nonce)
			if err != nil || st.Status != TxAborted || st.Kind != Kind(ErrContractFailed) {
				t.Fatalf("%s: state %+v (%v), want aborted", id, st, err)
			}
			if !utf8.ValidString(st.Reason) || strings.ContainsRune(st.Reason, 0) || len(st.Reason) > maxReason+len("…") {
				t.Fatalf("%s: recorded reason %q is not storable text", id, st.Reason)
			}
		}
	})
}
