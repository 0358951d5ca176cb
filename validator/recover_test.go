package validator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/proof"
)

// TestRecoverInDoubt logs requests whose replies never reach the
// Validator: one the ledger committed, one it aborted, one it never
// received. Validation must resolve the first two from GetTxState, keep
// the third (and what ended after it began) waiting until the ledger's
// transaction timeout has passed, then stamp it aborted.
func TestRecoverInDoubt(t *testing.T) {
	ctx := context.Background()
	srv := startLedger(t)
	c := dialLedger(t, srv.Addr(), "alice")
	now := time.Now()
	v, err := Open(ctx, Config{DB: openEngineDB(t), Client: c, TxTimeout: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Execute(ctx, "builtin.bulk_load", []byte(`{"prefix":"k","first":0,"count":2,"payload":"x"}`)); err != nil {
		t.Fatal(err)
	}
	// lost logs a request and hands it to the ledger (or not), as if the
	// reply were lost.
	lost := func(contract, arg string, send bool) *proof.Request {
		r, err := c.NewRequest(contract, []byte(arg))
		if err != nil {
			t.Fatal(err)
		}
		b, err := v.clock.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.logRequest(ctx, &Tx{Request: *r, Begin: b, LoggedAt: now.UnixMicro()}); err != nil {
			t.Fatal(err)
		}
		if send {
			c.ExecuteRequest(ctx, r) // the outcome is what the ledger records
		}
		return r
	}
	committed := lost("builtin.ycsb_f", `{"id":"k0","payload":"y"}`, true)
	aborted := lost("builtin.ycsb_f", `{"id":"nope","payload":"y"}`, true)
	never := lost("builtin.ycsb_f", `{"id":"k1","payload":"y"}`, false)
	// A transaction after them, reading what the committed one wrote.
	if _, err := v.Execute(ctx, "builtin.ycsb_f", []byte(`{"id":"k0","payload":"z"}`)); err != nil {
		t.Fatal(err)
	}

	rep := validate(t, v, Scope{CrossCheck: true})
	if rep.Recovery != (Recovery{Committed: 1, Aborted: 1, Unresolved: 1}) || !rep.OK() {
		t.Fatalf("first run: %+v", rep)
	}
	if rep.Unresolved != 1 || rep.Waiting < 3 {
		t.Fatalf("transactions that ended after the unresolved one began must wait: %+v", rep)
	}
	tx, err := v.loadTx(ctx, committed.Nonce)
	if err != nil || tx.Status != StatusCommitted || len(tx.Proofs) != 1 || tx.End == 0 {
		t.Fatalf("recovered committed transaction: %+v %v", tx, err)
	}
	if tx, _ := v.loadTx(ctx, aborted.Nonce); tx.Status != StatusAborted || tx.End == 0 {
		t.Fatalf("recovered aborted transaction: %+v", tx)
	}

	now = now.Add(2 * time.Minute) // past the ledger's transaction timeout
	rep = validate(t, v, Scope{CrossCheck: true})
	if rep.Recovery != (Recovery{TimedOut: 1}) || !rep.OK() || rep.Waiting != 0 || rep.Unresolved != 0 {
		t.Fatalf("second run: %+v", rep)
	}
	if tx, _ := v.loadTx(ctx, never.Nonce); tx.Status != StatusAborted || !tx.Validated {
		t.Fatalf("timed-out transaction: %+v", tx)
	}
	// The ledger commits the "aborted" request after all: validation
	// finds a version no committed transaction accounts for.
	late, err := c.ExecuteRequest(ctx, never)
	if err != nil {
		t.Fatal(err)
	}
	// Its reply, logged now, contradicts the stamp: the caller is told.
	err = v.logOutcome(ctx, &Tx{Request: *never, Status: StatusCommitted, Receipt: late.Receipt, Proofs: late.Proofs})
	if !errors.Is(err, ErrLogIncomplete) {
		t.Fatalf("a committed reply after a timed-out stamp: %v, want ErrLogIncomplete", err)
	}
	// A reply that agrees with recovery's stamp is no error.
	if err := v.logOutcome(ctx, &Tx{Request: *committed, Status: StatusCommitted}); err != nil {
		t.Fatalf("a reply agreeing with recovery: %v", err)
	}
	rep = validate(t, v, Scope{Key: "k1", Age: -1, CrossCheck: true})
	if len(rep.Violations) != 1 || rep.Violations[0].Kind != KindUnlogged || rep.Violations[0].Txs[0] != never.Nonce {
		t.Fatalf("a commit after the timeout must be reported: %+v", rep.Violations)
	}
}
