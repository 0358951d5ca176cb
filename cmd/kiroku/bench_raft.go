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
			fmt.Fprintf(errw, "bench raft: %d nodes, %s per run after %s warmup, policies %s\n", cfg.Nodes, cfg.Duration, cfg.Warmup, strings.Join(cfg.Policies, ","))
			points, err := bench.RunRaft(cmd.Context(), cfg, func(p bench.RaftPoint) {
				fmt.Fprintf(errw, "  %s, %d clients, %d-byte values: %.0f puts/s, p50 %.2f ms\n", p.Policy, p.Clients, p.ValueSize, p.PutsPerS, p.P50ms)
			})
			if err != nil {
				return err
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
				return enc.Encode(map[string]any{"nodes": cfg.Nodes, "duration_s": cfg.Duration.Seconds(), "max_wait_ms": cfg.MaxWait.Seconds() * 1000,
					"points": points, "failover_ms": failoverMS})
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
			fmt.Fprintln(tw, "value B\tclients\tpolicy\tputs/s\t× entry\t× none\tp50 ms\tp99 ms\tCPU µs/put\t")
			base := func(p bench.RaftPoint, pol string) float64 {
				for _, q := range points {
					if q.Policy == pol && q.Clients == p.Clients && q.ValueSize == p.ValueSize {
						return q.PutsPerS
					}
				}
				return 0
			}
			for _, p := range points {
				name := p.Policy
				if p.Unsafe {
					name += " (UNSAFE)"
				}
				fmt.Fprintf(tw, "%d\t%d\t%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t\n", p.ValueSize, p.Clients, name, p.PutsPerS,
					p.PutsPerS/base(p, "entry"), p.PutsPerS/base(p, "none"), p.P50ms, p.P99ms, p.CPUus)
			}
			return tw.Flush()
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
