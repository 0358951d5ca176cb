package validator

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Status is where a logged transaction stands.
type Status string

const (
	// StatusInDoubt: the request was logged and no outcome is known yet.
	StatusInDoubt Status = "in-doubt"
	// StatusCommitted: the ledger committed it; the receipt and proofs
	// are logged.
	StatusCommitted Status = "committed"
	// StatusAborted: the ledger refused or aborted it, or recovery found
	// it unknown to the ledger after the transaction timeout.
	StatusAborted Status = "aborted"
)

// Tx is one logged transaction.
type Tx struct {
	Request  proof.Request
	Begin    int64 // begin clock
	LoggedAt int64 // wall time the request was logged, Unix microseconds
	End      int64 // end clock; 0 while in doubt
	Status   Status
	Reason   string // why it aborted
	// The receipt and proofs of a committed transaction.
	Receipt   proof.Receipt
	Proofs    []proof.Proof
	Validated bool
}

// firstKey names the version a transaction-wide violation is filed
// under: its first write in id order, or else its first read.
func (t *Tx) firstKey() (string, int64) {
	for _, m := range []map[string]int64{t.Receipt.Writes, t.Receipt.Input} {
		if len(m) > 0 {
			k := slices.Min(slices.Collect(maps.Keys(m)))
			return k, m[k]
		}
	}
	return "", 0
}

// unresolved reports whether the transaction has no end clock yet.
func (t *Tx) unresolved() bool { return t.End == 0 }

// proofJSON is the stored form of a proof; the input set is the
// receipt's, stored once.
type proofJSON struct {
	ID        string           `json:"id"`
	Age       int64            `json:"age"`
	Nonce     string           `json:"nonce"`
	Input     map[string]int64 `json:"input"`
	Hash      []byte           `json:"hash"`
	PrevHash  []byte           `json:"prev_hash"`
	Signature []byte           `json:"sig"`
}

// encMap encodes an id → age map; nil encodes as null, which decodes back.
func encMap(m map[string]int64) storage.Value {
	return storage.Text(jsonText(0, func(b []byte) []byte { return appendIDAges(b, m) })) // it sizes the buffer
}

// logRequests are the requests that log one transaction, refilled for
// each: a backend keeps no reference to a request once the call returns
// (package storage), and a map per request was a third of what logging
// allocated. The Validator keeps spent ones for reuse (Validator.logs).
type logRequests struct {
	request, pending, outcome storage.Put
}

// Conditions are only read by backends, so one of each serves every call.
var (
	notLogged  = storage.IfNotExists()
	notStamped = storage.If(storage.IsNull("end_clock"))
)

func newLogRequests(ns string) *logRequests {
	nonce := func() storage.Values { return make(storage.Values, 1) }
	return &logRequests{
		request: storage.Put{Namespace: ns, Table: tTxs, Partition: nonce(), Values: make(storage.Values, 9), Condition: notLogged, Deferred: true},
		pending: storage.Put{Namespace: ns, Table: tPending, Partition: make(storage.Values, 1), Clustering: make(storage.Values, 2)},
		outcome: storage.Put{Namespace: ns, Table: tTxs, Partition: nonce(), Values: make(storage.Values, 8), Condition: notStamped, Deferred: true},
	}
}

// requestPut logs t's request, on condition that its nonce is not logged
// yet; pendingPut lists it as pending, under its begin clock. The condition
// is deferred: a backend that queues writes (PostgreSQL) then sends both
// rows and the commit in one round trip instead of two, and a nonce
// already logged fails the commit, so neither row is written.
func (lr *logRequests) requestPut(t *Tx) *storage.Put {
	p, r := &lr.request, &t.Request
	p.Partition["nonce"] = storage.Text(r.Nonce)
	vs := p.Values
	vs["contract"], vs["argument"] = storage.Text(r.ContractID), storage.BlobString(view(r.Argument))
	vs["entity"], vs["key_version"], vs["signature"] = storage.Text(r.Entity), storage.BigInt(int64(r.KeyVersion)), storage.BlobString(view(r.Signature))
	vs["begin_clock"], vs["logged_at"] = storage.BigInt(t.Begin), storage.BigInt(t.LoggedAt)
	vs["status"], vs["validated"] = storage.Text(string(StatusInDoubt)), storage.BigInt(0)
	return p
}

