package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/bench"
)

func benchCassandraCommitLogCmd() *cobra.Command {
	var (
		cfg    bench.CommitLogConfig
		modes  string
		rates  string
		all    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "cassandra-commitlog",
		Short: "Cassandra's commit log in batch and group mode under an open-loop load of conditional writes",
		Long: `Seed 003's experiment on a real Cassandra 5.0. For each commit-log mode in --modes (batch, the
baseline, and group:WINDOW), starts a cluster with scripts/cassandra.sh start --commitlog MODE
(with a state file of its own, so it neither meets nor stops anyone else's cluster), and offers it
each rate in --rates, open loop: requests are issued at a fixed rate whatever became of the ones
before, and latency counts from when each was due. A request is a lightweight transaction as the
ledger writes: the first write of a key INSERT ... IF NOT EXISTS, each later one
UPDATE ... SET v = r IF v = r-1 (each key is written again --revisit later), at QUORUM/SERIAL.

For each point: achieved rate, mean/p50/p99 latency, the commit log's syncs per second (its msync
calls, counted from outside Cassandra by perf stat on the syscall tracepoints, or strace), the
commit-log entries per second (system_views.local_write_latency: every local write, Paxos state
included, is one entry) and entries per sync; with batch in the run, each group point's entries
per sync and mean latency as a ratio to batch's at the same rate.

--sync-delay D emulates a slow commit-log device: every msync of the Cassandra JVMs returns D late
(scripts/slowsync.sh). A mode's sweep stops after its first saturated point (under 90% of the
offered rate achieved, or over 1% of requests failed or unfinished) unless --all-rates.

Needs Java 17 and, the first time, Maven (scripts/cassandra.sh resolves Cassandra with it), and
perf (linux-perf) for --sync-counter perf. Each mode costs a cluster start (about 20-60 s).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			cfg.Modes = strings.Split(modes, ",")
			for i := range cfg.Modes {
				cfg.Modes[i] = strings.TrimSpace(cfg.Modes[i])
			}
			if cfg.Rates, err = parsePositiveRates(rates); err != nil {
				return err
			}
			cfg.StopAtSaturation = !all
			if err := cfg.Validate(); err != nil {
				return err
			}
			out, progress := cmd.OutOrStdout(), cmd.ErrOrStderr()
			started := time.Now().UTC()
			header := fmt.Sprintf("bench cassandra-commitlog: modes=%s rates=%s nodes=%d duration=%s warmup=%s value=%dB counter=%s cpus=%d %s",
				strings.Join(cfg.Modes, ","), rates, cfg.Nodes, cfg.Duration, cfg.Warmup, cfg.ValueSize, cfg.Counter,
				runtime.NumCPU(), started.Format(time.RFC3339))
			if cfg.SyncDelay > 0 {
				header += fmt.Sprintf("\nEMULATED SLOW DEVICE: every commit-log sync (msync) of Cassandra delayed by %s (--sync-delay, scripts/slowsync.sh)", cfg.SyncDelay)
			}
			fmt.Fprintln(progress, header)
			cells, runErr := bench.RunCommitLog(cmd.Context(), cfg, progress)
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(map[string]any{"started": started, "config": cfg, "cells": cells}); err != nil {
					return err
				}
				return runErr
			}
			if len(cells) > 0 {
				fmt.Fprintln(out, header)
				printCommitLog(out, cells)
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&modes, "modes", "batch,group:2ms,group:5ms,group:10ms", "commit-log modes: batch (the baseline) and group:WINDOW")
	f.StringVar(&rates, "rates", "100,250,500,1000,2000,4000", "offered rates, conditional writes per second")
	f.BoolVar(&all, "all-rates", false, "run every rate, even after a mode saturated")
	f.DurationVar(&cfg.Duration, "duration", 20*time.Second, "measured time per point")
	f.DurationVar(&cfg.Warmup, "warmup", 5*time.Second, "unmeasured time before each point, at its rate")
	f.DurationVar(&cfg.StartWarmup, "start-warmup", 20*time.Second, "unmeasured time at the first rate after a cluster starts")
	f.DurationVar(&cfg.Drain, "drain", 15*time.Second, "how long requests of the window may still take after it")
	f.IntVar(&cfg.MaxInFlight, "max-in-flight", 4096, "cap on requests in flight (a due request waits for a slot; its latency shows it)")
	f.DurationVar(&cfg.Revisit, "revisit", 2*time.Second, "a key is written again this long after its last write")
	f.IntVar(&cfg.ValueSize, "value-size", 100, "payload bytes per write")
	f.IntVar(&cfg.Rounds, "rounds", 1, "sweeps, modes in alternating order; cells are medians")
	f.IntVar(&cfg.Nodes, "nodes", 1, "Cassandra nodes (replication factor min(3, nodes))")
	f.StringVar(&cfg.Heap, "heap", "", "each node's -Xmx (default: scripts/cassandra.sh's)")
	f.StringArrayVar(&cfg.Yaml, "yaml", nil, "extra cassandra.yaml line, e.g. 'paxos_variant: v2' (repeatable)")
	f.DurationVar(&cfg.SyncDelay, "sync-delay", 0, "delay every commit-log sync by this much: an emulated slow device (labelled; never default)")
	f.StringVar(&cfg.Counter, "sync-counter", "perf", "how syncs are counted from outside Cassandra: perf, strace (costly) or none")
	f.StringVar(&cfg.Script, "script", "", "scripts/cassandra.sh (default: found in the checkout)")
	f.StringVar(&cfg.StateFile, "state", "", "scripts/cassandra.sh state file (default: a fresh temporary one)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func parsePositiveRates(s string) ([]float64, error) {
	var out []float64
	for _, r := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("bench: bad rate %q: want a positive number per second", r)
		}
		out = append(out, v)
	}
	return out, nil
}

func printCommitLog(w io.Writer, cells []bench.CommitLogCell) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\toffered/s\tachieved/s\tmean ms\tp50 ms\tp99 ms\tsyncs/s\tentries/s\tentries/sync\tentries/LWT\tpaxos\t"+
		"×batch entries/sync\t×batch mean\tnot applied\terrors\tcassandra CPUs\tCPU µs/write\tmachine CPUs\tload\t")
	hasBatch := false
	for _, c := range cells {
		vsE, vsM := "baseline", "baseline"
		if c.Mode != "batch" {
			vsE, vsM = "-", "-"
		} else {
			hasBatch = true
		}
		if c.VsBatch != nil {
			vsE, vsM = fmt.Sprintf("%.2f", c.VsBatch.EntriesPerSync), fmt.Sprintf("%.2f", c.VsBatch.Mean)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.2f\t%.2f\t%.0f%%\t%s\t%s\t%d\t%d\t%.2f\t%.0f\t%.2f\t%.1f\t\n",
			c.Mode, c.Offered, c.Achieved, c.MeanMs, c.P50Ms, c.P99Ms, c.SyncsPerSec, c.EntriesPerSec, c.EntriesPerSync,
			c.EntriesPerLWT, 100*c.PaxosShare, vsE, vsM, c.NotApplied, c.Errors+c.Unfinished, c.ServerCPUs, c.ServerCPUPerWrite, c.MachineCPUs, c.Load1)
	}
	tw.Flush()
	if hasBatch {
		fmt.Fprintln(w, "baseline: batch, same run (commitlog_sync: batch, a sync requested by every write); ×batch = this cell ÷ batch's at the same rate")
	} else {
		fmt.Fprintln(w, "baseline: none (batch was not among --modes)")
	}
}
