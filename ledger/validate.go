package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
)

// The checks validate-ledger runs on every version, in this order.
const (
	CheckChain           = "chain"            // the version is missing or its age breaks the sequence
	CheckHash            = "hash"             // the stored hash is not SHA-256 of the version's fields
	CheckPrevHash        = "prev_hash"        // prev_hash is not the hash of the version before
	CheckProofSignature  = "proof_signature"  // the ledger's signature on the proof does not verify
	CheckClientSignature = "client_signature" // the request's signature does not verify with its identity
	CheckNonce           = "nonce"            // the nonce repeats, its transaction state disagrees, or a write it records is gone
	CheckOutput          = "output"           // re-executing the contract on the recorded inputs gives another value
)

// Fault is the first version that failed validation, and why.
type Fault struct {
	ID     string
	Age    int64
	Check  string // one of the Check constants
	Detail string
}

func (f *Fault) Error() string {
	return fmt.Sprintf("asset %s version %d fails %s: %s", f.ID, f.Age, f.Check, f.Detail)
}

// Validation is the outcome of ValidateLedger.
type Validation struct {
	ID         string
	Start, End int64 // the ages checked
	Checked    int   // versions that passed every check
	Fault      *Fault
	// Truncated: Limits.MaxValidateVersions stopped the call at End,
	// before the end asked for; validate again from End+1.
	Truncated bool
}

// ValidateLedger checks the versions of asset id with ages in [start, end]
// (end < 0: up to the latest) and stops at the first that fails. Per
// version it checks, in order: the chain (ages without gaps), the hash, the
// link to the previous hash, the ledger's proof signature, the client's
// request signature, the nonce (used once along the chain, and recorded as
// committed with this write, every other write of that transaction held by
// the ledger), and the output, by re-executing the contract
// on the versions its input names. A returned error means validation could
// not run (storage failure, bad arguments); a fault is in the Validation.
// One call checks at most Limits.MaxValidateVersions versions (Truncated).
func (l *Ledger) ValidateLedger(ctx context.Context, id string, start, end int64) (*Validation, error) {
	if err := checkAssetID(id); err != nil {
		return nil, err
	}
	if start < 0 {
		return nil, fmt.Errorf("%w: start age %d is negative", ErrBadRequest, start)
	}
	latest, err := l.Latest(ctx, id)
	if err != nil {
		return nil, err
	}
	if end < 0 || end > latest {
		end = latest
	}
	val := &Validation{ID: id, Start: start, End: end}
	capped := false
	if n := int64(l.lim.MaxValidateVersions); start <= end && end-start >= n {
		val.End, capped = start+n-1, true
		end = val.End
	}
	var prevHash []byte
	if start > 0 && start <= end {
		prev, err := l.Version(ctx, id, start-1)
		if errors.Is(err, ErrNotFound) {
			val.Fault = &Fault{ID: id, Age: start - 1, Check: CheckChain, Detail: err.Error()}
			return val, nil
		}
		if err != nil {
			return nil, err
		}
		prevHash = prev.Hash
	}
	for age := start; age <= end; {
		page, err := l.scanRows(ctx, l.b, id, end, ScanRange{Start: age, End: end, Ascending: true, Limit: l.lim.MaxScanLimit})
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			val.Fault = &Fault{ID: id, Age: age, Check: CheckChain, Detail: "version missing"}
			return val, nil
		}
		for _, row := range page {
			v, err := rowVersion(id, row)
			if err != nil {
				val.Fault = &Fault{ID: id, Age: age, Check: CheckChain, Detail: err.Error()}
				return val, nil
			}
			if v.Age != age {
				val.Fault = &Fault{ID: id, Age: age, Check: CheckChain, Detail: fmt.Sprintf("version missing; the next one is %d", v.Age)}
				return val, nil
			}
			if check, detail, err := l.checkVersion(ctx, v, prevHash); err != nil {
				return nil, err
			} else if check != "" {
				val.Fault = &Fault{ID: id, Age: age, Check: check, Detail: detail}
				return val, nil
			}
			prevHash = v.Hash
			val.Checked++
			age++
		}
	}
	val.Truncated = capped // reached only without a fault
	return val, nil
}

// describeWrites lists a transaction's writes for people: "a@3, b@7".
func describeWrites(w map[string]int64) string {
	if len(w) == 0 {
		return "nothing"
	}
	var b strings.Builder
	for i, id := range appendSortedKeys(nil, w) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s@%d", id, w[id])
	}
	return b.String()
}

