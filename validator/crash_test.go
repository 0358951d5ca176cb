package validator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/testenv"
)

// TestCrashLosesNoAcknowledgedTransaction crashes the client process — the
// Validator and its engine database, on a filesystem that keeps only
// synced bytes and a random share of the rest — at a random moment while 8
// threads execute read-modify-writes on 16 assets through a real
// ledger. Nothing is sent after the crash, as a dead process sends
// nothing. The Validator then reopens its database, and for every seed:
//   - every request the ledger received is logged (a request is durable
//     before it is sent), so validation with the cross-check finds no
//     version the log does not account for;
//   - every transaction whose Execute returned before the crash is in the
//     log and, once recovery has run, committed with its proofs — its
//     outcome may have been lost with the unsynced tail, its request not;
//   - validation, before and after the ledger's transaction timeout,
//     finds no violation, and in-doubt transactions the ledger never saw
//     end aborted;
//   - logging goes on after the restart with clocks that respect what was
//     logged before it (more transactions, validated clean).
func TestCrashLosesNoAcknowledgedTransaction(t *testing.T) {
	seeds := testenv.Count(t, "KIROKU_VALIDATOR_CRASH_SEEDS", 6, 2)
	srv, dir := startByzLedger(t)
	p := startByzProxy(t, srv, dir)
	c := dialLedger(t, p.addr, "alice")
	for seed := range seeds {
		validatorCrashSeed(t, uint64(seed), p, c)
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
}

func validatorCrashSeed(t *testing.T, seed uint64, p *byzProxy, c *client.Client) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	mem := vfs.NewCrashableMem()
	cfg := engine.Config{Dir: "/v", FS: mem, LogSegmentSize: 1 << 20, EpochInterval: time.Duration(1+rng.IntN(10)) * time.Millisecond,
		CheckpointInterval: []time.Duration{-1, 20 * time.Millisecond}[rng.IntN(2)]}
	db, err := engine.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var nowMu sync.Mutex
	clock := func() time.Time { nowMu.Lock(); defer nowMu.Unlock(); return now }
	open := func(db *engine.DB) *Validator {
		v, err := Open(ctx, Config{DB: db, Namespace: fmt.Sprintf("crash%d", seed), Client: c, TxTimeout: time.Minute, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := open(db)
	prefix := fmt.Sprintf("s%d-", seed)
	if _, err := v.Execute(ctx, "builtin.bulk_load", fmt.Appendf(nil, `{"prefix":%q,"first":0,"count":16,"payload":"x"}`, prefix)); err != nil {
		t.Fatal(err)
	}

	// The crash: the clone is taken, and from then on the proxy answers no
	// execute (it holds it until the caller gives up), under one lock with
	// the record of acknowledgements.
	var (
		mu      sync.Mutex
		crashed bool
		acked   []string
		clone   *vfs.MemFS
	)
	p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
		mu.Lock()
		dead := crashed
		mu.Unlock()
		if dead {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return p.forward(ctx, in)
	})
	defer p.setExec(nil)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				arg := fmt.Appendf(nil, `{"id":"%s%d","payload":"w%d-%d"}`, prefix, (w*5+i)%16, w, i)
				r, err := c.NewRequest("builtin.ycsb_f", arg)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := v.ExecuteRequest(wctx, r); err != nil {
					if wctx.Err() == nil {
						t.Errorf("execute before the crash: %v", err)
					}
					return
				}
				mu.Lock()
				if !crashed {
					acked = append(acked, r.Nonce)
				}
				mu.Unlock()
			}
		})
	}
	// The crash comes after a random number of acknowledgements, at a
	// random moment of what is in flight then.
	for target, deadline := 5+rng.IntN(60), time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= target || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(time.Duration(rng.IntN(20000)) * time.Microsecond)
	mu.Lock()
	clone = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: []int{0, 50, 100}[rng.IntN(3)], RNG: rand.New(rand.NewPCG(seed, 8))})
	crashed = true
	mu.Unlock()
	stop()
	wg.Wait()
	if err := db.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("closing the crashed database: %v", err)
	}
	if len(acked) == 0 {
		t.Fatalf("seed %d: nothing acknowledged before the crash", seed)
	}

	cfg.FS = clone
	db, err = engine.Open(cfg)
	if err != nil {
		t.Fatalf("reopening after the crash: %v", err)
	}
	defer db.Close()
	v = open(db)
	p.setExec(nil)
	lost := 0 // acknowledged, and back in doubt
	for _, n := range acked {
		if tx, err := v.loadTx(ctx, n); err == nil && tx.unresolved() {
			lost++
		}
	}
	rep := validate(t, v, Scope{CrossCheck: true})
	if !rep.OK() {
		t.Fatalf("seed %d: after the crash: %+v", seed, rep)
	}
	t.Logf("seed %d: %d acknowledged before the crash, %d of them back in doubt after it; recovery: %+v", seed, len(acked), lost, rep.Recovery)
	nowMu.Lock()
	now = now.Add(2 * time.Minute) // past the ledger's transaction timeout
	nowMu.Unlock()
	rep = validate(t, v, Scope{CrossCheck: true})
	if !rep.OK() || rep.Unresolved != 0 || rep.Waiting != 0 {
		t.Fatalf("seed %d: past the transaction timeout: %+v", seed, rep)
	}
	for _, n := range acked {
		tx, err := v.loadTx(ctx, n)
		if err != nil {
			t.Fatalf("seed %d: acknowledged %s: %v", seed, n, err)
		}
		if tx.Status != StatusCommitted || tx.End == 0 || len(tx.Proofs) != 1 || !tx.Validated {
			t.Fatalf("seed %d: acknowledged %s was logged as %+v", seed, n, tx)
		}
	}
	for i := range 20 {
		if _, err := v.Execute(ctx, "builtin.ycsb_f", fmt.Appendf(nil, `{"id":"%s%d","payload":"after%d"}`, prefix, i%16, i)); err != nil {
			t.Fatal(err)
		}
	}
	if rep := validate(t, v, Scope{CrossCheck: true}); !rep.OK() || rep.Validated != 20 {
		t.Fatalf("seed %d: after the restart: %+v", seed, rep)
	}
}
