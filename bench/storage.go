// Package bench holds the workloads behind `kiroku bench`. Each benchmark
// measures kiroku and a baseline in the same run, on the same machine, so
// the figures it prints can be compared with each other and not only with
// numbers taken elsewhere.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/kiroku-db/kiroku/storage"
)

// StorageConfig configures the storage benchmark. Zero fields take defaults.
type StorageConfig struct {
	Ops       int           // single-client operations per latency measurement; 0 = 2000
	ValueSize int           // bytes per value; 0 = 100
	Workers   int           // bank and conditional-put goroutines; 0 = 16
	Accounts  int           // bank accounts; 0 = 1000
	Duration  time.Duration // bank and conditional-put run length; 0 = 5s
	Runs      int           // repetitions; medians are reported; 0 = 3
}

func (c *StorageConfig) validate() error {
	if c.Ops == 0 {
		c.Ops = 2000
	}
	if c.ValueSize == 0 {
		c.ValueSize = 100
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.Accounts == 0 {
		c.Accounts = 1000
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	if c.Runs == 0 {
		c.Runs = 3
	}
	if c.Ops < 0 || c.ValueSize < 0 || c.Workers < 0 || c.Accounts < 2 || c.Duration < 0 || c.Runs < 0 {
		return errors.New("bench: negative setting, or fewer than 2 accounts")
	}
	return nil
}

// Target is one thing measured: kiroku's storage API or a baseline.
type Target interface {
	Name() string
	// Setup creates the tables and loads accounts accounts with balance 1000.
	Setup(ctx context.Context, accounts int) error
	Put(ctx context.Context, key int64, value []byte) error
	// CondPut replaces key's value old with value, on condition that it is
	// old (a compare-and-set, atomic with the write), and fails if it is not.
	CondPut(ctx context.Context, key int64, old, value []byte) error
	Get(ctx context.Context, key int64) error
	// Transfer moves amount between two accounts in one serializable
	// transaction, retrying conflicts; it returns the number of retries.
	// ErrNoTransactions (from Transfer and Total): the target has no
	// transactions, and the bank is not run for it.
	Transfer(ctx context.Context, from, to, amount int64) (retries int, err error)
	// Total is the sum of all balances, to check the bank kept its money.
	Total(ctx context.Context) (int64, error)
	Teardown(ctx context.Context) error
}

// ErrNoTransactions is a target's answer to Transfer when it has no
// transactions to run the bank with.
var ErrNoTransactions = errors.New("bench: the target has no transactions")

// Latency is a latency distribution.
type Latency struct {
	Ops        int     `json:"ops"`
	MeanMicros float64 `json:"mean_us"`
	P50Micros  int64   `json:"p50_us"`
	P99Micros  int64   `json:"p99_us"`
	MaxMicros  int64   `json:"max_us"`
}

// BankResult is one bank run.
type BankResult struct {
	Committed int64   `json:"committed"`
	Retries   int64   `json:"retries"`
	TPS       float64 `json:"committed_per_s"`
	Latency   Latency `json:"latency"`
}

// TargetResult is one target's figures in one run.
type TargetResult struct {
	Target  string  `json:"target"`
	Put     Latency `json:"put"`
	CondPut Latency `json:"cond_put"`
	// CondPutTPS is conditional puts per second from Workers concurrent
	// clients, each on keys of its own (no conflicts).
	CondPutTPS float64    `json:"cond_put_per_s"`
	Get        Latency    `json:"get"`
	Bank       BankResult `json:"bank"`
	NoBank     bool       `json:"no_bank,omitempty"` // the target has no transactions
}

func latencyOf(h *hdrhistogram.Histogram) Latency {
	return Latency{Ops: int(h.TotalCount()), MeanMicros: h.Mean(), P50Micros: h.ValueAtQuantile(50),
		P99Micros: h.ValueAtQuantile(99), MaxMicros: h.Max()}
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 60_000_000, 3) }

// RunStorage measures every target cfg.Runs times, interleaved so that
// drift in the machine's load hits them alike, and returns all runs.
func RunStorage(ctx context.Context, cfg StorageConfig, targets []Target, progress func(TargetResult)) ([][]TargetResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	for _, t := range targets {
		// Teardown first: a setup that fails half-way leaves a schema or
		// pool to remove.
		defer t.Teardown(context.WithoutCancel(ctx))
		if err := t.Setup(ctx, cfg.Accounts); err != nil {
			return nil, fmt.Errorf("bench: %s setup: %w", t.Name(), err)
		}
	}
	value, value2 := make([]byte, cfg.ValueSize), make([]byte, cfg.ValueSize)
	_, _ = rand.Read(value)
	_, _ = rand.Read(value2)
	var runs [][]TargetResult
	for run := 0; run < cfg.Runs; run++ {
		var results []TargetResult
		for _, t := range targets {
			r := TargetResult{Target: t.Name()}
			base := int64(run*cfg.Ops + 1_000_000)
			h := newHist()
			for i := 0; i < cfg.Ops; i++ {
				start := time.Now()
				if err := t.Put(ctx, base+int64(i), value); err != nil {
					return nil, fmt.Errorf("bench: %s put: %w", t.Name(), err)
				}
				_ = h.RecordValue(time.Since(start).Microseconds())
			}
			r.Put = latencyOf(h)
			// A compare-and-set of each key just written.
			h = newHist()
			for i := 0; i < cfg.Ops; i++ {
				start := time.Now()
				if err := t.CondPut(ctx, base+int64(i), value, value2); err != nil {
					return nil, fmt.Errorf("bench: %s conditional put: %w", t.Name(), err)
				}
				_ = h.RecordValue(time.Since(start).Microseconds())
			}
			r.CondPut = latencyOf(h)
			// The keys hold value2 now.
			tps, err := runCondPuts(ctx, t, cfg, base, value2, value)
			if err != nil {
				return nil, err
			}
			r.CondPutTPS = tps
			h = newHist()
			rng := mrand.New(mrand.NewPCG(uint64(run), 1))
			for i := 0; i < cfg.Ops; i++ {
				k := base + int64(rng.IntN(cfg.Ops))
				start := time.Now()
				if err := t.Get(ctx, k); err != nil {
					return nil, fmt.Errorf("bench: %s get: %w", t.Name(), err)
				}
				_ = h.RecordValue(time.Since(start).Microseconds())
			}
			r.Get = latencyOf(h)
			bank, err := runBank(ctx, t, cfg, uint64(run))
			switch {
			case errors.Is(err, ErrNoTransactions):
				r.NoBank = true
			case err != nil:
				return nil, err
			}
			r.Bank = bank
			if progress != nil {
				progress(r)
			}
			results = append(results, r)
		}
		runs = append(runs, results)
	}
	return runs, nil
}

// runCondPuts runs cfg.Workers clients for cfg.Duration, each
// compare-and-setting keys of its own among the cfg.Ops keys from base,
// which hold cur, between cur and next, and returns the puts per second.
// Afterwards every key holds cur or next.
func runCondPuts(ctx context.Context, t Target, cfg StorageConfig, base int64, cur, next []byte) (float64, error) {
	var done atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	workers := min(cfg.Workers, cfg.Ops)
	began := time.Now()
	deadline := began.Add(cfg.Duration)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The worker's keys, and what each holds.
			var keys []int64
			for k := w; k < cfg.Ops; k += workers {
				keys = append(keys, base+int64(k))
			}
			flipped := make([]bool, len(keys))
			for i := 0; time.Now().Before(deadline); i = (i + 1) % len(keys) {
				old, val := cur, next
				if flipped[i] {
					old, val = next, cur
				}
				if err := t.CondPut(ctx, keys[i], old, val); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("bench: %s conditional put: %w", t.Name(), err)
					}
					mu.Unlock()
					return
				}
				flipped[i] = !flipped[i]
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(done.Load()) / time.Since(began).Seconds(), nil
}

