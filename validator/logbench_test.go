package validator

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/bench"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// BenchmarkLogTx is the Validator's own part of a logged YCSB-F
// transaction, with no ledger: a begin clock, the request's durable
// commit, an end clock and the outcome, by 64 goroutines at once on the
// engine. cpu-µs/op is the process's CPU (user and system) per logged
// transaction. clock=exclusive is the engine as the Validator uses it
// (no clock scans the table); clock=scan hides its storage.Exclusive, so
// every clock scans, as on a database other processes share.
func BenchmarkLogTx(b *testing.B) {
	for _, scan := range []bool{false, true} {
		b.Run(map[bool]string{false: "clock=exclusive", true: "clock=scan"}[scan], func(b *testing.B) {
			ctx := context.Background()
			var db storage.Backend = openEngineDB(b)
			if scan {
				db = sharedDB{db}
			}
			if err := ensureSchema(ctx, db, DefaultNamespace); err != nil {
				b.Fatal(err)
			}
			c, err := newClock(ctx, db, DefaultNamespace, ClockConfig{Counters: 4, ScanEvery: 1})
			if err != nil {
				b.Fatal(err)
			}
			v := &Validator{cfg: Config{Now: time.Now}, db: db, ns: DefaultNamespace, clock: c, outcomes: storage.Unsynced(db)}
			var seq atomic.Int64
			cpu := bench.CPUClock()
			b.SetParallelism(64 / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			cpu0, err := cpu()
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					t := benchTx(seq.Add(1))
					var err error
					if t.Begin, err = v.clock.Begin(ctx); err == nil {
						if err = v.logRequest(ctx, t); err == nil {
							t.Status = StatusCommitted
							err = v.logOutcome(ctx, t)
						}
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			cpu1, err := cpu()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// benchTx is a logged YCSB-F transaction of the sizes the bench sends.
func benchTx(n int64) *Tx {
	id := "y" + strconv.FormatInt(n%10000, 10)
	nonce := "bench-" + strconv.FormatInt(n, 10)
	return &Tx{
		Request:  proof.Request{Nonce: nonce, ContractID: "builtin.ycsb_f", Argument: benchArg, Entity: "bench", KeyVersion: 1, Signature: benchSig},
		LoggedAt: time.Now().UnixMicro(),
		Receipt: proof.Receipt{Nonce: nonce, Contract: "builtin.ycsb_f", Input: map[string]int64{id: 5}, Writes: map[string]int64{id: 6},
			Result: []byte(`{"ok":true}`), Signature: benchSig},
		Proofs: []proof.Proof{{ID: id, Age: 6, Nonce: nonce, Input: map[string]int64{id: 5}, Hash: benchSig, PrevHash: benchSig, Signature: benchSig}},
	}
}

var (
	benchSig = make([]byte, 32)
	benchArg = []byte(`{"id":"y1234","payload":"` + strings.Repeat("q", 100) + `"}`)
)
