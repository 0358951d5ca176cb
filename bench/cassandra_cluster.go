package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// This file drives the commit-log benchmark's core (cassandra_commitlog.go)
// against real Cassandra clusters started by scripts/cassandra.sh.

// FindScript returns scripts/name of the kiroku checkout that holds the
// working directory, else the one beside this package's source as it was
// compiled (which `go run ./cmd/kiroku` from anywhere in the checkout
// finds).
func FindScript(name string) (string, error) {
	var tried []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if c := filepath.Join(d, "scripts", name); isFile(c) {
				return c, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
		tried = append(tried, "above "+wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		c := filepath.Join(filepath.Dir(file), "..", "scripts", name)
		if isFile(c) {
			return filepath.Clean(c), nil
		}
		tried = append(tried, filepath.Clean(c))
	}
	return "", fmt.Errorf("bench: scripts/%s is not in a kiroku checkout %s; run from one, or name it", name, strings.Join(tried, " nor "))
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// cassCluster is a cluster that scripts/cassandra.sh started for this run.
type cassCluster struct {
	script, state string
	dir           string
	contacts      []string // host:port
	pids          []int
}

// startCassandra starts a cluster in commit-log mode mode and waits until
// it answers CQL. The script's progress goes to progress.
func startCassandra(ctx context.Context, cfg *CommitLogConfig, mode string, progress io.Writer) (*cassCluster, error) {
	args := []string{"start", "--commitlog", mode, "--nodes", strconv.Itoa(cfg.Nodes)}
	if cfg.Heap != "" {
		args = append(args, "--heap", cfg.Heap)
	}
	for _, y := range cfg.Yaml {
		args = append(args, "--yaml", y)
	}
	name, argv := cfg.Script, args
	if cfg.SyncDelay > 0 {
		name, argv = cfg.SlowSyncScript, append([]string{cfg.SyncDelay.String(), "--", cfg.Script}, args...)
	}
	cmd := exec.CommandContext(ctx, name, argv...)
	cmd.Env = append(os.Environ(), "KIROKU_CASSANDRA_STATE="+cfg.StateFile)
	// An interrupted start is told to stop (its trap stops what it
	// started), not killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = io.MultiWriter(&stderr, progress)
	c := &cassCluster{script: cfg.Script, state: cfg.StateFile}
	if err := cmd.Run(); err != nil {
		c.stop(progress) // whatever the state file still names
		return nil, fmt.Errorf("bench: could not start Cassandra (%s %s): %w\n%s\n"+
			"scripts/cassandra.sh needs Java 17 and, the first time, Maven (apt-get install -y openjdk-17-jdk-headless maven)",
			name, strings.Join(argv, " "), err, tail(stderr.String(), 2000))
	}
	f := strings.Fields(stdout.String())
	if len(f) != 2 {
		c.stop(progress)
		return nil, fmt.Errorf("bench: scripts/cassandra.sh start printed %q, want DIR CONTACTS", stdout.String())
	}
	c.dir, c.contacts = f[0], strings.Split(f[1], ",")
	st, err := os.ReadFile(filepath.Join(c.dir, "state"))
	if err != nil {
		c.stop(progress)
		return nil, fmt.Errorf("bench: the cluster's state: %w", err)
	}
	for _, line := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, "pids="); ok {
			for _, p := range strings.Fields(v) {
				pid, err := strconv.Atoi(p)
				if err != nil {
					c.stop(progress)
					return nil, fmt.Errorf("bench: the cluster's state: pid %q", p)
				}
				c.pids = append(c.pids, pid)
			}
		}
	}
	if len(c.pids) != cfg.Nodes {
		c.stop(progress)
		return nil, fmt.Errorf("bench: the cluster's state names %d processes for %d nodes", len(c.pids), cfg.Nodes)
	}
	return c, nil
}

