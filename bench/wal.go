package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/wal"
)

// WALConfig configures one run of the WAL benchmark.
type WALConfig struct {
	Mode        string        // batch, group, count, periodic or raw
	Window      time.Duration // group window; count max wait; periodic interval
	Count       int           // count threshold; records per fdatasync for raw
	Rate        float64       // appends/s offered (open loop); 0 = closed loop
	Writers     int           // appending goroutines
	RecordSize  int           // payload bytes
	Duration    time.Duration // measured time
	Dir         string        // where the log lives (a fresh subdirectory is used)
	SyncDelay   time.Duration // added to every fsync (emulated slow device); 0 = none
	SegmentSize int64         // 0 = the log's default
}

// WALResult is one run's figures.
type WALResult struct {
	Mode            string  `json:"mode"`
	Policy          string  `json:"policy"`
	OfferedRate     float64 `json:"offered_per_s"` // 0: closed loop
	Writers         int     `json:"writers"`
	RecordSize      int     `json:"record_size"`
	SyncDelayMicros int64   `json:"sync_delay_us"`
	Seconds         float64 `json:"seconds"`
	Appends         int64   `json:"appends"`
	AppendsPerSec   float64 `json:"appends_per_s"`
	Fsyncs          uint64  `json:"fsyncs"`
	FsyncsPerSec    float64 `json:"fsyncs_per_s"`
	RecordsPerFsync float64 `json:"records_per_fsync"`
	MeanMicros      float64 `json:"latency_mean_us"`
	P50Micros       int64   `json:"latency_p50_us"`
	P99Micros       int64   `json:"latency_p99_us"`
	P999Micros      int64   `json:"latency_p999_us"`
	MaxMicros       int64   `json:"latency_max_us"`
}

func (c *WALConfig) policy() (wal.Policy, error) {
	switch c.Mode {
	case "batch":
		return wal.BatchPolicy(), nil
	case "group":
		return wal.GroupPolicy(c.Window), nil
	case "count":
		return wal.CountPolicy(c.Count, c.Window), nil
	case "periodic":
		return wal.PeriodicPolicy(c.Window), nil
	}
	return wal.Policy{}, fmt.Errorf("bench wal: unknown mode %q (batch, group, count, periodic, raw)", c.Mode)
}

func (c *WALConfig) fs() vfs.FS {
	if c.SyncDelay > 0 {
		return wal.DelaySyncFS(vfs.Default, c.SyncDelay)
	}
	return vfs.Default
}

func (c *WALConfig) validate() error {
	if c.Writers <= 0 || c.RecordSize < 0 || c.Duration <= 0 || c.Rate < 0 || c.Count <= 0 {
		return fmt.Errorf("bench wal: writers, duration and count must be > 0; rate and record size >= 0")
	}
	if c.Mode == "raw" && c.Rate > 0 {
		return fmt.Errorf("bench wal: raw is one closed-loop writer; --rate does not apply to it")
	}
	return nil
}

func latencyInto(r *WALResult, h *hdrhistogram.Histogram) {
	r.MeanMicros, r.P50Micros, r.P99Micros = h.Mean(), h.ValueAtQuantile(50), h.ValueAtQuantile(99)
	r.P999Micros, r.MaxMicros = h.ValueAtQuantile(99.9), h.Max()
}

