package proof

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
// (ledger/FORMAT.md).
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

// Result is what an execution returns: the transaction's signed receipt
// (with the contract's result) and one proof per asset version written, in
// id order.
type Result struct {
	Receipt
	Proofs []Proof
}

// TxStatus is the outcome recorded for a nonce.
type TxStatus string

const (
	TxCommitted TxStatus = "committed"
	TxAborted   TxStatus = "aborted"
	TxUnknown   TxStatus = "unknown" // nothing recorded (never seen, rejected before execution, or still running)
)

// TxState is what the ledger recorded for a nonce.
type TxState struct {
	Nonce    string
	Status   TxStatus
	Kind     string           // the error kind (Kind) it aborted with
	Reason   string           // why it aborted
	Contract string           // the contract the request named
	Result   []byte           // the contract's result, if committed
	Writes   map[string]int64 // asset id → age written, if committed
	Input    map[string]int64 // the read set, if committed
	// Signature is the ledger's receipt signature, if committed.
	Signature []byte
}

// Receipt returns the signed receipt of a committed transaction.
func (st *TxState) Receipt() Receipt {
	return Receipt{Nonce: st.Nonce, Contract: st.Contract, Input: st.Input, Writes: st.Writes, Result: st.Result, Signature: st.Signature}
}
