package bench

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestOpenLoopSchedule(t *testing.T) {
	for _, rate := range []float64{1000, 333, 1, 2500.5} {
		s := openLoop{start: t0, rate: rate}
		for k := int64(0); k < 5000; k += 7 {
			want := time.Duration(float64(k) / rate * float64(time.Second))
			if got := s.due(k).Sub(t0); got != want {
				t.Fatalf("rate %v: due(%d) = %v, want %v", rate, k, got, want)
			}
			if s.due(k + 1).Before(s.due(k)) {
				t.Fatalf("rate %v: due(%d) before due(%d)", rate, k+1, k)
			}
		}
	}
}

func TestOpFor(t *testing.T) {
	const keys, base = 1000, 5 << 40
	for _, c := range []struct {
		k    int64
		want lwtOp
	}{
		{0, lwtOp{base, 0}},
		{999, lwtOp{base + 999, 0}},
		{1000, lwtOp{base, 1}},
		{2999, lwtOp{base + 999, 2}},
	} {
		if got := opFor(c.k, keys, base); got != c.want {
			t.Errorf("opFor(%d) = %+v, want %+v", c.k, got, c.want)
		}
	}
	// Each key's rounds come in order, one request per key per pass.
	last := map[int64]int64{}
	for k := int64(0); k < 5*keys; k++ {
		op := opFor(k, keys, base)
		if r, ok := last[op.Key]; ok && op.Round != r+1 || !ok && op.Round != 0 {
			t.Fatalf("request %d: key %d round %d after round %d", k, op.Key, op.Round, r)
		}
		last[op.Key] = op.Round
	}
	if got := keysFor(100, 2*time.Second); got != 1000 {
		t.Errorf("keysFor(100/s, 2s) = %d, want the minimum 1000", got)
	}
	if got := keysFor(2000, 2*time.Second); got != 4000 {
		t.Errorf("keysFor(2000/s, 2s) = %d, want 4000", got)
	}
}

func TestPointStats(t *testing.T) {
	// The window is [10s, 20s); the drain ends at 35s.
	p := newPointStats(at(10*time.Second), at(20*time.Second))
	type req struct {
		due, sent, end time.Duration
		o              outcome
		abandoned      bool
	}
	for _, r := range []req{
		{due: 5 * time.Second, sent: 5 * time.Second, end: 12 * time.Second, o: applied},           // warm-up: ends in the window
		{due: 15 * time.Second, sent: 15 * time.Second, end: 15500 * time.Millisecond, o: applied}, // 500 ms
		{due: 16 * time.Second, sent: 16002 * time.Millisecond, end: 16100 * time.Millisecond, o: notApplied},
		{due: 19 * time.Second, sent: 19 * time.Second, end: 19100 * time.Millisecond, o: failed},
		{due: 19 * time.Second, sent: 19 * time.Second, end: 21 * time.Second, o: applied}, // ends after the window: 2 s
		{due: 19500 * time.Millisecond, sent: 19500 * time.Millisecond, abandoned: true},
		{due: 20 * time.Second, sent: 20 * time.Second, end: 20100 * time.Millisecond, o: applied}, // after the window
	} {
		p.sent(at(r.due), at(r.sent))
		if r.abandoned {
			p.abandon(at(r.due), at(35*time.Second))
		} else {
			p.done(at(r.due), at(r.end), r.o)
		}
	}
	f := p.figures(pointInputs{})
	if f.Measured != 5 || f.Applied != 2 || f.NotApplied != 1 || f.Errors != 1 || f.Unfinished != 1 {
		t.Errorf("measured %d, applied %d, not applied %d, errors %d, unfinished %d; want 5, 2, 1, 1, 1",
			f.Measured, f.Applied, f.NotApplied, f.Errors, f.Unfinished)
	}
	// Ended without an error in the window: the warm-up request, 500 ms and 100 ms.
	if f.Achieved != 0.3 {
		t.Errorf("achieved %v/s, want 3 in 10 s", f.Achieved)
	}
	// Latencies: 500 ms, 100 ms, 2 s and the abandoned one's 15.5 s.
	if want := (0.5 + 0.1 + 2 + 15.5) / 4 * 1000; math.Abs(f.MeanMs-want) > want*0.002 {
		t.Errorf("mean %v ms, want %v", f.MeanMs, want)
	}
	if math.Abs(f.MaxMs-15500) > 15500*0.002 {
		t.Errorf("max %v ms, want 15500 (the abandoned request, until the drain ended)", f.MaxMs)
	}
	if math.Abs(f.LagP99Ms-2) > 0.01 {
		t.Errorf("send lag p99 %v ms, want 2", f.LagP99Ms)
	}
	if !f.Saturated() {
		t.Error("a point with an error and an unfinished request out of five is saturated")
	}
}