func runBank(ctx context.Context, t Target, cfg StorageConfig, seed uint64) (BankResult, error) {
	before, err := t.Total(ctx)
	if err != nil {
		return BankResult{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var committed, retries atomic.Int64
	var mu sync.Mutex
	h := newHist()
	var firstErr error
	var wg sync.WaitGroup
	began := time.Now()
	deadline := began.Add(cfg.Duration)
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(seed, uint64(w)))
			local := newHist()
			defer func() { mu.Lock(); h.Merge(local); mu.Unlock() }()
			for time.Now().Before(deadline) {
				from := rng.Int64N(int64(cfg.Accounts))
				to := rng.Int64N(int64(cfg.Accounts - 1))
				if to >= from {
					to++
				}
				start := time.Now()
				n, err := t.Transfer(ctx, from, to, 1+rng.Int64N(10))
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("bench: %s transfer: %w", t.Name(), err)
					}
					mu.Unlock()
					cancel()
					return
				}
				_ = local.RecordValue(time.Since(start).Microseconds())
				committed.Add(1)
				retries.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began) // the last transfers end after the deadline
	if firstErr != nil {
		return BankResult{}, firstErr
	}
	after, err := t.Total(context.WithoutCancel(ctx))
	if err != nil {
		return BankResult{}, err
	}
	if after != before {
		return BankResult{}, fmt.Errorf("bench: %s: bank total changed from %d to %d", t.Name(), before, after)
	}
	return BankResult{Committed: committed.Load(), Retries: retries.Load(),
		TPS: float64(committed.Load()) / elapsed.Seconds(), Latency: latencyOf(h)}, nil
}

