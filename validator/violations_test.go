package validator

import (
	"context"
	"testing"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// TestViolationsRecordedOnce: validating the same transactions again — as
// after a crash between recording a run's violations and marking its
// transactions validated — rewrites the same violation rows instead of
// adding copies.
func TestViolationsRecordedOnce(t *testing.T) {
	ctx := context.Background()
	e := newByzEnv(t)
	e.exec(t, "builtin.bulk_load", `{"prefix":"k","first":0,"count":2,"payload":"init"}`)
	e.p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
		return e.p.alter(ctx, in, func(res *proof.Result) error {
			sig := res.Proofs[0].Signature
			sig[len(sig)/2] ^= 0x01
			return nil
		})
	})
	t1 := e.exec(t, "builtin.ycsb_f", `{"id":"k0","payload":"p1"}`).Nonce
	scope := Scope{Key: "k0", Age: -1}
	count := func() int {
		t.Helper()
		rep := validate(t, e.v, scope)
		n := 0
		for _, vl := range rep.Violations {
			if vl.Kind == KindBadSignature {
				n++
			}
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("%d bad-signature violations recorded, want 1", n)
	}
	// Undo the second step of persist for t1: pending again, not validated.
	n := storage.Text(t1)
	tx1, err := e.v.loadTx(ctx, t1)
	if err != nil || tx1 == nil {
		t.Fatalf("load %s: %v, %v", t1, tx1, err)
	}
	if err := e.v.db.Put(ctx, (&logRequests{pending: storage.Put{Namespace: e.v.ns, Table: tPending, Partition: storage.Values{},
		Clustering: storage.Values{}}}).pendingPut(tx1)); err != nil {
		t.Fatal(err)
	}
	if err := e.v.db.Put(ctx, &storage.Put{Namespace: e.v.ns, Table: tTxs, Partition: storage.Values{"nonce": n},
		Values: storage.Values{"validated": storage.Null()}}); err != nil {
		t.Fatal(err)
	}
	rep := validate(t, e.v, Scope{})
	if rep.Validated != 1 {
		t.Fatalf("validated %d transactions again, want t1", rep.Validated)
	}
	if n := count(); n != 1 {
		t.Fatalf("after validating t1 again: %d bad-signature violations recorded, want still 1", n)
	}
	if p, err := e.v.pendingTxs(ctx); err != nil || len(p) != 0 {
		t.Fatalf("pending after validating everything: %d, %v", len(p), err)
	}
}
