package validator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

const transfer = `
def invoke(ledger, args):
    a = ledger.get(args['from'])
    b = ledger.get(args['to'])
    av = 100 if a == None else a['value']
    bv = 100 if b == None else b['value']
    if av < args['amount']:
        fail('insufficient funds')
    ledger.put(args['from'], av - args['amount'])
    ledger.put(args['to'], bv + args['amount'])
    return {'from': av - args['amount'], 'to': bv + args['amount']}
`

func TestHonestSmall(t *testing.T) {
	ctx := context.Background()
	srv := startLedger(t)
	c := dialLedger(t, srv.Addr(), "alice")
	v := openValidator(t, openEngineDB(t), "", c, ClockConfig{})
	if err := v.RegisterContract(ctx, "transfer", []byte(transfer)); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Execute(ctx, "builtin.bulk_load", []byte(`{"prefix":"k","first":0,"count":8,"payload":"x"}`)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 40 {
				var err error
				switch rng.IntN(3) {
				case 0:
					_, err = v.Execute(ctx, "builtin.ycsb_f", fmt.Appendf(nil, `{"id":"k%d","payload":"p%d"}`, rng.IntN(8), w))
				case 1:
					_, err = v.Execute(ctx, "builtin.ycsb_c", fmt.Appendf(nil, `{"ids":["k%d","k%d"]}`, rng.IntN(8), rng.IntN(8)))
				default:
					_, err = v.Execute(ctx, "transfer", fmt.Appendf(nil, `{"from":"a%d","to":"a%d","amount":%d}`, rng.IntN(4), 4+rng.IntN(4), rng.IntN(150)))
				}
				if err != nil && !strings.Contains(err.Error(), "insufficient") {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rep := validate(t, v, Scope{CrossCheck: true})
	if !rep.OK() || rep.Validated != 321 {
		var b strings.Builder
		rep.Print(&b)
		t.Fatalf("honest history: %s", b.String())
	}
	t.Logf("validated %d (%d aborted), graph %d/%d, cross-checked %d", rep.Validated, rep.Aborted, rep.GraphNodes, rep.GraphEdges, rep.CrossChecked)
	// A second run has nothing new to do.
	rep = validate(t, v, Scope{})
	if !rep.OK() || rep.Validated != 0 {
		t.Fatalf("second run: %+v", rep)
	}
}

// TestTxRowRoundTripsEmptySets: a committed transaction that read nothing
// (its receipt's input set is nil) is stored and decoded back.
func TestTxRowRoundTripsEmptySets(t *testing.T) {
	tx := &Tx{Request: proof.Request{Nonce: "n", ContractID: "c"}, Begin: 1, End: 2, Status: StatusCommitted,
		Receipt: proof.Receipt{Result: []byte("0")}}
	lr := newLogRequests("ns")
	row := maps.Clone(lr.requestPut(tx).Values)
	maps.Copy(row, lr.outcomePut(tx).Values)
	got, err := rowTx("n", row)
	if err != nil || got.Status != StatusCommitted || len(got.Receipt.Input) != 0 || got.End != 2 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

// TestLogRequestsRefilled: requests reused for another transaction carry
// nothing of the one before — an abort logged after a commit leaves the
// committed columns alone (NULL), rather than writing the commit's.
func TestLogRequestsRefilled(t *testing.T) {
	lr := newLogRequests("ns")
	committed := &Tx{Request: proof.Request{Nonce: "a", ContractID: "c"}, Begin: 1, End: 2, Status: StatusCommitted,
		Receipt: proof.Receipt{Input: map[string]int64{"x": 1}, Writes: map[string]int64{"x": 2}, Result: []byte("0"), Signature: []byte("s")},
		Proofs:  []proof.Proof{{ID: "x", Age: 2}}}
	aborted := &Tx{Request: proof.Request{Nonce: "b", ContractID: "c"}, Begin: 3, End: 4, Status: StatusAborted, Reason: "no"}
	lr.outcomePut(committed)
	p := lr.outcomePut(aborted)
	want := (&logRequests{outcome: storage.Put{Partition: storage.Values{}, Values: storage.Values{}}}).outcomePut(aborted)
	if !maps.EqualFunc(p.Values, want.Values, storage.Value.Equal) || !maps.EqualFunc(p.Partition, want.Partition, storage.Value.Equal) {
		t.Fatalf("refilled outcome %v %v, want %v %v", p.Partition, p.Values, want.Partition, want.Values)
	}
	lr.requestPut(committed)
	lr.pendingPut(committed)
	if r := lr.requestPut(aborted); r.Partition["nonce"].AsText() != "b" || r.Values["begin_clock"].AsBigInt() != 3 {
		t.Fatalf("refilled request %v %v", r.Partition, r.Values)
	}
	if r := lr.pendingPut(aborted); r.Clustering["nonce"].AsText() != "b" || r.Clustering["begin_clock"].AsBigInt() != 3 ||
		r.Partition["bucket"].AsBigInt() != pendingBucket("b") {
		t.Fatalf("refilled pending %v %v %v", r.Partition, r.Clustering, r.Values)
	}
}

// TestLoggedNonceRefused: a request whose nonce the log already holds is
// refused with ErrNonceReused before it reaches the ledger, and changes
// nothing: the logged transaction keeps its begin clock and outcome, and
// the unvalidated list holds it once. On PostgreSQL the request's
// condition is deferred to the commit, so this is also the test that a
// deferred failure rolls back the unvalidated-list row sent with it.
func TestLoggedNonceRefused(t *testing.T) {
	eachDB(t, func(t *testing.T, db storage.Backend, ns string) {
		ctx := context.Background()
		srv := startLedger(t)
		c := dialLedger(t, srv.Addr(), "alice")
		v := openValidator(t, db, ns, c, ClockConfig{})
		if _, err := v.Execute(ctx, "builtin.bulk_load", []byte(`{"prefix":"k","first":0,"count":1,"payload":"x"}`)); err != nil {
			t.Fatal(err)
		}
		r, err := c.NewRequest("builtin.ycsb_f", []byte(`{"id":"k0","payload":"p"}`))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.ExecuteRequest(ctx, r); err != nil {
			t.Fatal(err)
		}
		before, err := v.loadTx(ctx, r.Nonce)
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.ExecuteRequest(ctx, r)
		if !errors.Is(err, proof.ErrNonceReused) || !strings.Contains(err.Error(), "already logged") {
			t.Fatalf("second ExecuteRequest: %v, want ErrNonceReused (already logged)", err)
		}
		after, err := v.loadTx(ctx, r.Nonce)
		if err != nil {
			t.Fatal(err)
		}
		if after.Begin != before.Begin || after.End != before.End || after.Status != StatusCommitted {
			t.Fatalf("logged transaction changed: %+v, was %+v", after, before)
		}
		listed := 0
		rows, err := db.Scan(ctx, &storage.Scan{Namespace: v.ns, Table: tPending,
			Partition: storage.Values{"bucket": storage.BigInt(pendingBucket(r.Nonce))}})
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			if rows.Row()["nonce"].AsText() == r.Nonce {
				listed++
			}
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			t.Fatal(err)
		}
		if listed != 1 {
			t.Fatalf("the unvalidated list holds %s %d times, want once", r.Nonce, listed)
		}
		if rep := validate(t, v, Scope{CrossCheck: true}); !rep.OK() || rep.Validated != 2 {
			t.Fatalf("validation after the refused replay: %+v", rep)
		}
	})
}
