package validator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// TestHonestLedgerNoFalseAlarms runs 32 concurrent clients through the
// Validator against a real (honest) ledger, on hot and uniform keys, while
// validation runs incrementally beside them; every run must find nothing,
// and together they must cover every transaction exactly once. 100,000
// transactions; 12,000 under the race detector, to fit CI.
func TestHonestLedgerNoFalseAlarms(t *testing.T) {
	total := 100_000
	if raceEnabled {
		total = 12_000
	}
	if testing.Short() {
		total = 3_000
	}
	honest(t, openEngineDB(t), "", total, 32, ClockConfig{})
}

// TestHonestPostgresValidatorDB keeps the Validator database on
// PostgreSQL, with a small clock (K=4, begin clocks scanning every 3rd
// time).
func TestHonestPostgresValidatorDB(t *testing.T) {
	db := openPostgresDB(t)
	ns := fmt.Sprintf("validator_%d", time.Now().UnixNano())
	t.Cleanup(func() { dropNamespace(t, db, ns) })
	honest(t, db, ns, 3_000, 32, ClockConfig{Counters: 4, ScanEvery: 3})
}

func honest(t *testing.T, db storage.Backend, ns string, total, clients int, clock ClockConfig) {
	ctx := context.Background()
	srv := startLedger(t)
	c := dialLedger(t, srv.Addr(), "alice")
	v := openValidator(t, db, ns, c, clock)
	if err := v.RegisterContract(ctx, "transfer", []byte(transfer)); err != nil {
		t.Fatal(err)
	}
	const uniform = 1000
	for first := 0; first < uniform; first += 250 {
		if _, err := v.Execute(ctx, "builtin.bulk_load", fmt.Appendf(nil, `{"prefix":"u","first":%d,"count":250,"payload":"x"}`, first)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Execute(ctx, "builtin.bulk_load", []byte(`{"prefix":"h","first":0,"count":8,"payload":"x"}`)); err != nil {
		t.Fatal(err)
	}
	var issued atomic.Int64
	var validated atomic.Int64
	check := func(rep *Report) {
		t.Helper()
		if !rep.OK() {
			var b strings.Builder
			rep.Print(&b)
			t.Fatalf("honest ledger, violations: %s", b.String())
		}
		validated.Add(int64(rep.Validated))
	}
	check(validate(t, v, Scope{CrossCheck: true}))
	stop := make(chan struct{})
	vdone := make(chan struct{})
	go func() { // incremental validation beside the clients
		defer close(vdone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			rep, err := v.Validate(ctx, Scope{})
			if err != nil {
				t.Error(err)
				return
			}
			if !rep.OK() {
				var b strings.Builder
				rep.Print(&b)
				t.Errorf("honest ledger, violations: %s", b.String())
				return
			}
			validated.Add(int64(rep.Validated))
		}
	}()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			key := func() string {
				if rng.IntN(2) == 0 {
					return fmt.Sprintf("h%d", rng.IntN(8))
				}
				return fmt.Sprintf("u%d", rng.IntN(uniform))
			}
			for issued.Add(1) <= int64(total) {
				var err error
				switch rng.IntN(4) {
				case 0, 1:
					_, err = v.Execute(ctx, "builtin.ycsb_f", fmt.Appendf(nil, `{"id":%q,"payload":"p%d"}`, key(), w))
				case 2:
					_, err = v.Execute(ctx, "builtin.ycsb_c", fmt.Appendf(nil, `{"ids":[%q,%q]}`, key(), key()))
				default:
					_, err = v.Execute(ctx, "transfer", fmt.Appendf(nil, `{"from":"a%d","to":"a%d","amount":%d}`, rng.IntN(4), 4+rng.IntN(4), rng.IntN(150)))
				}
				if err != nil && !errors.Is(err, proof.ErrContractFailed) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-vdone
	rep := validate(t, v, Scope{})
	check(rep)
	want := int64(total + uniform/250 + 1)
	if got := validated.Load(); got != want {
		t.Fatalf("validation covered %d transactions, %d were logged", got, want)
	}
	t.Logf("%d transactions validated with no violation; last run: graph %d nodes, %d edges", want, rep.GraphNodes, rep.GraphEdges)
}

// dropNamespace drops ns and every table in it (DropNamespace refuses a
// namespace that still has tables).
func dropNamespace(t *testing.T, db storage.Backend, ns string) {
	t.Helper()
	ctx := context.Background()
	names, err := db.ListTables(ctx, ns)
	if err != nil {
		t.Errorf("cleanup: listing %s: %v", ns, err)
		return
	}
	for _, name := range names {
		if err := db.DropTable(ctx, ns, name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if err := db.DropNamespace(ctx, ns); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}
