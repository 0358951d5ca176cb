package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/bench"
)

func benchEngineCmd() *cobra.Command {
	var (
		cfg      bench.EngineConfig
		runs     int
		baseline bool
		diskBase bool
		slice    time.Duration
		asJSON   bool
		profile  string
	)
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Committed txn/s, abort rate and commit-to-durable latency of the embedded engine",
		Long: `Loads --records rows (--key-size-byte keys, --value-size-byte values, uniform keys) into a fresh
engine in --dir and runs a YCSB workload for --duration:

  ycsb-wo  --ops-per-txn updates per transaction (seed 002's write-only workload)
  ycsb-a   half reads, half updates        ycsb-c  reads only
  ycsb-f   read-modify-write of each key

--threads workers commit without waiting for durability, as Silo's workers do; a watcher notes
when each epoch becomes durable, which gives their commit-to-durable latency. --sync-clients
clients each wait for durability before their next transaction, as a server's clients do; their
latency is begin-to-durable. --threads defaults to 2, or to 0 when --sync-clients is set.

Unless --baseline=false, each --log=wal run is followed by the same run with --log=none, the
engine without logging, printed beside it. --runs repeats both and prints the median run by
throughput, whole (its latencies too); for an even --runs, the faster of the two middle runs.

--disk-baseline adds a third run: --log=none while a background writer asks the disk to write
what the --log=wal run did (bytes a second, from /proc/self/io: records, zero-fill and
checkpoints), with direct I/O from a reused buffer over a file the size of the log's files. It
measures what the disk writes alone take from the workload, which on a virtual machine is more
than their system calls.

--interleave=S loads one engine with the log and one without and runs them in turn, in slices of
S (wal, none, none, wal, wal, ...), until each has run for --duration; it prints each mode's
throughput over all its slices and the cost between them. On a shared machine whose speed drifts
from one run to the next, slices a second long compare like with like. A wal slice runs on while
a checkpoint is being written, so the checkpoints' cost stays in the wal mode's time. Latencies
are not measured in this mode.

--recovery checkpoints after the load and, after the run, closes the engine and times reopening it:
loading the checkpoint and replaying the run's log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if cfg.Dir == "" {
				cfg.Dir = os.TempDir()
			}
			if !cmd.Flags().Changed("threads") {
				cfg.Threads = 2
				if cfg.SyncClients > 0 {
					cfg.Threads = 0
				}
			}
			if runs < 1 {
				return fmt.Errorf("--runs must be at least 1")
			}
			if profile != "" {
				stopProfile, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			if slice != 0 {
				if runs != 1 || !baseline || diskBase || cfg.Log != "wal" {
					return fmt.Errorf("--interleave compares wal with none in one run: it takes neither --runs, --baseline=false, --disk-baseline nor --log=none")
				}
				return benchInterleaved(cmd, cfg, slice, asJSON)
			}
			configs := []bench.EngineConfig{cfg}
			if baseline && cfg.Replicas > 0 {
				// The same engine with its local WAL, in the same invocation.
				b := cfg
				b.Replicas = 0
				configs = append(configs, b)
				if diskBase {
					return fmt.Errorf("--disk-baseline does not go with --replicas")
				}
			} else if baseline && cfg.Log == "wal" {
				b := cfg
				b.Log = "none"
				configs = append(configs, b)
				if diskBase {
					configs = append(configs, b)
				}
			} else if diskBase {
				return fmt.Errorf("--disk-baseline needs --log=wal and --baseline")
			}
			all := make([][]bench.EngineResult, len(configs))
			for run := range runs {
				for i, c := range configs {
					name := "log=" + c.Log
					if c.Replicas > 0 {
						name = fmt.Sprintf("log replicated to %d followers", c.Replicas)
					}
					if i == 2 {
						w := all[0][run]
						if w.DiskWriteRate <= 0 {
							return fmt.Errorf("bench engine: the wal run's disk writes are unknown (/proc/self/io)")
						}
						c.DiskLoad = &bench.DiskLoad{Rate: w.DiskWriteRate, Span: w.LogSpan}
						name += " + disk writes " + c.DiskLoad.String()
					}
					r, err := bench.RunEngine(ctx, c)
					if err != nil {
						return fmt.Errorf("bench engine (%s): %w", name, err)
					}
					all[i] = append(all[i], r)
					if !asJSON {
						fmt.Fprintf(cmd.ErrOrStderr(), "  run %d %s: %.0f txn/s, %.2f CPU µs/txn\n", run+1, name, r.TxnPerSec, r.CPUMicros)
					}
				}
			}
			medians := make([]bench.EngineResult, len(all))
			for i, rs := range all {
				byTPS := slices.Clone(rs) // all keeps the run order for --json
				sort.Slice(byTPS, func(a, b int) bool { return byTPS[a].TxnPerSec < byTPS[b].TxnPerSec })
				medians[i] = byTPS[len(byTPS)/2]
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"runs": all, "median": medians})
			}
			fmt.Fprintf(out, "bench engine: %s ops/txn=%d records=%d key=%dB value=%dB threads=%d sync-clients=%d epoch=%v duration=%v runs=%d %s\n",
				cfg.Workload, cfg.OpsPerTxn, cfg.Records, cfg.KeySize, cfg.ValueSize, cfg.Threads, cfg.SyncClients, cfg.Epoch,
				cfg.Duration, runs, time.Now().UTC().Format(time.RFC3339))
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "log\tcommitted txn/s\tabort rate\tsync durable txn/s\tsync begin→durable p50 ms\tp99 ms\tcommit→durable p50 ms\tp99 ms\tCPU µs/txn\tload s\t")
			for i, r := range medians {
				label := r.Log
				switch {
				case r.Replicas > 0 && cfg.PersistOnly:
					label = fmt.Sprintf("raft, %d followers persisting", r.Replicas)
				case r.Replicas > 0:
					label = fmt.Sprintf("raft, %d followers applying", r.Replicas)
				case cfg.Replicas > 0:
					label = "wal (baseline)"
				case i == 2:
					label = "none + wal's disk writes"
				case r.Log == "none":
					label = "none (baseline)"
				}
				fmt.Fprintf(tw, "%s\t%.0f\t%.4f\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%.1f\t\n", label, r.TxnPerSec, r.AbortRate, r.SyncTxnPerSec,
					r.SyncP50, r.SyncP99, r.DurableP50, r.DurableP99, r.CPUMicros, r.LoadSeconds)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, r := range medians {
				if r.Log == "wal" && cfg.Recovery {
					fmt.Fprintf(out, "recovery: %.2f s for a checkpoint of %d rows (written in %.2f s) plus %.0f MB of log\n",
						r.RecoverySeconds, cfg.Records, r.CheckpointSeconds, float64(r.LogBytes)/1e6)
				}
			}
			if r := medians[0]; r.Replicas > 0 {
				fmt.Fprintf(out, "replicated: %.0f bytes of engine log per transaction", r.ReplicatedBytesPerTxn)
				if len(medians) >= 2 && medians[1].TxnPerSec > 0 {
					fmt.Fprintf(out, "; %.1f%% of the local WAL's throughput; CPU per transaction (every member in this process) %+.1f%%",
						100*r.TxnPerSec/medians[1].TxnPerSec, 100*(r.CPUMicros/medians[1].CPUMicros-1))
				}
				fmt.Fprintln(out)
				if len(r.CPUByMember) > 0 {
					fmt.Fprintf(out, "CPU µs per transaction by member (from a CPU profile):")
					for _, m := range slices.Sorted(maps.Keys(r.CPUByMember)) {
						name := "clients"
						switch {
						case m == strconv.FormatUint(r.Leader, 10):
							name = "member " + m + " (leader)"
						case m != "":
							name = "member " + m
						}
						fmt.Fprintf(out, " %s %.2f;", name, r.CPUByMember[m])
					}
					fmt.Fprintln(out)
				}
				return nil
			}
			if len(medians) >= 2 && medians[1].TxnPerSec > 0 {
				fmt.Fprintf(out, "logging cost: %.1f%% of the no-log throughput; CPU per transaction %+.1f%%\n",
					100*(1-medians[0].TxnPerSec/medians[1].TxnPerSec), 100*(medians[0].CPUMicros/medians[1].CPUMicros-1))
			}
			if len(medians) == 3 && medians[2].TxnPerSec > 0 {
				d := medians[2]
				fmt.Fprintf(out, "disk writes alone (%.0f MB/s): %.1f%% of the no-log throughput; logging beyond them: %.1f%% of the throughput under them\n",
					d.DiskWriteRate/1e6, 100*(1-d.TxnPerSec/medians[1].TxnPerSec), 100*(1-medians[0].TxnPerSec/d.TxnPerSec))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Workload, "workload", "ycsb-wo", "ycsb-wo, ycsb-a, ycsb-c or ycsb-f")
	f.IntVar(&cfg.OpsPerTxn, "ops-per-txn", 10, "operations per transaction")
	f.IntVar(&cfg.Records, "records", 1_000_000, "rows loaded before the run")
	f.IntVar(&cfg.KeySize, "key-size", 8, "key bytes (at least 8)")
	f.IntVar(&cfg.ValueSize, "value-size", 8, "value bytes")
	f.IntVar(&cfg.Threads, "threads", 2, "workers committing without waiting for durability")
	f.IntVar(&cfg.SyncClients, "sync-clients", 0, "clients waiting for durability after each transaction")
	f.StringVar(&cfg.Log, "log", "wal", "wal or none")
	f.DurationVar(&cfg.Epoch, "epoch", 40*time.Millisecond, "epoch interval")
	f.BoolVar(&cfg.PersistOnly, "persist-only", false, "with --replicas: followers keep the log without applying it (seed 002's setting), not hot standbys")
	f.IntVar(&cfg.Replicas, "replicas", 0, "replicate the log through a Raft group with this many followers in this process (seed 002); 0: the local WAL")
	f.IntVar(&cfg.RoundsInFlight, "rounds-in-flight", 0, "log rounds a logger may have proposed and not yet durable (default: the engine's, 1)")
	f.IntVar(&cfg.LogBuffer, "log-buffer", 0, "bytes at which a worker hands its log buffer to the logger (default: the engine's, 512 KiB)")
	f.DurationVar(&cfg.Duration, "duration", 20*time.Second, "measured time per run")
	f.StringVar(&cfg.Dir, "dir", "", "parent directory of the data (default: the temp dir)")
	f.IntVar(&runs, "runs", 1, "repetitions; the median run is printed (odd counts give a true median)")
	f.BoolVar(&baseline, "baseline", true, "also run --log=none in the same invocation")
	f.BoolVar(&diskBase, "disk-baseline", false, "also run --log=none under the wal run's disk writes (see above)")
	f.DurationVar(&slice, "interleave", 0, "run wal and none in turn, in slices this long (see above)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&cfg.Recovery, "recovery", false, "checkpoint after the load, then time recovery (checkpoint plus the run's log) after the run")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the runs to this file")
	return cmd
}

// benchInterleaved runs and prints bench engine --interleave.
func benchInterleaved(cmd *cobra.Command, cfg bench.EngineConfig, slice time.Duration, asJSON bool) error {
	r, err := bench.RunEngineInterleaved(cmd.Context(), cfg, slice)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(out, "bench engine: %s ops/txn=%d records=%d key=%dB value=%dB threads=%d epoch=%v duration=%v interleaved in slices of %v %s\n",
		cfg.Workload, cfg.OpsPerTxn, cfg.Records, cfg.KeySize, cfg.ValueSize, cfg.Threads, cfg.Epoch, cfg.Duration, slice,
		time.Now().UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "log\tcommitted txn/s\tabort rate\tCPU µs/txn\tslices\tseconds\tload s\t")
	for _, m := range []bench.EngineResult{r.WAL, r.None} {
		label := m.Log
		if label == "none" {
			label = "none (baseline)"
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.4f\t%.2f\t%d\t%.1f\t%.1f\t\n", label, m.TxnPerSec, m.AbortRate, m.CPUMicros,
			len(r.Slices)/2, m.Seconds, m.LoadSeconds)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.None.TxnPerSec > 0 && r.None.CPUMicros > 0 {
		q := slices.Clone(r.PairCosts)
		slices.Sort(q)
		fmt.Fprintf(out, "logging cost: %.1f%% of the no-log throughput; CPU per transaction %+.1f%%\n",
			100*r.Cost, 100*(r.WAL.CPUMicros/r.None.CPUMicros-1))
		fmt.Fprintf(out, "pairs of slices: cost median %.1f%%, quartiles %.1f%% and %.1f%%; wal slices ran %.1f s past their length for checkpoints\n",
			100*r.MedianCost(), 100*q[len(q)/4], 100*q[(3*len(q))/4], r.Extended)
	}
	return nil
}

// startCPUProfile profiles the process into path until the returned
// function is called.
func startCPUProfile(path string) (func(), error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); pf.Close() }, nil
}
