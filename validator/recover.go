package validator

import (
	"context"
	"fmt"
	"time"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// Recovery says what Recover did (seed 000 §3.4).
type Recovery struct {
	Committed  int // in-doubt transactions the ledger reports committed
	Aborted    int // ... aborted
	TimedOut   int // unknown to the ledger after the transaction timeout: stamped aborted
	Unresolved int // unknown to the ledger, still within the timeout
}

// pendingTxs returns every logged transaction validation has not covered.
func (v *Validator) pendingTxs(ctx context.Context) ([]*Tx, error) {
	var out []*Tx
	for b := range int64(pendingBuckets) {
		var err error
		if out, err = v.loadListed(ctx, out, &storage.Scan{Namespace: v.ns, Table: tPending,
			Partition: storage.Values{"bucket": storage.BigInt(b)}, Projection: []string{"nonce"}}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loadListed appends to out the logged transactions whose nonces the
// index rows of s name (a nonce no longer logged is skipped).
func (v *Validator) loadListed(ctx context.Context, out []*Tx, s *storage.Scan) ([]*Tx, error) {
	rows, err := v.scanRows(ctx, s)
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		t, err := v.loadTx(ctx, row["nonce"].AsText())
		if err != nil {
			return nil, err
		}
		if t != nil {
			out = append(out, t)
		}
	}
	return out, nil
}

// scanPending reads the clock's current value, then every pending
// transaction.
func (v *Validator) scanPending(ctx context.Context) (int64, []*Tx, error) {
	horizon, err := v.clock.current(ctx)
	if err != nil {
		return 0, nil, err
	}
	txs, err := v.pendingTxs(ctx)
	return horizon, txs, err
}

// loadTx reads a logged transaction; nil if it is not logged.
func (v *Validator) loadTx(ctx context.Context, nonce string) (*Tx, error) {
	row, ok, err := v.db.Get(ctx, &storage.Get{Namespace: v.ns, Table: tTxs, Partition: storage.Values{"nonce": storage.Text(nonce)}})
	if err != nil || !ok {
		return nil, err
	}
	return rowTx(nonce, row)
}

// Recover resolves the transactions that have no end clock: it asks the
// ledger for each one's state; committed ones get an end clock with their
// receipt and proofs, aborted ones an end clock only. One the ledger does
// not know is left alone until TxTimeout has passed since it was logged,
// then stamped aborted — if the ledger commits it later anyway, validation
// finds versions no logged transaction accounts for.
func (v *Validator) Recover(ctx context.Context) (Recovery, error) {
	txs, err := v.pendingTxs(ctx)
	if err != nil {
		return Recovery{}, err
	}
	return v.recover(ctx, txs)
}

// recover resolves the unresolved transactions among txs, in place.
func (v *Validator) recover(ctx context.Context, txs []*Tx) (Recovery, error) {
	var rec Recovery
	for _, t := range txs {
		if !t.unresolved() {
			continue
		}
		if err := v.resolve(ctx, t, &rec); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

func (v *Validator) resolve(ctx context.Context, t *Tx, rec *Recovery) error {
	st, err := v.c.TxState(ctx, t.Request.Nonce)
	if err != nil {
		return fmt.Errorf("validator: state of in-doubt %s: %w", t.Request.Nonce, err)
	}
	switch st.Status {
	case proof.TxCommitted:
		res, err := v.c.CommittedResult(ctx, st)
		if err != nil {
			return fmt.Errorf("validator: in-doubt %s: %w", t.Request.Nonce, err)
		}
		t.Status, t.Receipt, t.Proofs = StatusCommitted, res.Receipt, res.Proofs
		rec.Committed++
	case proof.TxAborted:
		t.Status, t.Reason = StatusAborted, st.Reason
		rec.Aborted++
	default:
		age := v.cfg.Now().Sub(time.UnixMicro(t.LoggedAt))
		if age < v.cfg.TxTimeout {
			rec.Unresolved++
			return nil
		}
		t.Status, t.Reason = StatusAborted, fmt.Sprintf("unknown to the ledger %s after it was logged", age.Round(time.Millisecond))
		rec.TimedOut++
	}
	return v.logOutcome(ctx, t)
}
