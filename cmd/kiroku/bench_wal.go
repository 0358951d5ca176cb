package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/bench"
)

func benchWALCmd() *cobra.Command {
	var (
		cfg      bench.WALConfig
		asJSON   bool
		baseline bool
		curve    bool
		rates    string
		modes    string
		profile  string
	)
	cmd := &cobra.Command{
		Use:   "wal",
		Short: "Append throughput, fsyncs and latency of the write-ahead log under a sync policy",
		Long: `Appends --record-size-byte records to a fresh log in --dir under one sync policy, from --writers
goroutines, closed loop (--rate=0) or open loop at --rate appends/s (latency then counts from when
each append was due). Prints appends/s, fsyncs/s, records per fsync and latency mean/p50/p99/p999.

--sync=raw is the physical reference: one goroutine writing --count records to a plain file and
fdatasyncing, no framing, no queue. Unless --baseline=false, every run of a policy is followed by a
raw run on the same disk, printed beside it.

--sync-delay adds a fixed delay to every fsync to emulate a slow device. It is labelled in the
output and is never on by default.

--curve runs every mode in --modes at every rate in --rates and prints one table.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			if cfg.Dir == "" {
				cfg.Dir = os.TempDir()
			}
			if profile != "" {
				stopProfile, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			var results []bench.WALResult
			run := func(c bench.WALConfig) error {
				r, err := bench.RunWAL(ctx, c)
				if err != nil {
					return err
				}
				results = append(results, r)
				if !asJSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "  %s @ %s: %.0f appends/s\n", r.Policy, rateLabel(r.OfferedRate), r.AppendsPerSec)
				}
				return nil
			}
			if !asJSON {
				fmt.Fprintf(out, "bench wal: dir=%s record=%dB writers=%d duration=%s %s\n", cfg.Dir, cfg.RecordSize, cfg.Writers,
					cfg.Duration, time.Now().UTC().Format(time.RFC3339))
				if cfg.SyncDelay > 0 {
					fmt.Fprintf(out, "EMULATED SLOW DEVICE: every fsync delayed by %v (--sync-delay)\n", cfg.SyncDelay)
				}
			}
			if curve {
				ms, err := parseModes(modes, cfg.Window)
				if err != nil {
					return err
				}
				rs, err := parseRates(rates)
				if err != nil {
					return err
				}
				for _, rate := range rs {
					for _, m := range ms {
						c := cfg
						c.Mode, c.Window, c.Rate = m.mode, m.window, rate
						if err := run(c); err != nil {
							return err
						}
					}
				}
			} else if err := run(cfg); err != nil {
				return err
			}
			if baseline && (curve || cfg.Mode != "raw") {
				c := cfg
				c.Mode, c.Rate = "raw", 0
				if err := run(c); err != nil {
					return err
				}
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(results)
			}
			printWAL(out, results)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Mode, "sync", "group", "sync policy: batch, group, count, periodic, or raw (the physical reference)")
	f.DurationVar(&cfg.Window, "window", 10*time.Millisecond, "group window; count's max wait; periodic's interval")
	f.IntVar(&cfg.Count, "count", 100, "count policy's threshold; records per fdatasync for raw")
	f.Float64Var(&cfg.Rate, "rate", 0, "appends/s offered, open loop; 0 = closed loop")
	f.IntVar(&cfg.Writers, "writers", 64, "appending goroutines")
	f.IntVar(&cfg.RecordSize, "record-size", 128, "payload bytes per record")
	f.DurationVar(&cfg.Duration, "duration", 20*time.Second, "measured time per run")
	f.StringVar(&cfg.Dir, "dir", "", "directory on the disk to measure (default: the system temp dir)")
	f.DurationVar(&cfg.SyncDelay, "sync-delay", 0, "add this to every fsync, to emulate a slow device (labelled; never default)")
	f.Int64Var(&cfg.SegmentSize, "segment-size", 0, "segment size in bytes (0 = the log's default, 64 MiB)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&baseline, "baseline", true, "also measure raw on the same disk in the same run")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the runs to this file")
	f.BoolVar(&curve, "curve", false, "sweep --modes over --rates")
	f.StringVar(&rates, "rates", "500,1000,2000,5000,10000,20000,50000,0", "with --curve: offered rates (0 = closed loop)")
	f.StringVar(&modes, "modes", "batch,group:1ms,group:2ms,group:5ms,group:10ms", "with --curve: modes, group:WINDOW for group")
	return cmd
}

type modeSpec struct {
	mode   string
	window time.Duration
}

// parseModes reads --modes; a mode without ":WINDOW" takes --window.
func parseModes(s string, window time.Duration) ([]modeSpec, error) {
	var out []modeSpec
	for _, m := range strings.Split(s, ",") {
		name, w, hasW := strings.Cut(strings.TrimSpace(m), ":")
		spec := modeSpec{mode: name, window: window}
		if hasW {
			d, err := time.ParseDuration(w)
			if err != nil {
				return nil, fmt.Errorf("bench wal: mode %q: %w", m, err)
			}
			spec.window = d
		}
		out = append(out, spec)
	}
	return out, nil
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, r := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bench wal: bad rate %q", r)
		}
		out = append(out, v)
	}
	return out, nil
}

func rateLabel(r float64) string {
	if r == 0 {
		return "closed loop"
	}
	return fmt.Sprintf("%.0f/s", r)
}

func printWAL(w io.Writer, rs []bench.WALResult) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\toffered\twriters\tappends/s\tfsyncs/s\trec/fsync\tmean µs\tp50 µs\tp99 µs\tp999 µs\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.1f\t%.0f\t%d\t%d\t%d\t\n", r.Policy, rateLabel(r.OfferedRate), r.Writers,
			r.AppendsPerSec, r.FsyncsPerSec, r.RecordsPerFsync, r.MeanMicros, r.P50Micros, r.P99Micros, r.P999Micros)
	}
	tw.Flush()
}