// Median returns, per target, the run with the median value of each figure
// taken separately.
func Median(runs [][]TargetResult) []TargetResult {
	if len(runs) == 0 {
		return nil
	}
	out := make([]TargetResult, len(runs[0]))
	for i := range out {
		col := make([]TargetResult, len(runs))
		for r := range runs {
			col[r] = runs[r][i]
		}
		med := func(f func(TargetResult) float64) float64 {
			v := make([]float64, len(col))
			for j, c := range col {
				v[j] = f(c)
			}
			sort.Float64s(v)
			if len(v)%2 == 1 {
				return v[len(v)/2]
			}
			return (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		lat := func(f func(TargetResult) Latency) Latency {
			return Latency{Ops: f(col[0]).Ops,
				MeanMicros: med(func(c TargetResult) float64 { return f(c).MeanMicros }),
				P50Micros:  int64(med(func(c TargetResult) float64 { return float64(f(c).P50Micros) })),
				P99Micros:  int64(med(func(c TargetResult) float64 { return float64(f(c).P99Micros) })),
				MaxMicros:  int64(med(func(c TargetResult) float64 { return float64(f(c).MaxMicros) }))}
		}
		out[i] = TargetResult{Target: col[0].Target, NoBank: col[0].NoBank,
			Put:        lat(func(c TargetResult) Latency { return c.Put }),
			CondPut:    lat(func(c TargetResult) Latency { return c.CondPut }),
			CondPutTPS: med(func(c TargetResult) float64 { return c.CondPutTPS }),
			Get:        lat(func(c TargetResult) Latency { return c.Get }),
			Bank: BankResult{
				Committed: int64(med(func(c TargetResult) float64 { return float64(c.Bank.Committed) })),
				Retries:   int64(med(func(c TargetResult) float64 { return float64(c.Bank.Retries) })),
				TPS:       med(func(c TargetResult) float64 { return c.Bank.TPS }),
				Latency:   lat(func(c TargetResult) Latency { return c.Bank.Latency }),
			}}
	}
	return out
}

// StorageTarget measures kiroku's storage API on any backend. DB is a
// storage.Backend for the bank; a Store without transactions is measured
// without it.
type StorageTarget struct {
	DB    storage.Store
	Label string
	ns    string
}

func (s *StorageTarget) Name() string { return s.Label }

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *StorageTarget) Setup(ctx context.Context, accounts int) error {
	s.ns = randomName("bench_")
	if err := s.DB.CreateNamespace(ctx, s.ns); err != nil {
		return err
	}
	if err := s.DB.CreateTable(ctx, &storage.Table{Namespace: s.ns, Name: "kv",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBlob}}}); err != nil {
		return err
	}
	if err := s.DB.CreateTable(ctx, &storage.Table{Namespace: s.ns, Name: "accounts",
		PartitionKey: []storage.Column{{Name: "id", Type: storage.TypeBigInt}},
		Columns:      []storage.Column{{Name: "balance", Type: storage.TypeBigInt}}}); err != nil {
		return err
	}
	if _, ok := s.DB.(storage.Backend); !ok {
		return nil // no bank
	}
	for i := 0; i < accounts; i++ {
		if err := s.DB.Put(ctx, &storage.Put{Namespace: s.ns, Table: "accounts",
			Partition: storage.Values{"id": storage.BigInt(int64(i))}, Values: storage.Values{"balance": storage.BigInt(1000)}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *StorageTarget) Put(ctx context.Context, key int64, value []byte) error {
	return s.DB.Put(ctx, &storage.Put{Namespace: s.ns, Table: "kv", Partition: storage.Values{"k": storage.BigInt(key)},
		Values: storage.Values{"v": storage.Blob(value)}})
}

func (s *StorageTarget) CondPut(ctx context.Context, key int64, old, value []byte) error {
	return s.DB.Put(ctx, &storage.Put{Namespace: s.ns, Table: "kv", Partition: storage.Values{"k": storage.BigInt(key)},
		Values: storage.Values{"v": storage.Blob(value)}, Condition: storage.If(storage.Eq("v", storage.Blob(old)))})
}

func (s *StorageTarget) Get(ctx context.Context, key int64) error {
	_, ok, err := s.DB.Get(ctx, &storage.Get{Namespace: s.ns, Table: "kv", Partition: storage.Values{"k": storage.BigInt(key)}})
	if err == nil && !ok {
		err = fmt.Errorf("key %d missing", key)
	}
	return err
}

// transferPolicy is how the bank transfers of both targets retry.
var transferPolicy = storage.RetryPolicy{MaxAttempts: 1000}

func (s *StorageTarget) Transfer(ctx context.Context, from, to, amount int64) (int, error) {
	db, ok := s.DB.(storage.Backend)
	if !ok {
		return 0, ErrNoTransactions
	}
	attempts := 0
	err := storage.UpdateWith(ctx, db, transferPolicy, func(tx storage.Txn) error {
		attempts++
		acct := func(id int64) storage.Values { return storage.Values{"id": storage.BigInt(id)} }
		a, _, err := tx.Get(ctx, &storage.Get{Namespace: s.ns, Table: "accounts", Partition: acct(from)})
		if err != nil {
			return err
		}
		b, _, err := tx.Get(ctx, &storage.Get{Namespace: s.ns, Table: "accounts", Partition: acct(to)})
		if err != nil {
			return err
		}
		if a["balance"].AsBigInt() < amount {
			return nil
		}
		if err := tx.Put(ctx, &storage.Put{Namespace: s.ns, Table: "accounts", Partition: acct(from),
			Values: storage.Values{"balance": storage.BigInt(a["balance"].AsBigInt() - amount)}}); err != nil {
			return err
		}
		return tx.Put(ctx, &storage.Put{Namespace: s.ns, Table: "accounts", Partition: acct(to),
			Values: storage.Values{"balance": storage.BigInt(b["balance"].AsBigInt() + amount)}})
	})
	return attempts - 1, err
}

func (s *StorageTarget) Total(ctx context.Context) (int64, error) {
	db, ok := s.DB.(storage.Backend)
	if !ok {
		return 0, ErrNoTransactions
	}
	var total int64
	err := storage.Update(ctx, db, func(tx storage.Txn) error {
		total = 0
		// accounts is partitioned by id: read every partition.
		for i := int64(0); ; i++ {
			row, ok, err := tx.Get(ctx, &storage.Get{Namespace: s.ns, Table: "accounts", Partition: storage.Values{"id": storage.BigInt(i)}})
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
			total += row["balance"].AsBigInt()
		}
	})
	return total, err
}

func (s *StorageTarget) Teardown(ctx context.Context) error {
	for _, t := range []string{"kv", "accounts"} {
		_ = s.DB.DropTable(ctx, s.ns, t)
	}
	return s.DB.DropNamespace(ctx, s.ns)
}
