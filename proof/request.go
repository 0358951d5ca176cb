package proof

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

// SigningBytes returns the bytes the client signs (ledger/FORMAT.md).
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

// ContractRegistration registers Starlark source under an id, signed by a
// registered identity.
type ContractRegistration struct {
	ID         string
	Source     []byte
	Entity     string
	KeyVersion uint32
	Signature  []byte
}

// SigningBytes returns the bytes the client signs (ledger/FORMAT.md).
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