// RunWAL measures the log under one policy.
func RunWAL(ctx context.Context, cfg WALConfig) (WALResult, error) {
	if err := cfg.validate(); err != nil {
		return WALResult{}, err
	}
	if cfg.Mode == "raw" {
		return RunRaw(ctx, cfg)
	}
	p, err := cfg.policy()
	if err != nil {
		return WALResult{}, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "kiroku-bench-wal-")
	if err != nil {
		return WALResult{}, err
	}
	defer os.RemoveAll(dir)
	l, err := wal.Open(wal.Config{Dir: dir, FS: cfg.fs(), Policy: p, SegmentSize: cfg.SegmentSize})
	if err != nil {
		return WALResult{}, err
	}
	payload := make([]byte, cfg.RecordSize)
	for i := range payload {
		payload[i] = byte(i)
	}
	var appends atomic.Int64
	var mu sync.Mutex
	h := newHist()
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	before := l.Stats()
	end := start.Add(cfg.Duration)
	for w := 0; w < cfg.Writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := newHist()
			defer func() { mu.Lock(); h.Merge(local); mu.Unlock() }()
			// Open loop: writer w's k-th append is due at start + (w + k·W)/R.
			// When the log made the writer late (its previous append ended
			// after this one was due), latency counts from when it was due,
			// so queueing is not hidden; when only the writer's own sleep
			// overshot (Go timers can be a millisecond late), from when it
			// was sent.
			var interval time.Duration
			next := start
			if cfg.Rate > 0 {
				interval = time.Duration(float64(cfg.Writers) / cfg.Rate * float64(time.Second))
				next = start.Add(time.Duration(float64(w) / cfg.Rate * float64(time.Second)))
			}
			for ctx.Err() == nil {
				now := time.Now()
				from := next
				if cfg.Rate > 0 {
					if next.After(end) {
						return
					}
					if d := next.Sub(now); d > 0 {
						time.Sleep(d)
						from = time.Now()
					}
				} else if now.After(end) {
					return
				} else {
					next, from = now, now
				}
				if _, err := l.Append(ctx, payload); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				_ = local.RecordValue(max(1, time.Since(from).Microseconds()))
				appends.Add(1)
				next = next.Add(interval)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after := l.Stats()
	if err := l.Close(); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		return WALResult{}, firstErr
	}
	r := WALResult{Mode: cfg.Mode, Policy: p.String(), OfferedRate: cfg.Rate, Writers: cfg.Writers, RecordSize: cfg.RecordSize,
		SyncDelayMicros: cfg.SyncDelay.Microseconds(), Seconds: elapsed.Seconds(), Appends: appends.Load(),
		Fsyncs: after.Syncs - before.Syncs}
	r.AppendsPerSec = float64(r.Appends) / r.Seconds
	r.FsyncsPerSec = float64(r.Fsyncs) / r.Seconds
	if r.Fsyncs > 0 {
		r.RecordsPerFsync = float64(r.Appends) / float64(r.Fsyncs)
	}
	latencyInto(&r, h)
	return r, nil
}

// RunRaw is the physical reference: one goroutine writes Count records of
// RecordSize bytes to a plain appending file and fdatasyncs, again and
// again, with no framing, no queue and no other goroutine. A record's
// latency runs from its write to the end of the fdatasync that covers it.
func RunRaw(ctx context.Context, cfg WALConfig) (WALResult, error) {
	if err := cfg.validate(); err != nil {
		return WALResult{}, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "kiroku-bench-raw-")
	if err != nil {
		return WALResult{}, err
	}
	defer os.RemoveAll(dir)
	fs := cfg.fs()
	f, err := fs.Create(filepath.Join(dir, "raw"), vfs.WriteCategoryUnspecified)
	if err != nil {
		return WALResult{}, err
	}
	defer f.Close()
	rec := make([]byte, cfg.RecordSize)
	h := newHist()
	starts := make([]time.Time, cfg.Count)
	var appends int64
	var fsyncs uint64
	start := time.Now()
	end := start.Add(cfg.Duration)
	for time.Now().Before(end) && ctx.Err() == nil {
		for i := 0; i < cfg.Count; i++ {
			starts[i] = time.Now()
			if _, err := f.Write(rec); err != nil {
				return WALResult{}, err
			}
		}
		if err := f.SyncData(); err != nil {
			return WALResult{}, err
		}
		fsyncs++
		done := time.Now()
		for i := 0; i < cfg.Count; i++ {
			_ = h.RecordValue(max(1, done.Sub(starts[i]).Microseconds()))
		}
		appends += int64(cfg.Count)
	}
	elapsed := time.Since(start)
	r := WALResult{Mode: "raw", Policy: fmt.Sprintf("raw(%d records per fdatasync)", cfg.Count), Writers: 1,
		RecordSize: cfg.RecordSize, SyncDelayMicros: cfg.SyncDelay.Microseconds(), Seconds: elapsed.Seconds(),
		Appends: appends, Fsyncs: fsyncs}
	r.AppendsPerSec = float64(appends) / r.Seconds
	r.FsyncsPerSec = float64(fsyncs) / r.Seconds
	r.RecordsPerFsync = float64(cfg.Count)
	latencyInto(&r, h)
	return r, nil
}
