package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// A ledger is also what a second domain keeps as its replica: an Auditor
// opens one on its own database, enrols the same identities and
// contracts, runs requests against it (Source, Loader) and appends the
// versions it validated (Append). Such a replica holds the ledger's own
// versions, hashes and proof signatures, so validate-ledger runs on it
// with the ledger's proof key.

// Source is the ledger's latest state as an AssetSource, read outside any
// transaction: each head and scan is read on its own. A caller that needs
// a consistent view must keep writers away (an Auditor's locks do).
func (l *Ledger) Source() AssetSource { return backendSource{l} }

type backendSource struct{ l *Ledger }

func (s backendSource) Head(ctx context.Context, id string) (Head, error) {
	r := newRequests(s.l.ns)
	row, ok, err := s.l.b.Get(ctx, r.headOf(id))
	if err != nil || !ok {
		return Head{Age: -1}, err
	}
	rr := &rowReader{what: "head of " + id, r: row}
	h := Head{Age: rr.bigint("age"), Hash: rr.blob("hash"), Output: []byte(rr.text("output"))}
	return h, rr.err
}

func (s backendSource) Versions(ctx context.Context, id string, head int64, r ScanRange) ([]AssetValue, error) {
	return s.l.scanVersions(ctx, s.l.b, id, head, r)
}

// Loader returns the function RunContract loads contracts with: the
// ledger's registered contracts and its built-in ones.
func (l *Ledger) Loader(ctx context.Context) func(id string) (Contract, error) {
	return func(id string) (Contract, error) { return l.contract(ctx, id) }
}

// Limits are the ledger's limits, defaults filled in.
func (l *Ledger) Limits() Limits { return l.lim }

// Append records, in one transaction, a transaction another ledger
// committed: its state st (committed, with the receipt's signature) and
// the versions it wrote, each with its proof signature. Each version must
// follow its asset's head here (age head+1, prev_hash the head's hash) and
// hash to its Hash; the nonce must have no state yet. Otherwise nothing is
// written and the error wraps ErrConflict (a head moved, the nonce is
// recorded) or ErrBadRequest (a version that does not chain or hash).
func (l *Ledger) Append(ctx context.Context, st *TxState, versions []*Version) error {
	if st.Status != TxCommitted {
		return fmt.Errorf("%w: only a committed transaction is appended, not %s", ErrBadRequest, st.Status)
	}
	for _, v := range versions {
		if !bytes.Equal(v.ComputeHash(), v.Hash) {
			return fmt.Errorf("%w: version %s@%d does not hash to its hash", ErrBadRequest, v.ID, v.Age)
		}
	}
	r := newRequests(l.ns)
	err := storage.UpdateWith(ctx, l.b, l.cfg.Retry, func(tx storage.Txn) error {
		for _, v := range versions {
			row, ok, err := tx.Get(ctx, r.headOf(v.ID))
			if err != nil {
				return err
			}
			h := Head{Age: -1}
			if ok {
				rr := &rowReader{what: "head of " + v.ID, r: row}
				h = Head{Age: rr.bigint("age"), Hash: rr.blob("hash")}
				if rr.err != nil {
					return rr.err
				}
			}
			if v.Age != h.Age+1 || !bytes.Equal(v.PrevHash, h.Hash) {
				return fmt.Errorf("%w: version %s@%d does not follow the head here, %s@%d", errNotNext, v.ID, v.Age, v.ID, h.Age)
			}
			if err := tx.Put(ctx, r.versionPut(v)); err != nil {
				return err
			}
			if err := tx.Put(ctx, r.headPut(v)); err != nil {
				return err
			}
		}
		return tx.Put(ctx, r.statePut(st))
	})
	switch {
	case errors.Is(err, errNotNext):
		return &storage.Error{Kind: storage.ErrConflict, Op: "append", Detail: err.Error()}
	case errors.Is(err, storage.ErrConditionNotMet):
		return &storage.Error{Kind: storage.ErrConflict, Op: "append", Detail: fmt.Sprintf("nonce %s has a state already", st.Nonce)}
	}
	return err
}

// errNotNext ends an Append whose version does not follow its head.
var errNotNext = errors.New("ledger: not the next version")

// AbortNonce records nonce as aborted, for reason, unless it has a state
// already, and returns its state: what an Auditor does to a request it
// ordered whose client never came back, so that the request can no longer
// run (a recorded nonce is refused, ErrNonceReused) before the Auditor
// lets the next one touch its assets. A committed nonce stays committed.
func (l *Ledger) AbortNonce(ctx context.Context, nonce, reason string) (*TxState, error) {
	if err := checkID("nonce", nonce); err != nil {
		return nil, err
	}
	r := newRequests(l.ns)
	st := &TxState{Nonce: nonce, Status: TxAborted, Kind: "aborted_by_auditor", Reason: storableText(reason, maxReason)}
	err := storage.UpdateWith(ctx, l.b, l.cfg.Retry, func(tx storage.Txn) error { return tx.Put(ctx, r.statePut(st)) })
	if err != nil && !errors.Is(err, storage.ErrConditionNotMet) {
		return nil, err
	}
	return l.TxState(ctx, nonce)
}

// AbortOrdered is AbortNonce at the word of the ledger's Auditor
// (Config.Auditor): r must be signed with its key, and its deadline not
// passed. Otherwise the error wraps ErrNotAuditor (a ledger without an
// Auditor refuses every abort) and nothing changes.
func (l *Ledger) AbortOrdered(ctx context.Context, r *proof.AbortRequest) (*TxState, error) {
	switch {
	case l.cfg.Auditor == nil:
		return nil, fmt.Errorf("%w: this ledger runs without an Auditor", ErrNotAuditor)
	case proof.Verify(l.cfg.Auditor, r, r.Signature) != nil:
		return nil, fmt.Errorf("%w: the abort of %q does not verify with the Auditor's key", ErrNotAuditor, truncate(r.Nonce, 40))
	case l.now().UnixMilli() > r.Deadline:
		return nil, fmt.Errorf("%w: the abort of %s expired at %s", ErrNotAuditor, r.Nonce, time.UnixMilli(r.Deadline).UTC().Format(time.RFC3339Nano))
	}
	return l.AbortNonce(ctx, r.Nonce, r.Reason)
}
