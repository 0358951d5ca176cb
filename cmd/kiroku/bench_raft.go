package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/bench"
)

func benchRaftCmd() *cobra.Command {
	var (
		cfg             bench.RaftConfig
		clients, values string
		policies        string
		asJSON          bool
		failover        int
		etcd            bool
		etcdClients     string
		etcdDir         string
	)
	cmd := &cobra.Command{
		Use:   "raft",
		Short: "PUTs/s of a Raft group on this machine, follower bulk fsync against an fsync per append",
		Long: `Seed 001's experiment. Starts a Raft group of --nodes nodes in this process, each with its log
on disk in --dir and its own gRPC server on loopback, and has --clients clients put --key-size
keys and --value-sizes values through the leader, each waiting for its put to be committed (applied
on the leader) before the next. Every combination of value size, client count and policy runs on a
fresh cluster; each policy's figure is printed beside the "entry" and "none" baselines of the
same value size and client count, measured in the same invocation.

Policies say when a node's Raft log is made durable; a node releases its acknowledgements (append
responses, votes) only after the fsync that covers them, under every policy but "none":
  entry     an fsync per entry, the node waiting for each: seed 001's baseline
  append    an fsync per append message, waited for (a Raft driver without asynchronous
            storage writes)
  batch     appends not waited for; one fsync for whatever is pending when the last ends
  count:N   one fsync per N appended entries, or --max-wait: seed 001's follower bulk fsync
  group:D   one fsync per window D
  none      never an fsync: UNSAFE, acknowledged puts can be lost; a bound, not a mode

CPU time per put is the whole process's: every node and every client share this machine.

--etcd (on by default) measures etcd in the same invocation, as the peer to compare with: before
kiroku's runs it builds the program bench/etcdpeer of this checkout (a Go module of its own, so
etcd stays out of kiroku's go.mod; found above the working directory, or beside the kiroku source
this binary was built from, or named by --etcd-dir) with the go command, and after them it runs
it: --nodes embedded etcd members on loopback in one process, etcd's defaults for fsync (its WAL
is synced before a member acknowledges) and snapshots, a backend quota of 8 GiB and periodic
auto-compaction keeping 2 s of history, keys drawn from a key space of 10,000, and clients
putting through the leader over gRPC (etcd's client/v3, one connection per 10 clients, at most
100), each waiting for its put. It runs the same value sizes and key size at --etcd-clients
(default: --clients). The table then has an etcd row for each value size and client count, and
for every row "× etcd" (puts/s over etcd's) and "p50 ÷ etcd" (its median latency over etcd's).
If the go command, the module or the build is missing, the peer is skipped with a message and
kiroku is measured all the same. The first build downloads etcd's modules and takes a minute.

--failover N then stops the leader of a fresh group N times, with the default election settings
(100 ms ticks, election timeout 1-2 s), and times how long until a new leader acknowledges a put.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Clients, err = intList(clients); err != nil {
				return err
			}
			if cfg.ValueSizes, err = intList(values); err != nil {
				return err
			}
			cfg.Policies = strings.Split(policies, ",")
			for _, p := range []string{"entry", "none"} {
				if !slices.Contains(cfg.Policies, p) {
					cfg.Policies = append([]string{p}, cfg.Policies...)
				}
			}
			out := cmd.OutOrStdout()
			errw := cmd.ErrOrStderr()
			peer := bench.EtcdPeerConfig{Members: cfg.Nodes, Clients: cfg.Clients, ValueSizes: cfg.ValueSizes, KeySize: cfg.KeySize,
				Warmup: cfg.Warmup, Duration: cfg.Duration, Dir: cfg.Dir}
			if etcdClients != "" {
				if peer.Clients, err = intList(etcdClients); err != nil {
					return err
				}
			}
			var etcdBin, etcdSkipped string
			if etcd {
				dir, err := bench.FindEtcdPeer(etcdDir)
				if err == nil {
					fmt.Fprintf(errw, "bench raft: building the etcd peer in %s\n", dir)
					var remove func()
					if etcdBin, remove, err = bench.BuildEtcdPeer(cmd.Context(), dir); err == nil {
						defer remove()
					}
				}
				if err != nil {
					etcdSkipped = err.Error()
					fmt.Fprintf(errw, "bench raft: SKIPPING the etcd peer: %v\n", err)
				}
			}
			fmt.Fprintf(errw, "bench raft: %d nodes, %s per run after %s warmup, policies %s\n", cfg.Nodes, cfg.Duration, cfg.Warmup, strings.Join(cfg.Policies, ","))
			points, err := bench.RunRaft(cmd.Context(), cfg, func(p bench.RaftPoint) {
				fmt.Fprintf(errw, "  %s, %d clients, %d-byte values: %.0f puts/s, p50 %.2f ms\n", p.Policy, p.Clients, p.ValueSize, p.PutsPerS, p.P50ms)
			})
			if err != nil {
				return err
			}
			var etcdPoints []bench.EtcdPoint
			if etcdBin != "" {
				fmt.Fprintf(errw, "bench raft: the etcd peer, %d members, clients %s\n", peer.Members, joinInts(peer.Clients))
				if etcdPoints, err = bench.RunEtcdPeer(cmd.Context(), etcdBin, peer, errw); err != nil {
					etcdSkipped = err.Error()
					fmt.Fprintf(errw, "bench raft: SKIPPING the etcd peer: %v\n", err)
				}
			}
			var failovers []time.Duration
			if failover > 0 {
				if failovers, err = bench.RaftFailover(cmd.Context(), cfg.Nodes, failover, cfg.Dir); err != nil {
					return err
				}
			}
			failoverMS := make([]float64, len(failovers))
			for i, d := range failovers {
				failoverMS[i] = float64(d.Microseconds()) / 1000
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				doc := map[string]any{"nodes": cfg.Nodes, "duration_s": cfg.Duration.Seconds(), "max_wait_ms": cfg.MaxWait.Seconds() * 1000,
					"points": points, "failover_ms": failoverMS}
				if etcd {
					doc["etcd"] = etcdPoints
					if etcdSkipped != "" {
						doc["etcd_skipped"] = etcdSkipped
					}
				}
				return enc.Encode(doc)
			}
			defer func() {
				if len(failovers) > 0 {
					sorted := slices.Clone(failovers)
					slices.Sort(sorted)
					fmt.Fprintf(out, "failover (leader stopped → first put acknowledged by a new leader), %d trials: median %v, max %v\n",
						len(sorted), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
				}
			}()
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
			if len(etcdPoints) == 0 {
				fmt.Fprintln(tw, "value B\tclients\tpolicy\tputs/s\t× entry\t× none\tp50 ms\tp99 ms\tCPU µs/put\t")
			} else {
				fmt.Fprintln(tw, "value B\tclients\tpolicy\tputs/s\t× entry\t× none\tp50 ms\tp99 ms\tCPU µs/put\t× etcd\tp50 ÷ etcd\t")
			}
			etcdAt := func(valueSize, clients int) *bench.EtcdPoint {
				for i, e := range etcdPoints {
					if e.ValueSize == valueSize && e.Clients == clients {
						return &etcdPoints[i]
					}
				}
				return nil
			}
			ratio := func(a, b float64) string {
				if b <= 0 {
					return "-"
				}
				return fmt.Sprintf("%.2f", a/b)
			}
			// An etcd row follows the last kiroku row of its value size
			// and client count; etcd's other points come at the end.
			shown := map[*bench.EtcdPoint]bool{}
			etcdRow := func(e *bench.EtcdPoint, entry, none float64) {
				shown[e] = true
				fmt.Fprintf(tw, "%d\t%d\tetcd %s (peer)\t%.0f\t%s\t%s\t%.2f\t%.2f\t%.0f\t1.00\t1.00\t\n", e.ValueSize, e.Clients, e.Version, e.PutsPerS,
					ratio(e.PutsPerS, entry), ratio(e.PutsPerS, none), e.P50ms, e.P99ms, e.CPUus)
			}
			base := func(p bench.RaftPoint, pol string) float64 {
				for _, q := range points {
					if q.Policy == pol && q.Clients == p.Clients && q.ValueSize == p.ValueSize {
						return q.PutsPerS
					}
				}
				return 0
			}
			for i, p := range points {
				name := p.Policy
				if p.Unsafe {
					name += " (UNSAFE)"
				}
				row := fmt.Sprintf("%d\t%d\t%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t", p.ValueSize, p.Clients, name, p.PutsPerS,
					p.PutsPerS/base(p, "entry"), p.PutsPerS/base(p, "none"), p.P50ms, p.P99ms, p.CPUus)
				if len(etcdPoints) > 0 {
					if e := etcdAt(p.ValueSize, p.Clients); e != nil {
						row += ratio(p.PutsPerS, e.PutsPerS) + "\t" + ratio(p.P50ms, e.P50ms) + "\t"
					} else {
						row += "-\t-\t"
					}
				}
				fmt.Fprintln(tw, row)
				if e := etcdAt(p.ValueSize, p.Clients); e != nil && (i+1 == len(points) || points[i+1].ValueSize != p.ValueSize || points[i+1].Clients != p.Clients) {
					etcdRow(e, base(p, "entry"), base(p, "none"))
				}
			}
			for i := range etcdPoints {
				if e := &etcdPoints[i]; !shown[e] {
					etcdRow(e, 0, 0)
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(etcdPoints) > 0 {
				fmt.Fprintf(out, "etcd (peer): %d members embedded in one process on loopback, WAL fsync on (etcd's default), clients over gRPC to the leader;\n"+
					"kiroku's clients propose on the leader in its process. × etcd = puts/s ÷ etcd's, p50 ÷ etcd = median latency ÷ etcd's.\n", etcdPoints[0].Members)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Nodes, "nodes", 3, "nodes in the group")
	f.StringVar(&clients, "clients", "1,64", "comma-separated client counts")
	f.StringVar(&values, "value-sizes", "100", "comma-separated value sizes in bytes")
	f.IntVar(&cfg.KeySize, "key-size", 8, "key bytes")
	f.StringVar(&policies, "policies", "entry,append,batch,count:10,count:100,none", "comma-separated log policies (see above)")
	f.DurationVar(&cfg.MaxWait, "max-wait", 2*time.Millisecond, "the longest count:N waits for N entries")
	f.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "unmeasured run before each point")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured run per point")
	f.StringVar(&cfg.Dir, "dir", "", "parent directory of the nodes' data (default: the temp dir)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.IntVar(&failover, "failover", 0, "then time this many failovers (see above)")
	f.BoolVar(&etcd, "etcd", true, "also measure etcd in this invocation, as the peer (see above); skipped with a message if it cannot be built")
	f.StringVar(&etcdClients, "etcd-clients", "", "comma-separated client counts for the etcd peer (default: --clients)")
	f.StringVar(&etcdDir, "etcd-dir", "", "directory of the module bench/etcdpeer (default: found in this checkout)")
	return cmd
}

// intList parses "1,64,1000".
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers separated by commas", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// joinInts prints 1,64,1000.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