func (lr *logRequests) pendingPut(t *Tx) *storage.Put {
	p := &lr.pending
	p.Partition["bucket"] = storage.BigInt(pendingBucket(t.Request.Nonce))
	p.Clustering["begin_clock"], p.Clustering["nonce"] = storage.BigInt(t.Begin), storage.Text(t.Request.Nonce)
	return p
}

// stampBegin sets the begin clock in request writes (requestPut,
// pendingPut).
func stampBegin(puts []*storage.Put, t int64) {
	for _, p := range puts {
		if p.Table == tPending {
			p.Clustering["begin_clock"] = storage.BigInt(t)
		} else {
			p.Values["begin_clock"] = storage.BigInt(t)
		}
	}
}

// stampEnd sets the end clock that outcome writes (outcomePut) stamp.
func stampEnd(puts []*storage.Put, t int64) {
	for _, p := range puts {
		p.Values["end_clock"] = storage.BigInt(t)
	}
}

// outcomePut stamps t's end clock and outcome, on condition that no other
// process (Recover) stamped it first.
func (lr *logRequests) outcomePut(t *Tx) *storage.Put {
	p := &lr.outcome
	p.Partition["nonce"] = storage.Text(t.Request.Nonce)
	vs := p.Values
	clear(vs) // an abort sets fewer columns than a commit logged before
	vs["end_clock"], vs["status"], vs["reason"] = storage.BigInt(t.End), storage.Text(string(t.Status)), storage.Text(t.Reason)
	if t.Status != StatusCommitted {
		return p
	}
	vs["input"], vs["writes"] = encMap(t.Receipt.Input), encMap(t.Receipt.Writes)
	vs["result"], vs["receipt_sig"] = storage.Text(view(t.Receipt.Result)), storage.BlobString(view(t.Receipt.Signature))
	vs["proofs"] = storage.Text(jsonText(proofsSize(t.Proofs), func(b []byte) []byte { return appendProofs(b, t.Proofs) }))
	return p
}

// rowTx decodes a txs row.
func rowTx(nonce string, row storage.Row) (*Tx, error) {
	t := &Tx{Request: proof.Request{Nonce: nonce, ContractID: row["contract"].AsText(), Argument: row["argument"].AsBlob(),
		Entity: row["entity"].AsText(), KeyVersion: uint32(row["key_version"].AsBigInt()), Signature: row["signature"].AsBlob()},
		Begin: row["begin_clock"].AsBigInt(), LoggedAt: row["logged_at"].AsBigInt(), Status: Status(row["status"].AsText())}
	if v := row["end_clock"]; !v.IsNull() {
		t.End = v.AsBigInt()
	}
	if v := row["reason"]; !v.IsNull() {
		t.Reason = v.AsText()
	}
	if v := row["validated"]; !v.IsNull() {
		t.Validated = v.AsBigInt() != 0
	}
	if t.Status != StatusCommitted {
		return t, nil
	}
	t.Receipt = proof.Receipt{Nonce: nonce, Contract: t.Request.ContractID, Result: []byte(row["result"].AsText()),
		Signature: row["receipt_sig"].AsBlob()}
	for col, m := range map[string]*map[string]int64{"input": &t.Receipt.Input, "writes": &t.Receipt.Writes} {
		if row[col].AsText() == "" {
			continue // an empty map, as rows logged before encMap wrote null hold it
		}
		if err := json.Unmarshal([]byte(row[col].AsText()), m); err != nil {
			return nil, fmt.Errorf("validator: logged transaction %s: %s: %w", nonce, col, err)
		}
	}
	var ps []proofJSON
	if err := json.Unmarshal([]byte(row["proofs"].AsText()), &ps); err != nil {
		return nil, fmt.Errorf("validator: logged transaction %s: proofs: %w", nonce, err)
	}
	for _, p := range ps {
		t.Proofs = append(t.Proofs, proof.Proof{ID: p.ID, Age: p.Age, Nonce: p.Nonce, Input: p.Input, Hash: p.Hash, PrevHash: p.PrevHash, Signature: p.Signature})
	}
	return t, nil
}

func pendingBucket(nonce string) int64 {
	h := fnv.New32a()
	h.Write([]byte(nonce))
	return int64(h.Sum32() % pendingBuckets)
}
