package ledger

import (
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/proof"
)

// The records the ledger and its clients exchange, their encodings
// (FORMAT.md) and their signatures are package proof's, which the SDK and
// the Validator import without the ledger. The ledger names them too.
type (
	// Version is one version of an asset, as stored and hash-chained.
	Version = proof.Version
	// Proof is the ledger's signed statement about one written version.
	Proof = proof.Proof
	// Receipt is the ledger's signed statement about one committed
	// transaction.
	Receipt = proof.Receipt
	// Signed is what has an encoding that is signed or hashed.
	Signed = proof.Signed
)

// Sign signs x's encoding with s (proof.Sign).
func Sign(s auth.Signer, x Signed) ([]byte, error) { return proof.Sign(s, x) }

// Verify checks sig over x's encoding with v (proof.Verify).
func Verify(v auth.Verifier, x Signed, sig []byte) error { return proof.Verify(v, x, sig) }
