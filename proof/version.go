package proof

import "crypto/sha256"

// Version is one version of an asset, as stored and hash-chained. The
// encoding its Hash covers is in ledger/FORMAT.md.
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

// Proof returns the version's proof.
func (v *Version) Proof() Proof {
	return Proof{ID: v.ID, Age: v.Age, Nonce: v.Nonce, Input: v.Input, Hash: v.Hash, PrevHash: v.PrevHash, Signature: v.ProofSignature}
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

// Proof is the ledger's signed statement about one written version
// ⟨id, age, nonce, input, hash, prev_hash⟩ (seed 000's ⟨k, v, n, d, s⟩).
type Proof struct {
	ID        string
	Age       int64
	Nonce     string
	Input     map[string]int64
	Hash      []byte
	PrevHash  []byte
	Signature []byte // the ledger's signature of SigningBytes
}

// SigningBytes returns the bytes the ledger signs for the proof
// (ledger/FORMAT.md).
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

// ScanRange selects versions of one asset: ages in [Start, End] (End < 0
// means the latest), in ascending or descending order, at most Limit
// (0 means the ledger's cap).
type ScanRange struct {
	Start, End int64
	Ascending  bool
	Limit      int
}
