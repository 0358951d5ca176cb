package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/bench"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage/backends"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that print their figures next to a baseline measured in the same run",
	}
	cmd.AddCommand(benchStorageCmd(), benchWALCmd(), benchEngineCmd(), benchLedgerCmd(), benchValidateCmd(), benchRaftCmd(),
		benchCassandraCommitLogCmd())
	return cmd
}

func benchStorageCmd() *cobra.Command {
	var (
		cfg      bench.StorageConfig
		backend  string
		dsn      string
		dataDir  string
		maxConns int32
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "Single-client Put/Get latency and bank-transfer throughput of a storage backend",
		Long: `Measures, on one storage backend:
  - single-client Put latency (upsert of a ValueSize-byte BLOB) and Get latency by primary key;
  - committed transactions/s of a bank-transfer workload (read two accounts, write both,
    strictly serializable, conflicts retried) with --workers goroutines.
The baseline, measured in the same run and interleaved with it, is for --backend=engine (the
default) the same engine without its log, and for --backend=postgres the same work done with raw
pgx statements at the same isolation level: the cost of the PostgreSQL round trips alone.
Each figure is reported per run and as the median over --runs runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			var targets []bench.Target
			switch backend {
			case "engine":
				dir := dataDir
				if dir == "" {
					tmp, err := os.MkdirTemp("", "kiroku-bench-storage-*")
					if err != nil {
						return err
					}
					defer os.RemoveAll(tmp)
					dir = tmp
				}
				// The baseline is the same engine without its log: what
				// durability costs.
				nolog, err := backends.Open(ctx, "engine", backends.Config{Dir: filepath.Join(dir, "nolog"), Engine: engine.Config{Log: engine.LogNone}})
				if err != nil {
					return err
				}
				defer nolog.Close()
				db, err := backends.Open(ctx, "engine", backends.Config{Dir: filepath.Join(dir, "engine")})
				if err != nil {
					return err
				}
				defer db.Close()
				targets = []bench.Target{
					&bench.StorageTarget{DB: nolog, Label: "kiroku engine, no log (baseline)"},
					&bench.StorageTarget{DB: db, Label: "kiroku engine"},
				}
			case "postgres":
				if dsn == "" {
					dsn = os.Getenv("KIROKU_PG_DSN")
				}
				if dsn == "" {
					return fmt.Errorf("bench storage: no --dsn and no KIROKU_PG_DSN (scripts/pg.sh start prints one)")
				}
				db, err := backends.Open(ctx, "postgres", backends.Config{DSN: dsn, MaxConns: int(maxConns)})
				if err != nil {
					return err
				}
				defer db.Close()
				targets = []bench.Target{
					&bench.PGRaw{DSN: dsn, MaxConns: maxConns},
					&bench.StorageTarget{DB: db, Label: "kiroku postgres"},
				}
			default:
				return fmt.Errorf("bench storage: unknown backend %q (have: engine, postgres)", backend)
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "bench storage: backend=%s ops=%d value=%dB workers=%d accounts=%d duration=%s runs=%d cpus=%d %s\n",
					backend, cfg.Ops, cfg.ValueSize, cfg.Workers, cfg.Accounts, cfg.Duration, cfg.Runs, runtime.NumCPU(),
					time.Now().UTC().Format(time.RFC3339))
			}
			runs, err := bench.RunStorage(ctx, cfg, targets, func(r bench.TargetResult) {
				if !asJSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "  measured %s\n", r.Target)
				}
			})
			if err != nil {
				return err
			}
			med := bench.Median(runs)
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"runs": runs, "median": med})
			}
			for i, r := range runs {
				fmt.Fprintf(out, "run %d\n", i+1)
				printResults(out, r)
			}
			fmt.Fprintf(out, "median of %d runs\n", len(runs))
			printResults(out, med)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&backend, "backend", "engine", "storage backend: engine (embedded, the default) or postgres")
	f.StringVar(&dataDir, "data-dir", "", "the engine's data directory (default: a temporary one, removed after)")
	f.StringVar(&dsn, "dsn", "", "PostgreSQL DSN (default $KIROKU_PG_DSN)")
	f.Int32Var(&maxConns, "max-conns", 32, "connection pool size, for kiroku and the baseline alike")
	f.IntVar(&cfg.Ops, "ops", 2000, "single-client operations per latency measurement")
	f.IntVar(&cfg.ValueSize, "value-size", 100, "bytes per value")
	f.IntVar(&cfg.Workers, "workers", 16, "bank-transfer goroutines")
	f.IntVar(&cfg.Accounts, "accounts", 1000, "bank accounts")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "length of each bank run")
	f.IntVar(&cfg.Runs, "runs", 3, "repetitions (medians are reported)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printResults(w io.Writer, rs []bench.TargetResult) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tput p50 µs\tput p99 µs\tget p50 µs\tget p99 µs\tbank txn/s\tbank p50 µs\tbank p99 µs\tretries\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%d\t%d\t%d\t\n", r.Target, r.Put.P50Micros, r.Put.P99Micros,
			r.Get.P50Micros, r.Get.P99Micros, r.Bank.TPS, r.Bank.Latency.P50Micros, r.Bank.Latency.P99Micros, r.Bank.Retries)
	}
	tw.Flush()
}
