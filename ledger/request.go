package ledger

import (
	"fmt"

	"github.com/kiroku-db/kiroku/proof"
)

type (
	// Request asks the ledger to execute a contract (proof.Request).
	Request = proof.Request
	// ContractRegistration registers Starlark source under an id, signed
	// by a registered identity (proof.ContractRegistration).
	ContractRegistration = proof.ContractRegistration
)

// maxSignatureLen bounds a signature: ECDSA P-256 DER is at most 72 bytes,
// HMAC-SHA256 32.
const maxSignatureLen = 512

// checkRequest validates the fields of r that need no lookup.
func checkRequest(r *Request, l Limits) error {
	if err := checkID("nonce", r.Nonce); err != nil {
		return err
	}
	if err := checkID("contract id", r.ContractID); err != nil {
		return err
	}
	if err := checkIdentity(r.Entity, r.KeyVersion); err != nil {
		return err
	}
	if len(r.Argument) > l.MaxArgumentBytes {
		return fmt.Errorf("%w: argument is %d bytes, limit %d", ErrTooLarge, len(r.Argument), l.MaxArgumentBytes)
	}
	return checkSignatureLen(r.Signature)
}

func checkIdentity(entity string, keyVersion uint32) error {
	if err := checkID("entity id", entity); err != nil {
		return err
	}
	if keyVersion == 0 {
		return fmt.Errorf("%w: key version must be at least 1", ErrBadRequest)
	}
	return nil
}

func checkSignatureLen(sig []byte) error {
	if len(sig) == 0 || len(sig) > maxSignatureLen {
		return fmt.Errorf("%w: signature is %d bytes; want 1–%d", ErrBadRequest, len(sig), maxSignatureLen)
	}
	return nil
}
