package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"
)

// InterleavedResult compares the engine with its log and without it, run
// in alternating slices of one invocation (RunEngineInterleaved).
type InterleavedResult struct {
	SliceSeconds float64 `json:"slice_seconds"`
	// WAL and None pool their mode's slices: their seconds, commits,
	// aborts and CPU time. Latencies are not measured.
	WAL  EngineResult `json:"wal"`
	None EngineResult `json:"none"`
	// Cost is 1 − WAL.TxnPerSec/None.TxnPerSec.
	Cost float64 `json:"cost"`
	// PairCosts is the cost of each pair of adjacent slices, one of each
	// mode, in run order.
	PairCosts []float64 `json:"pair_costs"`
	// Extended is the seconds that wal slices ran past their length for a
	// checkpoint to end, included in WAL.Seconds.
	Extended float64       `json:"extended_seconds"`
	Slices   []SliceResult `json:"slices"`
}

// SliceResult is one slice of an interleaved run.
type SliceResult struct {
	Log       string  `json:"log"`
	Seconds   float64 `json:"seconds"`
	Committed int64   `json:"committed"`
	Aborted   int64   `json:"aborted"`
	CPUMicros float64 `json:"cpu_us_per_txn"`
}

// RunEngineInterleaved loads two engines, one with the write-ahead log and
// one without (cfg.Log is ignored), and runs cfg.Threads workers on them
// in turn, slice by slice, until each has run for cfg.Duration: wal,
// none, none, wal, wal, none and so on, so that a drift in the machine's
// speed weighs on both modes alike. On a shared virtual machine the
// workload's speed moves by a third from one ten-second window to the
// next, as other tenants come and go; runs of each mode one after the
// other compare two such windows, while slices of a second compare
// neighbouring seconds.
//
// Nothing of one engine runs in the other's slices:
//   - a wal slice runs past its length while a checkpoint is being
//     written or is due, and the time is counted (Extended);
//   - after a wal slice its last epoch is made durable before the next
//     slice starts; that wait is not counted, as it is mostly the
//     epoch's timer, but a checkpoint the final write makes due is
//     waited for and counted;
//   - checkpoints start by log size alone (CheckpointLogSize), not by
//     CheckpointInterval, as in a sequential run shorter than a minute;
//   - the garbage of both loads is collected before the first slice, and
//     neither workload allocates enough to start a collection.
func RunEngineInterleaved(ctx context.Context, cfg EngineConfig, slice time.Duration) (InterleavedResult, error) {
	res := InterleavedResult{SliceSeconds: slice.Seconds()}
	cfg.Log = "wal"
	if err := cfg.validate(); err != nil {
		return res, err
	}
	switch {
	case cfg.SyncClients > 0 || cfg.Recovery || cfg.DiskLoad != nil:
		return res, errors.New("an interleaved run takes workers only: no sync clients, recovery or disk load")
	case slice <= 0 || slice > cfg.Duration:
		return res, fmt.Errorf("slice %v must be positive and at most the duration %v", slice, cfg.Duration)
	}
	var lds [2]*loaded // wal, none
	defer func() {
		for _, ld := range lds {
			if ld != nil {
				ld.db.Close()
			}
		}
	}()
	for i, mode := range []string{"wal", "none"} {
		c := cfg
		c.Log = mode
		dir, err := os.MkdirTemp(cfg.Dir, "kiroku-bench-engine-*")
		if err != nil {
			return res, err
		}
		defer os.RemoveAll(dir)
		ecfg := engineConfig(c, dir)
		ecfg.CheckpointInterval = 24 * time.Hour
		if lds[i], err = loadEngine(ctx, c, ecfg); err != nil {
			return res, fmt.Errorf("bench engine (log=%s): %w", mode, err)
		}
	}
	cpuClock := CPUClock()
	n := int((cfg.Duration + slice - 1) / slice) // slices per mode
	n = (n + 1) &^ 1                             // whole wal-none-none-wal blocks
	for i := range 2 * n {
		mode := (i + 1) / 2 % 2 // 0 wal, 1 none
		if mode == 1 && lds[0].db.CheckpointBusy() {
			return res, errors.New("bench engine: a checkpoint of the wal engine is busy as a none slice starts")
		}
		s, err := lds[mode].runSlice(ctx, slice, cpuClock)
		if err != nil {
			return res, fmt.Errorf("bench engine (log=%s): %w", lds[mode].cfg.Log, err)
		}
		if mode == 1 && lds[0].db.CheckpointBusy() {
			return res, errors.New("bench engine: a checkpoint of the wal engine began in a none slice")
		}
		res.Slices = append(res.Slices, s.SliceResult)
		res.Extended += s.extended
	}
	res.WAL = pool(cfg, "wal", res.Slices, lds[0].loadSeconds)
	res.None = pool(cfg, "none", res.Slices, lds[1].loadSeconds)
	if res.None.TxnPerSec > 0 {
		res.Cost = 1 - res.WAL.TxnPerSec/res.None.TxnPerSec
	}
	for i := 0; i+1 < len(res.Slices); i += 2 {
		a, b := res.Slices[i], res.Slices[i+1]
		if a.Log != "wal" {
			a, b = b, a
		}
		if b.Committed > 0 && a.Seconds > 0 {
			res.PairCosts = append(res.PairCosts, 1-(float64(a.Committed)/a.Seconds)/(float64(b.Committed)/b.Seconds))
		}
	}
	return res, nil
}

