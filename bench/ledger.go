package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/storage/cassandra"
)

// LedgerConfig configures the ledger benchmark (seed 000's YCSB runs).
type LedgerConfig struct {
	Workload  string        // "ycsb-c" (read 2 assets) or "ycsb-f" (read one, write it back)
	Records   int           // assets y0 … y(Records−1)
	Payload   int           // bytes of payload per asset value
	Threads   []int         // client goroutines, one measurement per entry
	Warmup    time.Duration // per thread count, not measured
	Duration  time.Duration // measured, per thread count
	LoadBatch int           // assets per bulk-load transaction; 0 = 200
	Loaders   int           // concurrent bulk-load requests; 0 = 4
	Seed      uint64
	// Rounds, when the executor is a Validator, is how many times the
	// logged and the unlogged runs alternate at each thread count: on then
	// off in even rounds, off then on in odd ones, so that neither always
	// runs first after the warmup (nor last, after the other's history
	// has grown). A point reports each mode's median round. 0 means 1.
	Rounds int
	// CPU, if set, is the clock of the CPU time that serving the calls
	// costs (CPUClock); each point then reports CPU time per call and how
	// many CPUs that kept busy.
	CPU func() (time.Duration, error)
	// ServerCPU, if set, is the clock of the server's share of CPU (a
	// server in a process of its own); each point then also reports how
	// many CPUs the server kept busy, and the clients' share is the rest.
	ServerCPU func() (time.Duration, error)
	// Machine, if set, is the clock of the whole machine's CPU time
	// (MachineCPU); each point then also reports how many of its CPUs every
	// process together kept busy, the run's own and any other (a Validator
	// database's server among them).
	Machine func() (time.Duration, int, error)
	// Store, if set, reads the requests the server's store has sent to
	// its database (Cassandra's Stats); each point then reports them per
	// committed transaction.
	Store func() cassandra.Stats
}

