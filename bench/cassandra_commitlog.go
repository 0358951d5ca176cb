package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// This file is the pure core of the Cassandra commit-log benchmark (seed
// 003's experiment): the open-loop schedule, what each request writes, the
// accounting of one point and the figures derived from it, and the parsing
// of the sync counters' output. It owns no clock, no goroutine and no I/O;
// cassandra_cluster.go drives it against a real Cassandra.

// CommitLogConfig configures `kiroku bench cassandra-commitlog`.
type CommitLogConfig struct {
	// Modes are the commit-log modes, as scripts/cassandra.sh's --commitlog
	// takes them: "batch" or "group:WINDOW" (WINDOW like 2ms). Required.
	// Batch is the baseline: when it is among the modes, every other
	// mode's point is also given as a ratio to batch's at the same rate.
	Modes []string
	// Rates are the offered loads, conditional writes per second, run in
	// ascending order. Required, each > 0.
	Rates []float64
	// Warmup is how long each point runs at its rate before it is
	// measured. 0 means none.
	Warmup time.Duration
	// StartWarmup is how long a freshly started cluster runs at the first
	// rate before its first point (the JVM compiles its hot paths then).
	// 0 means none.
	StartWarmup time.Duration
	// Duration is each point's measured window. Required.
	Duration time.Duration
	// Drain bounds how long requests that were due in the window may
	// still take after it; those still running then count as unfinished
	// (and with the drain's end as their latency). 0 means 15 s.
	Drain time.Duration
	// MaxInFlight caps the requests in flight. When it is reached, a due
	// request waits for a slot (and its latency, counted from when it was
	// due, shows the wait). 0 means 4096.
	MaxInFlight int
	// Revisit is how long after it was last written a key is written
	// again: the first write of a key is INSERT ... IF NOT EXISTS, each
	// later one UPDATE ... IF v = (the previous value). A point uses
	// max(1000, rate × Revisit) keys of its own. 0 means 2 s.
	Revisit time.Duration
	// ValueSize is the bytes of payload each write carries. 0 means none.
	ValueSize int
	// StopAtSaturation ends a mode's sweep after its first saturated point
	// (see CommitLogPoint.Saturated).
	StopAtSaturation bool
	// Rounds is how many times the whole sweep runs, the modes in turn and
	// in reverse order every other round, so that drift in the machine's
	// load hits every mode alike. A cell reports each figure's median over
	// the rounds. 0 means 1.
	Rounds int
	// Nodes is the number of Cassandra nodes (scripts/cassandra.sh
	// --nodes); the keyspace's replication factor is min(3, Nodes). 0
	// means 1.
	Nodes int
	// Heap is each node's -Xmx (scripts/cassandra.sh --heap). "" means the
	// script's default.
	Heap string
	// Yaml are extra cassandra.yaml lines (scripts/cassandra.sh --yaml).
	Yaml []string
	// SyncDelay, if positive, delays every msync of the Cassandra JVMs, the
	// commit log's only durability call, by this much (scripts/slowsync.sh):
	// an emulated device whose flush takes that much longer. 0 means none.
	SyncDelay time.Duration
	// Counter is how the commit log's syncs are counted from outside
	// Cassandra: "perf" (perf stat on the syscall tracepoints; in-kernel
	// counters, cheap), "strace" (strace -c -f, which stops every thread at
	// every system call: costly, for cross-checking) or "none". "" means
	// "perf".
	Counter string
	// Script is scripts/cassandra.sh and SlowSyncScript scripts/slowsync.sh.
	// "" means found in the checkout (FindScript).
	Script, SlowSyncScript string
	// StateFile is scripts/cassandra.sh's state file for the clusters this
	// run starts (KIROKU_CASSANDRA_STATE). "" means a fresh temporary one,
	// so that the run neither meets nor stops anyone else's cluster.
	StateFile string
}

