package ledger

import "github.com/kiroku-db/kiroku/proof"

// Sentinel errors, package proof's: every error the ledger returns for a
// bad request, a failed contract or a missing object wraps exactly one of
// these, so callers test with errors.Is (against these or proof's, the
// same values) and the server maps each to one gRPC status code and a
// stable kind name (see Kind).
var (
	// Requests.
	ErrBadRequest    = proof.ErrBadRequest
	ErrBadArgument   = proof.ErrBadArgument
	ErrTooLarge      = proof.ErrTooLarge
	ErrUnknownEntity = proof.ErrUnknownEntity
	ErrBadSignature  = proof.ErrBadSignature
	ErrNonceReused   = proof.ErrNonceReused

	// Contracts.
	ErrUnknownContract = proof.ErrUnknownContract
	ErrContractExists  = proof.ErrContractExists
	ErrBadContract     = proof.ErrBadContract
	ErrContractFailed  = proof.ErrContractFailed
	ErrStepLimit       = proof.ErrStepLimit
	ErrMemoryLimit     = proof.ErrMemoryLimit
	ErrTimeLimit       = proof.ErrTimeLimit
	ErrCallDepth       = proof.ErrCallDepth
	ErrBadValue        = proof.ErrBadValue

	// Registry and reads.
	ErrIdentityExists       = proof.ErrIdentityExists
	ErrRegistrationDisabled = proof.ErrRegistrationDisabled
	ErrNotFound             = proof.ErrNotFound

	// The server.
	ErrOverloaded = proof.ErrOverloaded

	// A ledger with an Auditor (Config.Auditor).
	ErrOrderToken = proof.ErrOrderToken
	ErrNotAuditor = proof.ErrNotAuditor
)

// Kind returns the wire name of the sentinel err wraps, or "" if none
// (proof.Kind).
func Kind(err error) string { return proof.Kind(err) }

// Kinds returns every wire kind name (proof.Kinds).
func Kinds() []string { return proof.Kinds() }

// KindError returns the sentinel named by a wire kind, or nil
// (proof.KindError).
func KindError(name string) error { return proof.KindError(name) }
