package proof

import (
	"crypto/sha256"
	"fmt"
)

// OrderToken is an Auditor's signed word that it ordered one request: the
// ledger of a deployment with an Auditor runs a request only with a valid
// token for it, before Deadline. Digest binds the token to the request's
// every signed field, not only its nonce.
type OrderToken struct {
	Nonce     string
	Digest    []byte // RequestDigest of the request
	Deadline  int64  // Unix milliseconds: the ledger refuses the token after it
	Signature []byte // the Auditor's signature of SigningBytes
}

// RequestDigest is the SHA-256 of r's signing bytes and signature: what
// an OrderToken names.
func RequestDigest(r *Request) []byte {
	h := sha256.New()
	e := borrow(r)
	h.Write(e.b)
	e.release()
	h.Write(r.Signature)
	return h.Sum(nil)
}

// SigningBytes returns the bytes the Auditor signs for the token.
func (t *OrderToken) SigningBytes() []byte { return encoding(t, len(t.Nonce)+len(t.Digest)+64) }

func (t *OrderToken) encode(e *enc) {
	e.str(tagOrder)
	e.str(t.Nonce)
	e.bytes(t.Digest)
	e.i64(t.Deadline)
}

// Approval is an Auditor's countersignature of a ledger's receipt: it
// re-ran the transaction in the order it gave and found the same result,
// reads and versions. A client in Auditor mode accepts a result only with
// both the receipt's and the approval's signatures.
type Approval struct {
	Nonce     string
	Digest    []byte // ReceiptDigest of the receipt approved
	Signature []byte // the Auditor's signature of SigningBytes
}

// ReceiptDigest is the SHA-256 of r's signing bytes and the ledger's
// signature of them.
func ReceiptDigest(r *Receipt) []byte {
	h := sha256.New()
	e := borrow(r)
	h.Write(e.b)
	e.release()
	h.Write(r.Signature)
	return h.Sum(nil)
}

// SigningBytes returns the bytes the Auditor signs for the approval.
func (a *Approval) SigningBytes() []byte { return encoding(a, len(a.Nonce)+len(a.Digest)+32) }

func (a *Approval) encode(e *enc) {
	e.str(tagApproval)
	e.str(a.Nonce)
	e.bytes(a.Digest)
}

// AbortRequest is an Auditor's signed instruction to the ledger to record
// a nonce as aborted unless it has a state: how the Auditor settles a
// request it ordered whose client never came back, so that the request
// can no longer run. The ledger takes it only with a signature of the
// Auditor it runs with, before Deadline.
type AbortRequest struct {
	Nonce     string
	Reason    string // recorded as the abort's reason
	Deadline  int64  // Unix milliseconds: the ledger refuses it after
	Signature []byte // the Auditor's signature of SigningBytes
}

// SigningBytes returns the bytes the Auditor signs for the abort.
func (a *AbortRequest) SigningBytes() []byte {
	return encoding(a, len(a.Nonce)+len(a.Reason)+48)
}

func (a *AbortRequest) encode(e *enc) {
	e.str(tagAbort)
	e.str(a.Nonce)
	e.str(a.Reason)
	e.i64(a.Deadline)
}

// ByzantineFault is a disagreement between the ledger and the Auditor
// about one transaction: which asset and version, and which check failed.
// The Auditor returns it from Validation; the SDK rebuilds it from the
// wire (kind byzantine_fault), so errors.As finds it on either side.
type ByzantineFault struct {
	Nonce  string
	Asset  string // "" for a check on the whole transaction
	Age    int64
	Check  string // "receipt", "result", "input", "writes", "version", "hash"
	Detail string
}

func (f *ByzantineFault) Error() string {
	at := ""
	if f.Asset != "" {
		at = fmt.Sprintf(" on %s@%d", f.Asset, f.Age)
	}
	return fmt.Sprintf("auditor: Byzantine fault in %s%s: %s check: %s", f.Nonce, at, f.Check, f.Detail)
}

// Unwrap returns ErrByzantineFault.
func (f *ByzantineFault) Unwrap() error { return ErrByzantineFault }