func (c *LedgerConfig) validate() error {
	if c.Workload != "ycsb-c" && c.Workload != "ycsb-f" {
		return fmt.Errorf("bench: unknown ledger workload %q (ycsb-c or ycsb-f)", c.Workload)
	}
	if c.LoadBatch == 0 {
		c.LoadBatch = 200
	}
	if c.Loaders == 0 {
		c.Loaders = 4
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.Records < 2 || c.Payload < 0 || len(c.Threads) == 0 || c.Duration <= 0 || c.Warmup < 0 || c.LoadBatch < 1 || c.Loaders < 1 || c.Rounds < 1 {
		return errors.New("bench: ledger needs ≥ 2 records, thread counts, a positive duration, at least one round")
	}
	for _, t := range c.Threads {
		if t < 1 {
			return fmt.Errorf("bench: thread count %d", t)
		}
	}
	return nil
}

// Executor runs a contract: the SDK's client, or a Validator logging
// through it.
type Executor interface {
	Execute(ctx context.Context, contractID string, argument []byte) (*ledger.Result, error)
}

// LedgerPoint is one thread count's figures.
type LedgerPoint struct {
	Threads int   `json:"threads"`
	Txs     int64 `json:"committed"`
	Errors  int64 `json:"errors"`
	// FirstError is the first failed call's error, when Errors > 0.
	FirstError string  `json:"first_error,omitempty"`
	TPS        float64 `json:"tx_per_s"`
	Latency    Latency `json:"latency"`
	// Off is the same workload and threads through the bare client, in
	// the same run, when the measured executor is a Validator.
	Off *LedgerPoint `json:"validator_off,omitempty"`
	// RoundsTPS is every round's tx/s, in the order run, when there was
	// more than one (LedgerConfig.Rounds); the point is the median one.
	RoundsTPS []float64 `json:"rounds_tx_per_s,omitempty"`
	// FloorRPS is the baseline: GetTxState calls/s through the same server
	// and client with the same threads — one authenticated-free round trip
	// with one storage read, the most this path can carry.
	FloorRPS float64 `json:"floor_rpc_per_s"`
	// CPUMicros is CPU time per call, in µs, when LedgerConfig.CPU is set:
	// clients, server and Validator together, whichever the clock covers.
	CPUMicros float64 `json:"cpu_us_per_tx,omitempty"`
	// CPUsBusy is the CPU time of the run over its wall time, when
	// LedgerConfig.CPU is set: how many CPUs the run kept busy. A run
	// short of the CPUs it may use was held back by waits (its durable
	// commits, the round trips), not by CPU.
	CPUsBusy float64 `json:"cpus_busy,omitempty"`
	// ServerCPUsBusy is the server's part of CPUsBusy, when
	// LedgerConfig.ServerCPU is set.
	ServerCPUsBusy float64 `json:"server_cpus_busy,omitempty"`
	// MachineCPUsBusy is how many of the machine's MachineCPUs every
	// process kept busy during the run, when LedgerConfig.Machine is set.
	MachineCPUsBusy float64 `json:"machine_cpus_busy,omitempty"`
	MachineCPUs     int     `json:"machine_cpus,omitempty"`
	// Store is what the store sent its database per committed
	// transaction, on average, when LedgerConfig.Store is set: the
	// conflicts' and retries' requests are counted too.
	Store *StorePerTx `json:"store_per_tx,omitempty"`
}

// StorePerTx is a store's requests per committed transaction.
type StorePerTx struct {
	Requests    float64 `json:"requests"`     // round trips to the database
	CondWrites  float64 `json:"cond_writes"`  // lightweight transactions (Paxos rounds)
	SerialReads float64 `json:"serial_reads"` // SERIAL reads (Paxos reads)
	Reads       float64 `json:"reads"`        // other reads
}

// LedgerLoad is how the database was loaded.
type LedgerLoad struct {
	Records int     `json:"records"`
	Seconds float64 `json:"seconds"`
	Skipped bool    `json:"skipped"` // already loaded
}

// assetID is the id of asset i of records: "y" and i, zero-padded to the
// digits of records−1, so that ids sort as their numbers do.
func assetID(i, records int) string { return fmt.Sprintf("y%0*d", idWidth(records), i) }

func idWidth(records int) int { return len(strconv.Itoa(records - 1)) }

// LoadLedger creates assets y0 … y(records−1) (numbers zero-padded, see
// assetID) with the built-in bulk loader, unless the last one exists
// already. progress, if not nil, gets a
// progress bar.
func LoadLedger(ctx context.Context, c *client.Client, exec Executor, cfg LedgerConfig, progress io.Writer) (LedgerLoad, error) {
	if err := cfg.validate(); err != nil {
		return LedgerLoad{}, err
	}
	if h, err := c.History(ctx, assetID(cfg.Records-1, cfg.Records), ledger.ScanRange{End: -1, Limit: 1}); err == nil && len(h) > 0 {
		return LedgerLoad{Records: cfg.Records, Skipped: true}, nil
	}
	start := time.Now()
	payload := randomPayload(mrand.New(mrand.NewPCG(cfg.Seed, 1)), cfg.Payload)
	var done atomic.Int64
	var failed atomic.Bool
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	stop, barDone := make(chan struct{}), make(chan struct{})
	go func() { // progress bar
		defer close(barDone)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				drawBar(progress, int(done.Load()), cfg.Records, time.Since(start))
				if progress != nil {
					fmt.Fprintln(progress)
				}
				return
			case <-t.C:
				drawBar(progress, int(done.Load()), cfg.Records, time.Since(start))
			}
		}
	}()
	// Each loader fills a region of ids of its own, in order, so that
	// concurrent bulk transactions create assets far apart in id order. On
	// PostgreSQL, reading an absent row takes a serializable predicate lock
	// on the index page where it would be: loaders that took consecutive
	// batches created neighbouring ids, and each batch conflicted with the
	// next one's, until retries ran out.
	per := (cfg.Records + cfg.Loaders - 1) / cfg.Loaders
	for l := range cfg.Loaders {
		lo, hi := l*per, min((l+1)*per, cfg.Records)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := lo; first < hi && !failed.Load(); first += cfg.LoadBatch {
				n := min(cfg.LoadBatch, hi-first)
				arg := fmt.Sprintf(`{"prefix":"y","first":%d,"count":%d,"payload":%q,"width":%d}`, first, n, payload, idWidth(cfg.Records))
				if _, err := exec.Execute(ctx, "builtin.bulk_load", []byte(arg)); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("bench: bulk load at %d: %w", first, err) })
					failed.Store(true)
					return
				}
				done.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-barDone
	return LedgerLoad{Records: cfg.Records, Seconds: time.Since(start).Seconds()}, firstErr
}