func TestFigures(t *testing.T) {
	p := newPointStats(at(0), at(10*time.Second))
	for i := 0; i < 1000; i++ {
		due := at(time.Duration(i) * 10 * time.Millisecond)
		p.sent(due, due)
		p.done(due, due.Add(3*time.Millisecond), applied)
	}
	in := pointInputs{
		syncs:      SyncCounts{Msync: 500, Fsync: 20, Window: 10},
		countSyncs: true,
		entries:    Entries{All: 4000, Paxos: 3000}, entriesWindow: 10,
		serverCPU: 5 * time.Second, machineCPU: 15 * time.Second, cpuWindow: 10, load1: 1.5,
	}
	f := p.figures(in)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"achieved/s", f.Achieved, 100},
		{"syncs/s", f.SyncsPerSec, 50},
		{"other fsyncs/s", f.FsyncsPerSec, 2},
		{"entries/s", f.EntriesPerSec, 400},
		{"entries/sync", f.EntriesPerSync, 8},
		{"entries/LWT", f.EntriesPerLWT, 4},
		{"paxos share", f.PaxosShare, 0.75},
		{"server CPUs", f.ServerCPUs, 0.5},
		{"server CPU µs per write", f.ServerCPUPerWrite, 5000},
		{"machine CPUs", f.MachineCPUs, 1.5},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if f.Saturated() {
		t.Error("every request ended at the offered rate: not saturated")
	}
	in.countSyncs = false
	if f := p.figures(in); f.SyncsPerSec != 0 || f.EntriesPerSync != 0 {
		t.Errorf("without a sync counter: %v syncs/s, %v entries/sync; want 0", f.SyncsPerSec, f.EntriesPerSync)
	}
}

func TestSaturated(t *testing.T) {
	for _, c := range []struct {
		p    CommitLogPoint
		want bool
	}{
		{CommitLogPoint{Offered: 1000, Achieved: 995, Measured: 20000}, false},
		{CommitLogPoint{Offered: 1000, Achieved: 899, Measured: 20000}, true},
		{CommitLogPoint{Offered: 1000, Achieved: 1000, Measured: 20000, Errors: 201}, true},
		{CommitLogPoint{Offered: 1000, Achieved: 1000, Measured: 20000, Errors: 100, Unfinished: 100}, false},
		{CommitLogPoint{Offered: 1000, Achieved: 1000, Measured: 20000, Unfinished: 250}, true},
	} {
		if got := c.p.Saturated(); got != c.want {
			t.Errorf("%+v: saturated %v, want %v", c.p, got, c.want)
		}
	}
}

func TestCommitLogCells(t *testing.T) {
	pt := func(mode string, round int, rate, mean, eps float64) CommitLogPoint {
		return CommitLogPoint{Mode: mode, Round: round, Offered: rate, Achieved: rate, MeanMs: mean, P99Ms: 2 * mean, EntriesPerSync: eps}
	}
	points := []CommitLogPoint{
		pt("batch", 1, 100, 4, 1), pt("group:10ms", 1, 100, 30, 4),
		pt("batch", 1, 500, 6, 2),
		// Round 2 ran the modes in reverse.
		pt("group:10ms", 2, 100, 20, 6), pt("batch", 2, 100, 6, 1.5),
		pt("batch", 2, 500, 8, 3),
	}
	cells := commitLogCells([]string{"batch", "group:10ms"}, points)
	if len(cells) != 3 {
		t.Fatalf("%d cells, want 3: batch at 100 and 500, group at 100", len(cells))
	}
	if c := cells[0]; c.Mode != "batch" || c.Offered != 100 || c.MeanMs != 5 || c.EntriesPerSync != 1.25 || c.VsBatch != nil || len(c.Rounds) != 2 || c.Round != 0 {
		t.Errorf("batch @ 100: %+v; want the medians of two rounds, mean 5, 1.25 entries per sync, no ratio", c)
	}
	if c := cells[1]; c.Mode != "batch" || c.Offered != 500 || c.MeanMs != 7 {
		t.Errorf("second cell: %s @ %v, mean %v; want batch @ 500, mean 7", c.Mode, c.Offered, c.MeanMs)
	}
	c := cells[2]
	if c.Mode != "group:10ms" || c.VsBatch == nil {
		t.Fatalf("third cell: %+v; want group:10ms with ratios to batch", c)
	}
	if c.VsBatch.EntriesPerSync != 4 || c.VsBatch.Mean != 5 || c.VsBatch.P99 != 5 {
		t.Errorf("group vs batch: %+v; want 4× the entries per sync (5 ÷ 1.25), 5× the mean and p99", *c.VsBatch)
	}
	// A single round is reported as it is.
	one := commitLogCells([]string{"batch"}, []CommitLogPoint{pt("batch", 1, 100, 4, 1)})
	if len(one) != 1 || one[0].Round != 1 || one[0].Rounds != nil {
		t.Errorf("one round: %+v", one)
	}
}