// Validate fills defaults and rejects contradictions.
func (c *CommitLogConfig) Validate() error {
	if len(c.Modes) == 0 || len(c.Rates) == 0 {
		return errors.New("bench: cassandra-commitlog needs modes and rates")
	}
	modes := make([]string, 0, len(c.Modes))
	for _, s := range c.Modes {
		m, err := ParseCommitLogMode(s)
		if err != nil {
			return err
		}
		if slices.Contains(modes, m.Flag()) {
			return fmt.Errorf("bench: commit-log mode %s given twice", m.Flag())
		}
		modes = append(modes, m.Flag())
	}
	c.Modes = modes
	for _, r := range c.Rates {
		if !(r > 0) || math.IsInf(r, 0) {
			return fmt.Errorf("bench: rate %v: want a positive number of writes per second", r)
		}
	}
	c.Rates = slices.Clone(c.Rates)
	slices.Sort(c.Rates)
	if c.Drain == 0 {
		c.Drain = 15 * time.Second
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4096
	}
	if c.Revisit == 0 {
		c.Revisit = 2 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	if c.Counter == "" {
		c.Counter = "perf"
	}
	switch {
	case c.Duration <= 0:
		return errors.New("bench: cassandra-commitlog needs a positive duration")
	case c.Warmup < 0 || c.StartWarmup < 0 || c.Drain < 0 || c.Revisit < 0 || c.SyncDelay < 0:
		return errors.New("bench: cassandra-commitlog: negative duration")
	case c.MaxInFlight < 1 || c.ValueSize < 0 || c.Rounds < 1 || c.Nodes < 1 || c.Nodes > 9:
		return errors.New("bench: cassandra-commitlog: max in flight and rounds must be ≥ 1, nodes 1–9, value size ≥ 0")
	case c.Counter != "perf" && c.Counter != "strace" && c.Counter != "none":
		return fmt.Errorf("bench: sync counter %q: want perf, strace or none", c.Counter)
	}
	return nil
}

// CommitLogMode is a commit-log mode: batch (Window 0) or group.
type CommitLogMode struct {
	Group  bool
	Window time.Duration
}

// ParseCommitLogMode reads "batch" or "group:WINDOW" (WINDOW a Go
// duration of whole milliseconds, at least 1ms: cassandra.yaml's unit).
func ParseCommitLogMode(s string) (CommitLogMode, error) {
	if s == "batch" {
		return CommitLogMode{}, nil
	}
	w, ok := strings.CutPrefix(s, "group:")
	if !ok {
		return CommitLogMode{}, fmt.Errorf("bench: commit-log mode %q: want batch or group:WINDOW", s)
	}
	d, err := time.ParseDuration(w)
	if err != nil || d < time.Millisecond || d%time.Millisecond != 0 {
		return CommitLogMode{}, fmt.Errorf("bench: commit-log mode %q: the window must be whole milliseconds, at least 1ms", s)
	}
	return CommitLogMode{Group: true, Window: d}, nil
}

// Flag is the mode as scripts/cassandra.sh's --commitlog takes it.
func (m CommitLogMode) Flag() string {
	if !m.Group {
		return "batch"
	}
	return fmt.Sprintf("group:%dms", m.Window.Milliseconds())
}

// openLoop is an open-loop schedule: request k (from 0) is due at
// start + k/rate, whatever became of the requests before it. Latency is
// counted from when a request was due, so a server that falls behind is
// charged for the queue it causes (no coordinated omission).
type openLoop struct {
	start time.Time
	rate  float64 // requests per second, > 0
}

// due is when request k is due.
func (s openLoop) due(k int64) time.Time {
	return s.start.Add(time.Duration(float64(k) / s.rate * float64(time.Second)))
}

// lwtOp is what request k of a point writes: key Key, for the Round-th
// time. Round 0 is INSERT ... IF NOT EXISTS with v = 0; round r > 0 is
// UPDATE ... SET v = r IF v = r-1, a compare-and-set on the value the
// previous round wrote, as the ledger writes an asset's next version.
type lwtOp struct {
	Key   int64
	Round int64
}

// opFor is request k's write among keys keys numbered from base: the keys
// are written in turn, so each is written again keys requests later.
func opFor(k, keys, base int64) lwtOp {
	return lwtOp{Key: base + k%keys, Round: k / keys}
}

// keysFor is the number of keys of a point at rate: each key is written
// again revisit later, so its previous write has long finished unless the
// server is far behind.
func keysFor(rate float64, revisit time.Duration) int64 {
	return max(1000, int64(math.Ceil(rate*revisit.Seconds())))
}

// outcome is how a request ended.
type outcome int

const (
	applied    outcome = iota // the condition held and the write was made
	notApplied                // the condition did not hold ([applied] = false)
	failed                    // an error (a timeout, an unavailable replica)
)

// pointStats accounts for one point. A request is measured when it was due
// in the window [from, to); its latency runs from when it was due to when it
// ended. Throughput counts the requests that ended in the window, whenever
// they were due.
type pointStats struct {
	from, to time.Time
	latency  *hdrhistogram.Histogram // µs, measured requests that ended
	lag      *hdrhistogram.Histogram // µs from due to sent, measured requests
	measured int64                   // requests due in the window that were sent
	ended    int64                   // requests that ended without an error in the window
	outcomes [3]int64                // of measured requests
	// unfinished are measured requests still running when the drain
	// ended; their latency is recorded as the drain's end.
	unfinished int64
}

func newPointStats(from, to time.Time) *pointStats {
	return &pointStats{from: from, to: to, latency: newHist(), lag: newHist()}
}

func (p *pointStats) inWindow(t time.Time) bool { return !t.Before(p.from) && t.Before(p.to) }

func micros(d time.Duration) int64 { return max(1, d.Microseconds()) }

// sent records that a request due at due was sent at sent.
func (p *pointStats) sent(due, sent time.Time) {
	if p.inWindow(due) {
		p.measured++
		_ = p.lag.RecordValue(max(0, sent.Sub(due).Microseconds()))
	}
}

// done records that a request due at due ended at end as o.
func (p *pointStats) done(due, end time.Time, o outcome) {
	if o != failed && p.inWindow(end) {
		p.ended++
	}
	if !p.inWindow(due) {
		return
	}
	p.outcomes[o]++
	if o != failed {
		_ = p.latency.RecordValue(micros(end.Sub(due)))
	}
}

// abandon records that a request due at due had not ended at deadline,
// when the point stopped waiting for it.
func (p *pointStats) abandon(due, deadline time.Time) {
	if p.inWindow(due) {
		p.unfinished++
		_ = p.latency.RecordValue(micros(deadline.Sub(due)))
	}
}

// SyncCounts are the durability calls counted in the Cassandra processes.
type SyncCounts struct {
	Msync  int64   `json:"msync"` // the commit log's syncs (a mapped segment's force)
	Fsync  int64   `json:"fsync"` // fsync and fdatasync: SSTables, directories, ...
	Window float64 `json:"window_s"`
}

// Entries are the local writes the nodes made, each one commit-log entry:
// the sum of system_views.local_write_latency's counts, and of it the
// writes of system.paxos (Paxos state).
type Entries struct {
	All, Paxos int64
}

// CommitLogPoint is one (mode, rate) point of one round, or the median of
// several.
type CommitLogPoint struct {
	Mode       string  `json:"mode"`
	Round      int     `json:"round"` // from 1; 0 for a median
	Offered    float64 `json:"offered_per_s"`
	Achieved   float64 `json:"achieved_per_s"` // requests that ended without an error in the window, per s
	Measured   int64   `json:"measured"`       // requests due in the window
	Applied    int64   `json:"applied"`
	NotApplied int64   `json:"not_applied"`
	Errors     int64   `json:"errors"`
	Unfinished int64   `json:"unfinished"`
	MeanMs     float64 `json:"latency_mean_ms"`
	P50Ms      float64 `json:"latency_p50_ms"`
	P99Ms      float64 `json:"latency_p99_ms"`
	MaxMs      float64 `json:"latency_max_ms"`
	// LagP99Ms is the 99th percentile of how late the benchmark itself
	// sent a request (its timers, or MaxInFlight reached): part of the
	// latency that is the client's.
	LagP99Ms float64 `json:"send_lag_p99_ms"`
	// Syncs per second are the commit log's msyncs; Fsyncs per second the
	// other durability calls (not in the write path).
	SyncsPerSec  float64 `json:"syncs_per_s"`
	FsyncsPerSec float64 `json:"other_fsyncs_per_s"`
	// EntriesPerSec are local writes per second (commit-log entries);
	// PaxosShare the fraction of them that are Paxos state.
	EntriesPerSec  float64 `json:"entries_per_s"`
	PaxosShare     float64 `json:"paxos_share"`
	EntriesPerSync float64 `json:"entries_per_sync"`
	EntriesPerLWT  float64 `json:"entries_per_lwt"`
	// ServerCPUs and MachineCPUs are how many CPUs the Cassandra processes
	// and the whole machine kept busy; Load1 is the 1-minute load average
	// at the end of the window.
	ServerCPUs float64 `json:"server_cpus"`
	// ServerCPUPerWrite is the Cassandra processes' CPU time per write
	// that ended, µs: the figure that moves least when other work takes
	// the machine's cores.
	ServerCPUPerWrite float64 `json:"server_cpu_us_per_write"`
	MachineCPUs       float64 `json:"machine_cpus"`
	Load1             float64 `json:"load1"`
	Counter           string  `json:"sync_counter"`
	SyncDelayMs       float64 `json:"sync_delay_ms"`
}

// Saturated says the point did not keep up with its offered load: under
// 90% of it achieved, or more than 1% of its requests failed or did not
// end.
func (p CommitLogPoint) Saturated() bool {
	bad := p.Errors + p.Unfinished
	return p.Achieved < 0.9*p.Offered || float64(bad) > 0.01*float64(max(1, p.Measured))
}

// pointInputs are what a point measured besides its requests, each over
// a window of its own (seconds) that covers the point's window up to the
// time the snapshots took.
type pointInputs struct {
	syncs                 SyncCounts // over syncs.Window
	countSyncs            bool
	entries               Entries // made over entriesWindow
	entriesWindow         float64
	serverCPU, machineCPU time.Duration // spent over cpuWindow
	cpuWindow             float64
	load1                 float64
}

// figures derives a point's figures from its accounting and counters.
func (p *pointStats) figures(in pointInputs) CommitLogPoint {
	w := p.to.Sub(p.from).Seconds()
	r := CommitLogPoint{
		Achieved: float64(p.ended) / w, Measured: p.measured,
		Applied: p.outcomes[applied], NotApplied: p.outcomes[notApplied], Errors: p.outcomes[failed], Unfinished: p.unfinished,
		MeanMs: p.latency.Mean() / 1000, P50Ms: float64(p.latency.ValueAtQuantile(50)) / 1000,
		P99Ms: float64(p.latency.ValueAtQuantile(99)) / 1000, MaxMs: float64(p.latency.Max()) / 1000,
		LagP99Ms: float64(p.lag.ValueAtQuantile(99)) / 1000,
		Load1:    in.load1,
	}
	if in.cpuWindow > 0 {
		r.ServerCPUs, r.MachineCPUs = in.serverCPU.Seconds()/in.cpuWindow, in.machineCPU.Seconds()/in.cpuWindow
		if r.Achieved > 0 {
			r.ServerCPUPerWrite = r.ServerCPUs / r.Achieved * 1e6
		}
	}
	all := in.entries.All
	if in.entriesWindow > 0 {
		r.EntriesPerSec = float64(all) / in.entriesWindow
	}
	if all > 0 {
		r.PaxosShare = float64(in.entries.Paxos) / float64(all)
	}
	if lwts := r.Applied + r.NotApplied; lwts > 0 && in.entriesWindow > 0 {
		// Entries per second over requests per second: the windows differ
		// by the snapshots' time, and requests straddling the edges make
		// this approximate by about their share.
		r.EntriesPerLWT = r.EntriesPerSec / (float64(lwts) / w)
	}
	if in.countSyncs && in.syncs.Window > 0 {
		r.SyncsPerSec = float64(in.syncs.Msync) / in.syncs.Window
		r.FsyncsPerSec = float64(in.syncs.Fsync) / in.syncs.Window
		if r.SyncsPerSec > 0 {
			r.EntriesPerSync = r.EntriesPerSec / r.SyncsPerSec
		}
	}
	return r
}

// medianPoints is each figure's median over rounds of the same cell.
func medianPoints(ps []CommitLogPoint) CommitLogPoint {
	if len(ps) == 1 {
		return ps[0]
	}
	m := ps[0]
	m.Round = 0
	med := func(get func(CommitLogPoint) float64) float64 {
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = get(p)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	medInt := func(get func(CommitLogPoint) int64) int64 {
		return int64(math.Round(med(func(p CommitLogPoint) float64 { return float64(get(p)) })))
	}
	m.Achieved = med(func(p CommitLogPoint) float64 { return p.Achieved })
	m.Measured = medInt(func(p CommitLogPoint) int64 { return p.Measured })
	m.Applied = medInt(func(p CommitLogPoint) int64 { return p.Applied })
	m.NotApplied = medInt(func(p CommitLogPoint) int64 { return p.NotApplied })
	m.Errors = medInt(func(p CommitLogPoint) int64 { return p.Errors })
	m.Unfinished = medInt(func(p CommitLogPoint) int64 { return p.Unfinished })
	m.MeanMs = med(func(p CommitLogPoint) float64 { return p.MeanMs })
	m.P50Ms = med(func(p CommitLogPoint) float64 { return p.P50Ms })
	m.P99Ms = med(func(p CommitLogPoint) float64 { return p.P99Ms })
	m.MaxMs = med(func(p CommitLogPoint) float64 { return p.MaxMs })
	m.LagP99Ms = med(func(p CommitLogPoint) float64 { return p.LagP99Ms })
	m.SyncsPerSec = med(func(p CommitLogPoint) float64 { return p.SyncsPerSec })
	m.FsyncsPerSec = med(func(p CommitLogPoint) float64 { return p.FsyncsPerSec })
	m.EntriesPerSec = med(func(p CommitLogPoint) float64 { return p.EntriesPerSec })
	m.PaxosShare = med(func(p CommitLogPoint) float64 { return p.PaxosShare })
	m.EntriesPerSync = med(func(p CommitLogPoint) float64 { return p.EntriesPerSync })
	m.EntriesPerLWT = med(func(p CommitLogPoint) float64 { return p.EntriesPerLWT })
	m.ServerCPUs = med(func(p CommitLogPoint) float64 { return p.ServerCPUs })
	m.ServerCPUPerWrite = med(func(p CommitLogPoint) float64 { return p.ServerCPUPerWrite })
	m.MachineCPUs = med(func(p CommitLogPoint) float64 { return p.MachineCPUs })
	m.Load1 = med(func(p CommitLogPoint) float64 { return p.Load1 })
	return m
}

// CommitLogCell is one (mode, rate) cell of the table: the median over the
// rounds, its rounds, and its ratios to batch's cell at the same rate.
type CommitLogCell struct {
	CommitLogPoint
	Rounds []CommitLogPoint `json:"rounds,omitempty"`
	// VsBatch compares with batch at the same rate, when batch was run
	// there: entries per sync ÷ batch's, mean latency ÷ batch's.
	VsBatch *Ratios `json:"vs_batch,omitempty"`
}

// Ratios of a cell to its baseline.
type Ratios struct {
	EntriesPerSync float64 `json:"entries_per_sync"`
	Mean           float64 `json:"latency_mean"`
	P99            float64 `json:"latency_p99"`
}

// commitLogCells groups points by (mode, rate), in the order of modes and
// then rates, with each cell's median and its ratios to batch.
func commitLogCells(modes []string, points []CommitLogPoint) []CommitLogCell {
	type key struct {
		mode string
		rate float64
	}
	by := map[key][]CommitLogPoint{}
	var rates []float64
	for _, p := range points {
		k := key{p.Mode, p.Offered}
		by[k] = append(by[k], p)
		if !slices.Contains(rates, p.Offered) {
			rates = append(rates, p.Offered)
		}
	}
	slices.Sort(rates)
	var cells []CommitLogCell
	for _, m := range modes {
		for _, r := range rates {
			ps := by[key{m, r}]
			if len(ps) == 0 {
				continue
			}
			c := CommitLogCell{CommitLogPoint: medianPoints(ps)}
			if len(ps) > 1 {
				c.Rounds = ps
			}
			if b := by[key{"batch", r}]; m != "batch" && len(b) > 0 {
				base := medianPoints(b)
				c.VsBatch = &Ratios{EntriesPerSync: ratio(c.EntriesPerSync, base.EntriesPerSync),
					Mean: ratio(c.MeanMs, base.MeanMs), P99: ratio(c.P99Ms, base.P99Ms)}
			}
			cells = append(cells, c)
		}
	}
	return cells
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// parsePerfStat reads `perf stat -x,` output: one line per event,
// "COUNT,UNIT,EVENT,..." (COUNT "<not counted>" when the event never ran).
func parsePerfStat(out []byte) (SyncCounts, error) {
	var c SyncCounts
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if len(f) < 3 || !strings.HasPrefix(f[2], "syscalls:sys_enter_") {
			continue
		}
		var n int64
		if f[0] != "<not counted>" {
			v, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return SyncCounts{}, fmt.Errorf("bench: perf stat count %q of %s", f[0], f[2])
			}
			n = v
		}
		switch strings.TrimPrefix(f[2], "syscalls:sys_enter_") {
		case "msync":
			c.Msync += n
		case "fsync", "fdatasync":
			c.Fsync += n
		default:
			continue
		}
		seen++
	}
	if seen == 0 {
		return SyncCounts{}, fmt.Errorf("bench: no syscall counts in perf stat's output: %.300q", out)
	}
	return c, nil
}

// straceRow is a row of strace -c's summary: "% time seconds usecs/call
// calls [errors] syscall".
var straceRow = regexp.MustCompile(`^\s*[0-9.]+\s+[0-9.]+\s+[0-9]+\s+([0-9]+)\s+(?:[0-9]+\s+)?([a-z_0-9]+)\s*$`)

// parseStraceSummary reads strace -c's summary table.
func parseStraceSummary(out []byte) (SyncCounts, error) {
	var c SyncCounts
	table := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "usecs/call") {
			table = true
			continue
		}
		m := straceRow.FindStringSubmatch(line)
		if !table || m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		switch m[2] {
		case "msync":
			c.Msync += n
		case "fsync", "fdatasync":
			c.Fsync += n
		}
	}
	if !table {
		return SyncCounts{}, fmt.Errorf("bench: no summary in strace's output: %.300q", out)
	}
	return c, nil
}

// parseLoad1 reads the 1-minute load average of /proc/loadavg.
func parseLoad1(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("bench: empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}
