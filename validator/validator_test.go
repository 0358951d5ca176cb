package validator

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kiroku-db/kiroku/ledger"
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
	tx := &Tx{Request: ledger.Request{Nonce: "n", ContractID: "c"}, Begin: 1, End: 2, Status: StatusCommitted,
		Receipt: ledger.Receipt{Result: []byte("0")}}
	row := requestValues(tx)
	maps.Copy(row, outcomeValues(tx))
	got, err := rowTx("n", row)
	if err != nil || got.Status != StatusCommitted || len(got.Receipt.Input) != 0 || got.End != 2 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}