func drawBar(w io.Writer, done, total int, el time.Duration) {
	if w == nil {
		return
	}
	const width = 40
	filled := done * width / total
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = '.'
		if i < filled {
			bar[i] = '#'
		}
	}
	rate := float64(done) / el.Seconds()
	fmt.Fprintf(w, "\rloading [%s] %3d%% %d/%d assets, %.0f/s, %s", bar, done*100/total, done, total, rate, el.Round(time.Second))
}

func randomPayload(r *mrand.Rand, n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// RunLedger measures cfg.Workload through exec at each thread count, each
// preceded by its warmup and followed by the floor baseline for the same
// threads. If exec is not c itself (a Validator), the same workload also
// runs through c alone, for the comparison in Off, in cfg.Rounds
// alternating rounds.
func RunLedger(ctx context.Context, c *client.Client, exec Executor, cfg LedgerConfig, progress func(LedgerPoint)) ([]LedgerPoint, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var out []LedgerPoint
	for i, threads := range cfg.Threads {
		if cfg.Warmup > 0 {
			if _, err := runLedgerLoop(ctx, c, exec, cfg, threads, cfg.Warmup, uint64(i)*1000+1, false); err != nil {
				return out, err
			}
		}
		var p LedgerPoint
		if exec == Executor(c) {
			var err error
			if p, err = runLedgerLoop(ctx, c, exec, cfg, threads, cfg.Duration, uint64(i)*1000+2, false); err != nil {
				return out, err
			}
		} else {
			var on, off []LedgerPoint
			for r := range cfg.Rounds {
				for k := range 2 {
					logged := k == r%2 // on first in even rounds
					run, seed := exec, uint64(i)*1000+uint64(r)*10+2
					if !logged {
						run, seed = c, seed+2
					}
					q, err := runLedgerLoop(ctx, c, run, cfg, threads, cfg.Duration, seed, false)
					if err != nil {
						return out, err
					}
					if logged {
						on = append(on, q)
					} else {
						off = append(off, q)
					}
				}
			}
			p = medianPoint(on)
			offMedian := medianPoint(off)
			p.Off = &offMedian
		}
		floor, err := runLedgerLoop(ctx, c, c, cfg, threads, min(cfg.Duration, 3*time.Second), uint64(i)*1000+3, true)
		if err != nil {
			return out, err
		}
		p.FloorRPS = floor.TPS
		out = append(out, p)
		if progress != nil {
			progress(p)
		}
	}
	return out, nil
}

// medianPoint is the point of median tx/s (the lower of the middle two
// for an even count), with every round's tx/s in RoundsTPS if there was
// more than one.
func medianPoint(ps []LedgerPoint) LedgerPoint {
	sorted := slices.SortedFunc(slices.Values(ps), func(a, b LedgerPoint) int { return cmp.Compare(a.TPS, b.TPS) })
	m := sorted[(len(sorted)-1)/2]
	if len(ps) > 1 {
		for _, q := range ps {
			m.RoundsTPS = append(m.RoundsTPS, q.TPS)
		}
	}
	return m
}

// runLedgerLoop runs threads closed-loop clients for d. With floor, each
// call is a GetTxState instead of an execute.
func runLedgerLoop(ctx context.Context, c *client.Client, exec Executor, cfg LedgerConfig, threads int, d time.Duration, seed uint64, floor bool) (LedgerPoint, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return ledgerLoop(ctx, c, exec, cfg, threads, 0, seed, floor)
}

// RunLedgerCount runs exactly n transactions of cfg.Workload through exec
// with threads closed-loop clients, with no time limit: a history of a
// given size, for instance for the Validator to validate.
func RunLedgerCount(ctx context.Context, c *client.Client, exec Executor, cfg LedgerConfig, threads int, n int64) (LedgerPoint, error) {
	if err := cfg.validate(); err != nil {
		return LedgerPoint{}, err
	}
	if threads < 1 || n < 1 {
		return LedgerPoint{}, fmt.Errorf("bench: %d threads, %d transactions", threads, n)
	}
	return ledgerLoop(ctx, c, exec, cfg, threads, n, 5, false)
}

// ledgerLoop runs threads closed-loop clients until ctx ends or, with
// limit > 0, limit calls have been issued. A failing call does not stop
// the others unless every call fails.
func ledgerLoop(ctx context.Context, c *client.Client, exec Executor, cfg LedgerConfig, threads int, limit int64, seed uint64, floor bool) (LedgerPoint, error) {
	var issued atomic.Int64
	hist := newHist()
	var mu sync.Mutex
	var txs, errs atomic.Int64
	var fatal error
	var wg sync.WaitGroup
	cpu0, err := readClocks(cfg.CPU, cfg.ServerCPU)
	if err != nil {
		return LedgerPoint{}, err
	}
	var store0 cassandra.Stats
	if cfg.Store != nil {
		store0 = cfg.Store()
	}
	var machine0 time.Duration
	if cfg.Machine != nil {
		if machine0, _, err = cfg.Machine(); err != nil {
			return LedgerPoint{}, err
		}
	}
	start := time.Now()
	for t := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(cfg.Seed+seed, uint64(t)))
			h := newHist()
			defer func() { mu.Lock(); hist.Merge(h); mu.Unlock() }()
			for ctx.Err() == nil && (limit == 0 || issued.Add(1) <= limit) {
				var err error
				var contract, arg string
				switch {
				case floor:
					arg = fmt.Sprintf("floor-%d", r.IntN(cfg.Records))
				case cfg.Workload == "ycsb-c":
					contract = "builtin.ycsb_c"
					arg = fmt.Sprintf(`{"ids":[%q,%q]}`, assetID(r.IntN(cfg.Records), cfg.Records), assetID(r.IntN(cfg.Records), cfg.Records))
				default:
					contract = "builtin.ycsb_f"
					arg = fmt.Sprintf(`{"id":%q,"payload":%q}`, assetID(r.IntN(cfg.Records), cfg.Records), randomPayload(r, cfg.Payload))
				}
				began := time.Now() // the request is built: time the call alone
				if floor {
					_, err = c.TxState(ctx, arg)
				} else {
					_, err = exec.Execute(ctx, contract, []byte(arg))
				}
				if ctx.Err() != nil {
					return // the run ended mid-call; not counted
				}
				if err != nil {
					if errs.Add(1) == 1 {
						mu.Lock()
						fatal = err
						mu.Unlock()
					}
					continue
				}
				_ = h.RecordValue(time.Since(began).Microseconds())
				txs.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if txs.Load() == 0 && fatal != nil {
		return LedgerPoint{}, fmt.Errorf("bench: every call failed; the first: %w", fatal)
	}
	p := LedgerPoint{Threads: threads, Txs: txs.Load(), Errors: errs.Load(), TPS: float64(txs.Load()) / el.Seconds(),
		Latency: latencyOf(hist)}
	if fatal != nil {
		p.FirstError = fatal.Error()
	}
	if cfg.CPU != nil && p.Txs > 0 {
		cpu1, err := readClocks(cfg.CPU, cfg.ServerCPU)
		if err != nil {
			return LedgerPoint{}, err
		}
		p.CPUMicros = float64((cpu1[0] - cpu0[0]).Microseconds()) / float64(p.Txs)
		p.CPUsBusy = (cpu1[0] - cpu0[0]).Seconds() / el.Seconds()
		if cfg.ServerCPU != nil {
			p.ServerCPUsBusy = (cpu1[1] - cpu0[1]).Seconds() / el.Seconds()
		}
	}
	if cfg.Store != nil && p.Txs > 0 {
		d, n := cfg.Store().Sub(store0), float64(p.Txs)
		p.Store = &StorePerTx{Requests: float64(d.Requests) / n, CondWrites: float64(d.CondWrites) / n,
			SerialReads: float64(d.SerialReads) / n, Reads: float64(d.Reads) / n}
	}
	if cfg.Machine != nil {
		machine1, cpus, err := cfg.Machine()
		if err != nil {
			return LedgerPoint{}, err
		}
		p.MachineCPUsBusy, p.MachineCPUs = (machine1-machine0).Seconds()/el.Seconds(), cpus
	}
	return p, nil
}

// readClocks reads the CPU clocks that are set; an unset one reads 0.
func readClocks(clocks ...func() (time.Duration, error)) ([]time.Duration, error) {
	ts := make([]time.Duration, len(clocks))
	for i, c := range clocks {
		if c == nil {
			continue
		}
		var err error
		if ts[i], err = c(); err != nil {
			return nil, err
		}
	}
	return ts, nil
}
