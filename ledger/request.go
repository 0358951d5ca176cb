package ledger

import (
	"fmt"
)

// Request asks the ledger to execute a contract: seed 000's ⟨n, f, a, s⟩
// plus the identity that signed it.
type Request struct {
	// Nonce identifies the transaction; a nonce is accepted once. A UUID is
	// the usual choice; any 1–128 printable ASCII bytes without spaces do.
	Nonce      string
	ContractID string
	// Argument is the contract's JSON argument, byte for byte as signed.
	Argument   []byte
	Entity     string
	KeyVersion uint32
	Signature  []byte
}

// maxSignatureLen bounds a signature: ECDSA P-256 DER is at most 72 bytes,
// HMAC-SHA256 32.
const maxSignatureLen = 512

// SigningBytes returns the bytes the client signs (FORMAT.md).
func (r *Request) SigningBytes() []byte {
	return encoding(r, len(r.Nonce)+len(r.ContractID)+len(r.Argument)+len(r.Entity)+64)
}

func (r *Request) encode(e *enc) {
	e.str(tagRequest)
	e.str(r.Nonce)
	e.str(r.ContractID)
	e.bytes(r.Argument)
	e.str(r.Entity)
	e.u32(r.KeyVersion)
}

// check validates the fields that need no lookup.
func (r *Request) check(l Limits) error {
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

// ContractRegistration registers Starlark source under an id, signed by a
// registered identity.
type ContractRegistration struct {
	ID         string
	Source     []byte
	Entity     string
	KeyVersion uint32
	Signature  []byte
}

// SigningBytes returns the bytes the client signs (FORMAT.md).
func (c *ContractRegistration) SigningBytes() []byte {
	return encoding(c, len(c.ID)+len(c.Source)+len(c.Entity)+48)
}

func (c *ContractRegistration) encode(e *enc) {
	e.str(tagContract)
	e.str(c.ID)
	e.bytes(c.Source)
	e.str(c.Entity)
	e.u32(c.KeyVersion)
}