func TestCommitLogConfig(t *testing.T) {
	for _, c := range []struct {
		mode string
		want string // "" for an error
	}{
		{"batch", "batch"},
		{"group:10ms", "group:10ms"},
		{"group:0.002s", "group:2ms"},
		{"group:1500us", ""},
		{"group:0ms", ""},
		{"group", ""},
		{"periodic:10ms", ""},
	} {
		m, err := ParseCommitLogMode(c.mode)
		if c.want == "" {
			if err == nil {
				t.Errorf("%q: accepted as %+v, want an error", c.mode, m)
			}
			continue
		}
		if err != nil || m.Flag() != c.want {
			t.Errorf("%q: %q, %v; want %q", c.mode, m.Flag(), err, c.want)
		}
	}
	cfg := CommitLogConfig{Modes: []string{"group:0.01s", "batch"}, Rates: []float64{500, 100}, Duration: time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Modes[0] != "group:10ms" || cfg.Rates[0] != 100 || cfg.Counter != "perf" || cfg.Nodes != 1 || cfg.Rounds != 1 || cfg.MaxInFlight != 4096 {
		t.Errorf("after Validate: %+v", cfg)
	}
	for _, bad := range []CommitLogConfig{
		{Modes: []string{"batch"}, Rates: []float64{100}},                                      // no duration
		{Modes: []string{"batch", "batch"}, Rates: []float64{100}, Duration: time.Second},      // twice
		{Modes: []string{"batch"}, Rates: []float64{0}, Duration: time.Second},                 // rate 0
		{Modes: []string{"batch"}, Rates: []float64{100}, Duration: time.Second, Nodes: 10},    // nodes
		{Modes: []string{"batch"}, Rates: []float64{100}, Duration: time.Second, Counter: "x"}, // counter
		{Rates: []float64{100}, Duration: time.Second},                                         // no mode
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

func TestParseSyncCounters(t *testing.T) {
	perf := "4000,,syscalls:sys_enter_msync,18822784267,100.00,,\n" +
		"2,,syscalls:sys_enter_fsync,18822784267,100.00,,\n" +
		"<not counted>,,syscalls:sys_enter_fdatasync,0,0.00,,\n"
	c, err := parsePerfStat([]byte(perf))
	if err != nil || c.Msync != 4000 || c.Fsync != 2 {
		t.Errorf("perf: %+v, %v; want 4000 msync, 2 fsync", c, err)
	}
	if _, err := parsePerfStat([]byte("perf: no such process\n")); err == nil {
		t.Error("perf output without counts: no error")
	}
	strace := `strace: Process 25321 attached
strace: Process 25321 detached
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 98.30    0.000347          17        20           msync
  1.20    0.000004           4         3           fdatasync
  0.50    0.000002           2         1         1 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    0.000353          16        24         1 total
`
	c, err = parseStraceSummary([]byte(strace))
	if err != nil || c.Msync != 20 || c.Fsync != 4 {
		t.Errorf("strace: %+v, %v; want 20 msync, 4 fsync and fdatasync", c, err)
	}
	if _, err := parseStraceSummary([]byte("strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted\n")); err == nil {
		t.Error("strace output without a summary: no error")
	}
	if l, err := parseLoad1([]byte("3.52 2.10 1.00 2/345 6789\n")); err != nil || l != 3.52 {
		t.Errorf("load: %v, %v", l, err)
	}
}