// MedianCost is the median of the pairs' costs.
func (r InterleavedResult) MedianCost() float64 {
	if len(r.PairCosts) == 0 {
		return 0
	}
	c := slices.Clone(r.PairCosts)
	slices.Sort(c)
	return (c[(len(c)-1)/2] + c[len(c)/2]) / 2
}

// pool sums mode's slices into one result.
func pool(cfg EngineConfig, mode string, ss []SliceResult, loadSeconds float64) EngineResult {
	r := EngineResult{Workload: cfg.Workload, Log: mode, Threads: cfg.Threads, LoadSeconds: loadSeconds}
	var cpu float64
	for _, s := range ss {
		if s.Log != mode {
			continue
		}
		r.Seconds += s.Seconds
		r.Committed += s.Committed
		r.Aborted += s.Aborted
		cpu += s.CPUMicros * float64(s.Committed)
	}
	if r.Seconds > 0 {
		r.TxnPerSec = float64(r.Committed) / r.Seconds
	}
	if n := r.Committed + r.Aborted; n > 0 {
		r.AbortRate = float64(r.Aborted) / float64(n)
	}
	if r.Committed > 0 {
		r.CPUMicros = cpu / float64(r.Committed)
	}
	r.DiskWriteRate = -1
	return r
}

type sliceRun struct {
	SliceResult
	extended float64
}

// runSlice runs the workload's workers on ld's engine for length, longer
// while a checkpoint is busy, and then waits for the engine to be quiet:
// its last epoch durable and no checkpoint busy.
func (ld *loaded) runSlice(ctx context.Context, length time.Duration, cpuClock func() (time.Duration, error)) (sliceRun, error) {
	db, cfg := ld.db, &ld.cfg
	type tally struct {
		committed, aborted int64
		last               uint64 // the last commit's epoch
	}
	var (
		h       halt
		tallies = make([]tally, cfg.Threads) // each worker's own
		wg      sync.WaitGroup
	)
	fail := h.fail
	out := sliceRun{SliceResult: SliceResult{Log: cfg.Log}}
	cpu0, err := cpuClock()
	if err != nil {
		return out, err
	}
	start := time.Now()
	for w := range cfg.Threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			tx := db.BeginRaw()
			if err := tx.Pin(ctx); err != nil {
				fail(err)
				return
			}
			defer tx.Unpin()
			var kr keyer
			var t tally
			for !h.stopped.Load() {
				e, ok, err := ld.one(ctx, tx, r, &kr)
				switch {
				case err != nil:
					fail(err)
				case ok:
					t.committed++
					t.last = max(t.last, e)
				default:
					t.aborted++
				}
			}
			tallies[w] = t
		}()
	}
	wait := func(d time.Duration) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			fail(ctx.Err())
		}
	}
	wait(length)
	for !h.stopped.Load() && db.CheckpointBusy() {
		wait(2 * time.Millisecond)
	}
	h.stopped.Store(true)
	wg.Wait()
	end := time.Now()
	cpu1, err := cpuClock()
	if err != nil {
		return out, err
	}
	if err := h.first(); err != nil {
		return out, err
	}
	var last uint64
	for _, t := range tallies {
		out.Committed += t.committed
		out.Aborted += t.aborted
		last = max(last, t.last)
	}
	took, cpu := end.Sub(start), cpu1-cpu0
	if cfg.Log == "wal" {
		if err := db.WaitDurable(ctx, last); err != nil {
			return out, err
		}
		if db.CheckpointBusy() {
			// The last write made one due.
			began := time.Now()
			cpuB, err := cpuClock()
			if err != nil {
				return out, err
			}
			for db.CheckpointBusy() && ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
			}
			cpuE, err := cpuClock()
			if err != nil {
				return out, err
			}
			took += time.Since(began)
			cpu += cpuE - cpuB
		}
	}
	out.extended = max(0, took-length).Seconds()
	out.Seconds = took.Seconds()
	if out.Committed > 0 {
		out.CPUMicros = float64(cpu.Microseconds()) / float64(out.Committed)
	}
	return out, ctx.Err()
}
