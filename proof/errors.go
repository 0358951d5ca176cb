package proof

import (
	"errors"

	"github.com/kiroku-db/kiroku/auth"
)

// Sentinel errors. Every error the ledger returns for a bad request, a
// failed contract or a missing object wraps exactly one of these, so callers
// test with errors.Is and the server maps each to one gRPC status code and a
// stable kind name (see Kind). The limits named are the ledger's (Limits in
// package ledger).
var (
	// Requests.
	ErrBadRequest    = errors.New("malformed request")          // a field is missing, too long or has forbidden characters
	ErrBadArgument   = errors.New("argument is not valid JSON") // the contract argument does not parse
	ErrTooLarge      = errors.New("over the size limit")        // an argument, value, result or source is too big
	ErrUnknownEntity = errors.New("unknown entity")             // no identity is registered under (entity, key version)
	ErrBadSignature  = auth.ErrBadSignature                     // the request's signature does not verify
	ErrNonceReused   = errors.New("nonce already used")         // a transaction with this nonce was already recorded

	// Contracts.
	ErrUnknownContract = errors.New("unknown contract")
	ErrContractExists  = errors.New("contract already registered")
	ErrBadContract     = errors.New("contract does not compile") // syntax error, or no invoke(ledger, args)
	ErrContractFailed  = errors.New("contract failed")           // fail(msg), or a runtime error in the contract
	ErrStepLimit       = errors.New("contract exceeded its step limit")
	ErrMemoryLimit     = errors.New("contract exceeded its memory limit") // Limits.MaxMemoryBytes
	ErrTimeLimit       = errors.New("contract exceeded its time limit")   // Limits.MaxExecutionTime
	ErrCallDepth       = errors.New("nested contract calls too deep")
	ErrBadValue        = errors.New("value is not JSON-able") // a contract returned or put something JSON cannot hold

	// Registry and reads.
	ErrIdentityExists       = errors.New("identity already registered")
	ErrRegistrationDisabled = errors.New("identity registration is disabled")
	ErrNotFound             = errors.New("not found") // asset version, proof or transaction

	// The server. ErrOverloaded is no fault of the request: no abort is
	// recorded, so the same request (nonce) can be sent again.
	ErrOverloaded = errors.New("too many contracts running; try again") // no room under Limits.MaxConcurrentExecutions or MaxTotalMemoryBytes in time

	// A ledger with an Auditor runs a request only with the Auditor's
	// valid, unexpired order token for exactly that request.
	ErrOrderToken = errors.New("no valid order token from the auditor")
	// Only the Auditor a ledger runs with may have it abort a nonce
	// (AbortRequest): a ledger without an Auditor, an abort not signed
	// with its key or past its deadline is refused with this.
	ErrNotAuditor = errors.New("not signed by the ledger's auditor")

	// The Auditor's. ErrByzantineFault is the cause of every
	// *ByzantineFault: the ledger's reply disagrees with the Auditor's own
	// run. ErrNotOrdered is a validation of a request the Auditor has no
	// order for (never ordered, or settled and not validated).
	ErrByzantineFault = errors.New("auditor: Byzantine fault")
	ErrNotOrdered     = errors.New("auditor: the request was not ordered, or is settled")
)

// kinds names every sentinel for the wire. The names are part of the API:
// the SDK turns them back into the same sentinels.
var kinds = []struct {
	name string
	err  error
}{
	{"bad_request", ErrBadRequest},
	{"bad_argument", ErrBadArgument},
	{"too_large", ErrTooLarge},
	{"unknown_entity", ErrUnknownEntity},
	{"bad_signature", ErrBadSignature},
	{"nonce_reused", ErrNonceReused},
	{"unknown_contract", ErrUnknownContract},
	{"contract_exists", ErrContractExists},
	{"bad_contract", ErrBadContract},
	{"contract_failed", ErrContractFailed},
	{"step_limit", ErrStepLimit},
	{"memory_limit", ErrMemoryLimit},
	{"time_limit", ErrTimeLimit},
	{"call_depth", ErrCallDepth},
	{"bad_value", ErrBadValue},
	{"identity_exists", ErrIdentityExists},
	{"registration_disabled", ErrRegistrationDisabled},
	{"not_found", ErrNotFound},
	{"overloaded", ErrOverloaded},
	{"order_token", ErrOrderToken},
	{"not_auditor", ErrNotAuditor},
	{"byzantine_fault", ErrByzantineFault},
	{"not_ordered", ErrNotOrdered},
}

// Kind returns the wire name of the sentinel err wraps, or "" if none.
func Kind(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return ""
}

// Kinds returns every wire kind name.
func Kinds() []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.name
	}
	return out
}

// KindError returns the sentinel named by a wire kind, or nil.
func KindError(name string) error {
	for _, k := range kinds {
		if k.name == name {
			return k.err
		}
	}
	return nil
}