// stop stops the cluster (or, before it was known, the one the state file
// names: only this run's) by the script.
func (c *cassCluster) stop(progress io.Writer) {
	args := []string{"stop"}
	if c.dir != "" {
		args = append(args, c.dir)
	}
	cmd := exec.Command(c.script, args...)
	cmd.Env = append(os.Environ(), "KIROKU_CASSANDRA_STATE="+c.state)
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(progress, "bench: scripts/cassandra.sh stop %s: %v\n", c.dir, err)
	}
}

// diagnose says which nodes are no longer running, with the end of their
// logs, before stop deletes them.
func (c *cassCluster) diagnose() string {
	var b strings.Builder
	for i, pid := range c.pids {
		if syscall.Kill(pid, 0) == nil {
			continue
		}
		nd := filepath.Join(c.dir, fmt.Sprintf("node%d", i+1))
		fmt.Fprintf(&b, "\nCassandra node %d (pid %d) is no longer running; the end of its logs:", i+1, pid)
		for _, f := range []string{"logs/system.log", "logs/stdout.log"} {
			if out, err := os.ReadFile(filepath.Join(nd, f)); err == nil {
				fmt.Fprintf(&b, "\n%s:\n%s", f, tail(string(out), 1500))
			}
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// commitLogKeyspace and commitLogTable hold the benchmark's rows.
const (
	commitLogKeyspace = "kiroku_bench"
	commitLogTable    = commitLogKeyspace + ".commitlog"
)

// connect opens a session on the cluster and creates the benchmark's table.
func (c *cassCluster) connect(ctx context.Context, nodes int) (*gocql.Session, error) {
	var hosts []string
	port := 0
	for _, hp := range c.contacts {
		i := strings.LastIndexByte(hp, ':')
		p, err := strconv.Atoi(hp[i+1:])
		if i < 0 || err != nil {
			return nil, fmt.Errorf("bench: contact %q: want host:port", hp)
		}
		hosts, port = append(hosts, hp[:i]), p
	}
	cl := gocql.NewCluster(hosts...)
	cl.Port = port
	// Above Cassandra's own cas_contention_timeout plus
	// write_request_timeout, so that its verdict arrives first.
	cl.Timeout = 12 * time.Second
	cl.ConnectTimeout = 10 * time.Second
	cl.Consistency = gocql.Quorum
	cl.SerialConsistency = gocql.Serial
	cl.PoolConfig.HostSelectionPolicy = gocql.TokenAwareHostPolicy(gocql.RoundRobinHostPolicy())
	s, err := cl.CreateSession()
	if err != nil {
		return nil, fmt.Errorf("bench: connect to Cassandra at %s: %w", strings.Join(c.contacts, ","), err)
	}
	for _, q := range []string{
		fmt.Sprintf(`CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': 'SimpleStrategy', 'replication_factor': %d}`,
			commitLogKeyspace, min(3, nodes)),
		`CREATE TABLE IF NOT EXISTS ` + commitLogTable + ` (k bigint PRIMARY KEY, v bigint, p blob)`,
	} {
		if err := s.Query(q).ExecContext(ctx); err != nil {
			s.Close()
			return nil, fmt.Errorf("bench: %s: %w", q, err)
		}
	}
	return s, nil
}

// entries sums system_views.local_write_latency's counts over every node:
// each local write is one commit-log entry.
func entries(ctx context.Context, s *gocql.Session) (Entries, error) {
	var e Entries
	for _, h := range s.GetHosts() {
		it := s.Query(`SELECT keyspace_name, table_name, count FROM system_views.local_write_latency`).
			SetHostID(h.HostID()).Consistency(gocql.One).IterContext(ctx)
		var ks, t string
		var n int64
		for it.Scan(&ks, &t, &n) {
			e.All += n
			if ks == "system" && t == "paxos" {
				e.Paxos += n
			}
		}
		if err := it.Close(); err != nil {
			return Entries{}, fmt.Errorf("bench: system_views.local_write_latency on %s: %w", h.ConnectAddress(), err)
		}
	}
	return e, nil
}

// syncCounter counts the durability system calls of the Cassandra
// processes from outside them, between start and stop.
type syncCounter struct {
	kind    string
	cmd     *exec.Cmd
	out     bytes.Buffer
	started time.Time
}

// checkSyncCounter says whether the counter's tool is here and works.
func checkSyncCounter(kind string) error {
	switch kind {
	case "perf":
		out, err := exec.Command("perf", "stat", "-x,", "-e", "syscalls:sys_enter_msync", "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("bench: perf cannot count syscalls:sys_enter_msync here (%v: %s); install linux-perf, run as root, or use --sync-counter strace or none",
				err, tail(string(out), 300))
		}
	case "strace":
		if _, err := exec.LookPath("strace"); err != nil {
			return fmt.Errorf("bench: no strace (apt-get install -y strace), or use --sync-counter perf or none: %w", err)
		}
	}
	return nil
}

func startSyncCounter(kind string, pids []int) (*syncCounter, error) {
	var args []string
	switch kind {
	case "perf":
		ps := make([]string, len(pids))
		for i, p := range pids {
			ps[i] = strconv.Itoa(p)
		}
		args = []string{"perf", "stat", "-x,", "-e", "syscalls:sys_enter_msync,syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync",
			"-p", strings.Join(ps, ",")}
	case "strace":
		args = []string{"strace", "-f", "-c", "-e", "trace=msync,fsync,fdatasync"}
		for _, p := range pids {
			args = append(args, "-p", strconv.Itoa(p))
		}
	default:
		return nil, fmt.Errorf("bench: sync counter %q", kind)
	}
	c := &syncCounter{kind: kind, cmd: exec.Command(args[0], args[1:]...)}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", args[0], err)
	}
	c.started = time.Now()
	return c, nil
}

// stop ends the count and returns it.
func (c *syncCounter) stop() (SyncCounts, error) {
	window := time.Since(c.started).Seconds()
	_ = c.cmd.Process.Signal(os.Interrupt)
	err := c.cmd.Wait()
	var counts SyncCounts
	var perr error
	if c.kind == "perf" {
		counts, perr = parsePerfStat(c.out.Bytes())
	} else {
		counts, perr = parseStraceSummary(c.out.Bytes())
	}
	if perr != nil {
		return SyncCounts{}, fmt.Errorf("%w (exit: %v)", perr, err)
	}
	counts.Window = window
	return counts, nil
}

// kill ends a counter that will not be read.
func (c *syncCounter) kill() {
	if c != nil && c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// pointRun is one point's load against a session.
type pointRun struct {
	session  *gocql.Session
	cluster  *cassCluster
	cfg      *CommitLogConfig
	rate     float64
	base     int64         // first key
	warmup   time.Duration // before the window
	duration time.Duration // the window; 0: a warm-up only, nothing measured
}

func (r *pointRun) exec(ctx context.Context, op lwtOp, payload []byte) outcome {
	var q *gocql.Query
	if op.Round == 0 {
		q = r.session.Query(`INSERT INTO `+commitLogTable+` (k, v, p) VALUES (?, 0, ?) IF NOT EXISTS`, op.Key, payload)
	} else {
		q = r.session.Query(`UPDATE `+commitLogTable+` SET v = ?, p = ? WHERE k = ? IF v = ?`, op.Round, payload, op.Key, op.Round-1)
	}
	ok, err := q.MapScanCASContext(ctx, map[string]any{})
	switch {
	case err != nil:
		return failed
	case ok:
		return applied
	}
	return notApplied
}

// run offers the load and measures the window.
func (r *pointRun) run(ctx context.Context) (CommitLogPoint, error) {
	keys := keysFor(r.rate, r.cfg.Revisit)
	payload := make([]byte, r.cfg.ValueSize)
	for i := range payload {
		payload[i] = byte(i)
	}
	sched := openLoop{start: time.Now().Add(50 * time.Millisecond), rate: r.rate}
	from := sched.start.Add(r.warmup)
	to := from.Add(r.duration)
	var mu struct {
		sync.Mutex
		stats   *pointStats
		pending map[int64]time.Time // request → when it was due, while it runs
	}
	mu.stats, mu.pending = newPointStats(from, to), map[int64]time.Time{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make(chan struct{}, r.cfg.MaxInFlight)
	var requests sync.WaitGroup
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for k := int64(0); ; k++ {
			due := sched.due(k)
			if !due.Before(to) {
				return
			}
			if d := time.Until(due); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return
				}
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			op := opFor(k, keys, r.base)
			mu.Lock()
			mu.stats.sent(due, time.Now())
			mu.pending[k] = due
			mu.Unlock()
			requests.Add(1)
			go func() {
				defer requests.Done()
				o := r.exec(ctx, op, payload)
				end := time.Now()
				<-slots
				mu.Lock()
				if _, ok := mu.pending[k]; ok {
					delete(mu.pending, k)
					mu.stats.done(due, end, o)
				}
				mu.Unlock()
			}()
		}
	}()
	sleepUntil := func(t time.Time) error {
		select {
		case <-time.After(time.Until(t)):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var in pointInputs
	var counter *syncCounter
	defer func() { counter.kill() }()
	serverCPU := func() (time.Duration, error) {
		var t time.Duration
		for _, p := range r.cluster.pids {
			c, err := procCPU(p)
			if err != nil {
				return 0, err
			}
			t += c
		}
		return t, nil
	}
	// Snapshots of the counters: at the window's start and end, each
	// with the time it was taken.
	type snapshot struct {
		entries   Entries
		entriesAt time.Time
		cpu, mach time.Duration
		cpuAt     time.Time
	}
	take := func() (snapshot, error) {
		var s snapshot
		var err error
		s.entriesAt = time.Now()
		if s.entries, err = entries(ctx, r.session); err != nil {
			return s, err
		}
		s.cpuAt = time.Now()
		if s.cpu, err = serverCPU(); err != nil {
			return s, err
		}
		s.mach, _, err = MachineCPU()
		return s, err
	}
	measure := r.duration > 0
	var s0 snapshot
	if measure {
		if err := sleepUntil(from); err != nil {
			return CommitLogPoint{}, err
		}
		var err error
		if s0, err = take(); err != nil {
			return CommitLogPoint{}, err
		}
		if r.cfg.Counter != "none" {
			if counter, err = startSyncCounter(r.cfg.Counter, r.cluster.pids); err != nil {
				return CommitLogPoint{}, err
			}
			in.countSyncs = true
		}
	}
	if err := sleepUntil(to); err != nil {
		return CommitLogPoint{}, err
	}
	if measure {
		var err error
		if counter != nil {
			if in.syncs, err = counter.stop(); err != nil {
				return CommitLogPoint{}, err
			}
		}
		s1, err := take()
		if err != nil {
			return CommitLogPoint{}, err
		}
		in.entries = Entries{All: s1.entries.All - s0.entries.All, Paxos: s1.entries.Paxos - s0.entries.Paxos}
		in.entriesWindow = s1.entriesAt.Sub(s0.entriesAt).Seconds()
		in.serverCPU, in.machineCPU = s1.cpu-s0.cpu, s1.mach-s0.mach
		in.cpuWindow = s1.cpuAt.Sub(s0.cpuAt).Seconds()
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			in.load1, _ = parseLoad1(b)
		}
	}
	<-dispatched
	// Wait for the requests still running, up to the drain's end.
	all := make(chan struct{})
	go func() { requests.Wait(); close(all) }()
	deadline := to.Add(r.cfg.Drain)
	select {
	case <-all:
	case <-time.After(time.Until(deadline)):
	case <-ctx.Done():
		return CommitLogPoint{}, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	for k, due := range mu.pending {
		mu.stats.abandon(due, deadline)
		delete(mu.pending, k)
	}
	p := mu.stats.figures(in)
	p.Offered, p.Counter, p.SyncDelayMs = r.rate, r.cfg.Counter, float64(r.cfg.SyncDelay)/float64(time.Millisecond)
	return p, nil
}

// RunCommitLog runs the benchmark: for each round, each mode in turn on a
// cluster of its own, each rate; progress goes to progress. It returns the
// table's cells, batch first when it was run.
func RunCommitLog(ctx context.Context, cfg CommitLogConfig, progress io.Writer) ([]CommitLogCell, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var err error
	if cfg.Script == "" {
		if cfg.Script, err = FindScript("cassandra.sh"); err != nil {
			return nil, err
		}
	}
	if cfg.SyncDelay > 0 && cfg.SlowSyncScript == "" {
		if cfg.SlowSyncScript, err = FindScript("slowsync.sh"); err != nil {
			return nil, err
		}
	}
	if cfg.Counter != "none" {
		if err := checkSyncCounter(cfg.Counter); err != nil {
			return nil, err
		}
	}
	if cfg.StateFile == "" {
		f, err := os.CreateTemp("", "kiroku-bench-commitlog-*.state")
		if err != nil {
			return nil, err
		}
		f.Close()
		cfg.StateFile = f.Name()
		defer os.Remove(cfg.StateFile)
		defer os.Remove(cfg.StateFile + ".lock")
	}
	modes := slices.Clone(cfg.Modes)
	if i := slices.Index(modes, "batch"); i > 0 {
		modes = append([]string{"batch"}, slices.Delete(modes, i, i+1)...)
	}
	var points []CommitLogPoint
	for round := 1; round <= cfg.Rounds; round++ {
		order := slices.Clone(modes)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, m := range order {
			ps, err := runMode(ctx, &cfg, m, round, progress)
			points = append(points, ps...)
			if err != nil {
				return commitLogCells(modes, points), err
			}
		}
	}
	return commitLogCells(modes, points), nil
}

// runMode starts a cluster in mode m, sweeps the rates on it and stops it.
func runMode(ctx context.Context, cfg *CommitLogConfig, m string, round int, progress io.Writer) ([]CommitLogPoint, error) {
	mode, _ := ParseCommitLogMode(m)
	cl, err := startCassandra(ctx, cfg, mode.Flag(), progress)
	if err != nil && ctx.Err() == nil {
		// On a shared machine a node can lose a race for its ports with
		// another cluster starting at the same moment; one more try.
		fmt.Fprintf(progress, "bench: %v\nbench: trying once more\n", err)
		cl, err = startCassandra(ctx, cfg, mode.Flag(), progress)
	}
	if err != nil {
		return nil, err
	}
	defer cl.stop(progress)
	s, err := cl.connect(ctx, cfg.Nodes)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if cfg.StartWarmup > 0 {
		fmt.Fprintf(progress, "  %s: warming up at %.0f/s for %s\n", m, cfg.Rates[0], cfg.StartWarmup)
		w := pointRun{session: s, cluster: cl, cfg: cfg, rate: cfg.Rates[0], base: 0, warmup: cfg.StartWarmup}
		if _, err := w.run(ctx); err != nil {
			return nil, err
		}
	}
	var points []CommitLogPoint
	for i, rate := range cfg.Rates {
		pr := pointRun{session: s, cluster: cl, cfg: cfg, rate: rate, base: int64(i+1) << 40, warmup: cfg.Warmup, duration: cfg.Duration}
		p, err := pr.run(ctx)
		if err != nil {
			return points, fmt.Errorf("bench: %s at %.0f/s: %w%s", m, rate, err, cl.diagnose())
		}
		p.Mode, p.Round = m, round
		points = append(points, p)
		fmt.Fprintf(progress, "  %s @ %.0f/s: %.0f/s, mean %.2f ms, p99 %.2f ms (sent late by up to %.2f ms at p99), %.0f syncs/s, %.2f entries/sync, load %.1f\n",
			m, rate, p.Achieved, p.MeanMs, p.P99Ms, p.LagP99Ms, p.SyncsPerSec, p.EntriesPerSync, p.Load1)
		if cfg.StopAtSaturation && p.Saturated() {
			fmt.Fprintf(progress, "  %s: saturated at %.0f/s; higher rates skipped\n", m, rate)
			break
		}
	}
	return points, nil
}
