package proof

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/kiroku-db/kiroku/auth"
)

// Domain tags keep the byte strings the ledger hashes or signs apart, so a
// signature over one kind can never be passed off as another.
const (
	tagVersion  = "kiroku/asset-version/v1"
	tagProof    = "kiroku/proof/v1"
	tagRequest  = "kiroku/request/v1"
	tagContract = "kiroku/contract/v1"
	tagReceipt  = "kiroku/receipt/v1"
	tagOrder    = "kiroku/order-token/v1"
	tagApproval = "kiroku/approval/v1"
	tagAbort    = "kiroku/abort-nonce/v1"
)

// enc builds the length-prefixed encodings of ledger/FORMAT.md.
type enc struct{ b []byte }

// Signed is what has an encoding (ledger/FORMAT.md) that is signed or
// hashed: a Request, a ContractRegistration, a Proof, a Receipt, and a
// Version (its hash covers the encoding). Only this package's types
// implement it.
type Signed interface {
	encode(e *enc)
}

// encoding returns x's encoding in a buffer of its own, of about size
// bytes.
func encoding(x Signed, size int) []byte {
	e := &enc{b: make([]byte, 0, size)}
	x.encode(e)
	return e.b
}

// encs holds buffers for encodings that are hashed or signed and then
// dropped: neither a Signer nor a Verifier keeps the message, and a
// buffer per signature, hash and check was a tenth of what an execute
// allocated.
var encs = sync.Pool{New: func() any { return &enc{b: make([]byte, 0, 1024)} }}

func borrow(x Signed) *enc {
	e := encs.Get().(*enc)
	e.b = e.b[:0]
	x.encode(e)
	return e
}

func (e *enc) release() {
	if cap(e.b) <= 64<<10 { // a rare huge one is left to the collector
		encs.Put(e)
	}
}

// Sign signs x's encoding with s.
func Sign(s auth.Signer, x Signed) ([]byte, error) {
	e := borrow(x)
	defer e.release()
	return s.Sign(e.b)
}

// Verify checks sig over x's encoding with v. A signature that does not
// verify is an error wrapping auth.ErrBadSignature (ErrBadSignature).
func Verify(v auth.Verifier, x Signed, sig []byte) error {
	e := borrow(x)
	defer e.release()
	return v.Verify(e.b, sig)
}

func (e *enc) bytes(p []byte) {
	e.b = binary.BigEndian.AppendUint32(e.b, uint32(len(p)))
	e.b = append(e.b, p...)
}
func (e *enc) str(s string) {
	e.b = binary.BigEndian.AppendUint32(e.b, uint32(len(s)))
	e.b = append(e.b, s...)
}
func (e *enc) i64(v int64)  { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *enc) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) input(m map[string]int64) {
	e.u32(uint32(len(m)))
	var kb [8]string
	for _, k := range appendSortedKeys(kb[:0], m) {
		e.str(k)
		e.i64(m[k])
	}
}

// appendSortedKeys appends m's keys to buf in byte order. Given a buffer
// on the caller's stack, a small map costs no allocation.
func appendSortedKeys[V any](buf []string, m map[string]V) []string {
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}