// checkVersion runs the checks on one version; it returns the failed check
// and why, or "".
func (l *Ledger) checkVersion(ctx context.Context, v *Version, prevHash []byte) (check, detail string, err error) {
	if h := v.ComputeHash(); !bytes.Equal(h, v.Hash) {
		return CheckHash, fmt.Sprintf("stored %x, recomputed %x", v.Hash, h), nil
	}
	if !bytes.Equal(v.PrevHash, prevHash) {
		return CheckPrevHash, fmt.Sprintf("prev_hash %x, the previous version's hash is %x", v.PrevHash, prevHash), nil
	}
	p := v.Proof()
	if err := l.VerifyProof(&p); err != nil {
		return CheckProofSignature, err.Error(), nil
	}
	req := &Request{Nonce: v.Nonce, ContractID: v.Contract, Argument: v.Argument, Entity: v.Entity, KeyVersion: v.KeyVersion, Signature: v.Signature}
	verifier, err := l.verifier(ctx, v.Entity, v.KeyVersion)
	if errors.Is(err, ErrUnknownEntity) {
		return CheckClientSignature, err.Error(), nil
	}
	if err != nil {
		return "", "", err
	}
	if err := Verify(verifier, req, req.Signature); err != nil {
		return CheckClientSignature, err.Error(), nil
	}
	// The transaction state names one age per asset, so a nonce that wrote
	// two versions of this asset fails here for one of them.
	st, err := l.TxState(ctx, v.Nonce)
	if err != nil {
		return "", "", err
	}
	if st.Status != TxCommitted || st.Writes[v.ID] != v.Age {
		return CheckNonce, fmt.Sprintf("transaction %s is recorded as %s, writing %s", v.Nonce, st.Status, describeWrites(st.Writes)), nil
	}
	// Every other write of the transaction must be in the ledger too: a
	// version deleted behind the ledger's back, its asset's head rolled
	// back, shows here from any asset the transaction also wrote.
	for _, id := range appendSortedKeys(nil, st.Writes) {
		if id == v.ID {
			continue
		}
		age := st.Writes[id]
		row, found, err := l.b.Get(ctx, l.versionGet(id, age, "nonce"))
		if err != nil {
			return "", "", err
		}
		if !found || row["nonce"].Content() != v.Nonce {
			return CheckNonce, fmt.Sprintf("transaction %s is recorded as committed, writing %s, but the ledger does not hold %s@%d as its write",
				v.Nonce, describeWrites(st.Writes), id, age), nil
		}
	}
	rc := st.Receipt()
	if err := l.VerifyReceipt(&rc); err != nil || rc.Contract != v.Contract || !maps.Equal(rc.Input, v.Input) {
		return CheckNonce, fmt.Sprintf("the receipt of transaction %s does not verify or does not match the version (%v)", v.Nonce, err), nil
	}
	out, detail, err := l.reexecute(ctx, v, st.Writes)
	if err != nil {
		return "", "", err
	}
	if detail != "" {
		return CheckOutput, detail, nil
	}
	if !bytes.Equal(out, v.Output) {
		return CheckOutput, fmt.Sprintf("stored %s, re-execution gives %s", truncate(string(v.Output), 40), truncate(string(out), 40)), nil
	}
	return "", "", nil
}

// reexecute runs v's request again on the versions its input names and
// returns the value it writes to v.ID, or why the replay diverged.
func (l *Ledger) reexecute(ctx context.Context, v *Version, written map[string]int64) (out []byte, divergence string, err error) {
	load := func(id string) (Contract, error) { return l.contract(ctx, id) }
	r, divergence, err := replay(ctx, l.lim, l.gate, load, v.Contract, v.Argument, v.Input, written, storedVersions{l})
	if err != nil || divergence != "" {
		return nil, divergence, err
	}
	return r.Writes[v.ID], "", nil
}

// storedVersions serves a replay from the ledger's own storage.
type storedVersions struct{ l *Ledger }

func (s storedVersions) Output(ctx context.Context, id string, age int64) ([]byte, error) {
	row, found, err := s.l.b.Get(ctx, s.l.versionGet(id, age, "output"))
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: input version %s/%d is missing", ErrNotFound, id, age)
	}
	return []byte(row["output"].Content()), nil
}
