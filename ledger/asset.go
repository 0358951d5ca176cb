package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"

	"github.com/kiroku-db/kiroku/auth"
)

// Version is one version of an asset, as stored and hash-chained. The
// encoding its Hash covers is in FORMAT.md.
type Version struct {
	ID  string
	Age int64 // 0 for the first version
	// Input is the transaction's read set: asset id → the latest age its
	// contracts observed through get or scan, or -1 where get found no
	// asset. Writes are not inputs: a version's place in its chain already
	// says what it follows. A get of an asset the transaction wrote before
	// returns that write and is not an input either.
	Input    map[string]int64
	Output   []byte // the value, canonical JSON
	Contract string // the request's (top-level) contract id
	Argument []byte // the request's argument, byte for byte as signed
	Nonce    string
	// Entity and KeyVersion name the identity that signed the request.
	Entity     string
	KeyVersion uint32
	Signature  []byte // the client's signature of the request
	PrevHash   []byte // Hash of version Age-1; empty for age 0
	Hash       []byte // SHA-256 of the encoding of every field above
	// ProofSignature is the ledger's signature of the version's proof, made
	// when the version was written.
	ProofSignature []byte
}

// Proof is the ledger's signed statement about one written version
// ⟨id, age, nonce, input, hash, prev_hash⟩ (seed 000's ⟨k, v, n, d, s⟩).
type Proof struct {
	ID        string
	Age       int64
	Nonce     string
	Input     map[string]int64
	Hash      []byte
	PrevHash  []byte
	Signature []byte // the ledger's signature of ProofBytes
}

// Proof returns the version's proof.
func (v *Version) Proof() Proof {
	return Proof{ID: v.ID, Age: v.Age, Nonce: v.Nonce, Input: v.Input, Hash: v.Hash, PrevHash: v.PrevHash, Signature: v.ProofSignature}
}

// Domain tags keep the byte strings the ledger hashes or signs apart, so a
// signature over one kind can never be passed off as another.
const (
	tagVersion  = "kiroku/asset-version/v1"
	tagProof    = "kiroku/proof/v1"
	tagRequest  = "kiroku/request/v1"
	tagContract = "kiroku/contract/v1"
	tagReceipt  = "kiroku/receipt/v1"
)

// enc builds the length-prefixed encodings of FORMAT.md.
type enc struct{ b []byte }

// Signed is what has a FORMAT.md encoding that is signed or hashed: a
// Request, a ContractRegistration, a Proof, a Receipt, and a Version (its
// hash covers the encoding).
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

// Verify checks sig over x's encoding with v.
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

// HashBytes returns the bytes the version's Hash covers.
func (v *Version) HashBytes() []byte {
	return encoding(v, len(v.ID)+len(v.Output)+len(v.Argument)+len(v.Contract)+len(v.Nonce)+len(v.Entity)+len(v.Signature)+64*len(v.Input)+160)
}

func (v *Version) encode(e *enc) {
	e.str(tagVersion)
	e.str(v.ID)
	e.i64(v.Age)
	e.input(v.Input)
	e.bytes(v.Output)
	e.str(v.Contract)
	e.bytes(v.Argument)
	e.str(v.Nonce)
	e.str(v.Entity)
	e.u32(v.KeyVersion)
	e.bytes(v.Signature)
	e.bytes(v.PrevHash)
}

// ComputeHash returns SHA-256 of HashBytes.
func (v *Version) ComputeHash() []byte {
	e := borrow(v)
	h := sha256.Sum256(e.b)
	e.release()
	return h[:]
}

// SigningBytes returns the bytes the ledger signs for the proof.
func (p *Proof) SigningBytes() []byte {
	return encoding(p, len(p.ID)+len(p.Nonce)+64*len(p.Input)+128)
}

func (p *Proof) encode(e *enc) {
	e.str(tagProof)
	e.str(p.ID)
	e.i64(p.Age)
	e.str(p.Nonce)
	e.input(p.Input)
	e.bytes(p.Hash)
	e.bytes(p.PrevHash)
}

// Receipt is the ledger's signed statement about one committed transaction
// as a whole: what it read, what it wrote and what it returned. Proofs speak
// for written versions only; the receipt also speaks for read-only
// transactions, so a Validator knows the read set of every transaction and
// can hold the ledger to the result it returned.
type Receipt struct {
	Nonce    string
	Contract string
	// Input is the transaction's read set, as in Version.Input.
	Input map[string]int64
	// Writes maps each asset written to the age of its new version.
	Writes    map[string]int64
	Result    []byte // the contract's result, canonical JSON
	Signature []byte // the ledger's signature of SigningBytes
}

// SigningBytes returns the bytes the ledger signs for the receipt
// (FORMAT.md).
func (r *Receipt) SigningBytes() []byte {
	return encoding(r, len(r.Nonce)+len(r.Contract)+len(r.Result)+64*(len(r.Input)+len(r.Writes))+64)
}

func (r *Receipt) encode(e *enc) {
	e.str(tagReceipt)
	e.str(r.Nonce)
	e.str(r.Contract)
	e.input(r.Input)
	e.input(r.Writes)
	e.bytes(r.Result)
}
