package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
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
		contacts string
		keyspace string
		profile  string
	)
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "Single-client Put/Get latency and bank-transfer throughput of a storage backend",
		Long: `Measures, on one storage backend:
  - single-client Put latency (upsert of a ValueSize-byte BLOB), conditional Put latency (a
    compare-and-set of the value just written: If v = old) and Get latency by primary key;
  - conditional puts/s from --workers goroutines, each on keys of its own;
  - committed transactions/s of a bank-transfer workload (read two accounts, write both,
    strictly serializable, conflicts retried) with --workers goroutines.
The baseline, measured in the same run and interleaved with it, is for --backend=engine (the
default) the same engine without its log, and for --backend=postgres the same work done with raw
pgx statements at the same isolation level: the cost of the PostgreSQL round trips alone. For
--backend=cassandra it is the same lightweight transactions sent with the raw gocql driver, and
kiroku is measured twice: its Store alone (each operation one request, no bank) and the Backend,
the coordinator's transactions over it (a single operation is a one-row transaction); the raw
bank is a read of both accounts and one compare-and-set per account, not atomic.
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
			case "cassandra":
				if contacts == "" {
					contacts = os.Getenv("KIROKU_CASSANDRA_CONTACTS")
				}
				if contacts == "" {
					return fmt.Errorf("bench storage: no --cassandra-contacts and no KIROKU_CASSANDRA_CONTACTS (scripts/cassandra.sh start prints them)")
				}
				// The Store as OpenStore gives it (reads at SERIAL), and the
				// Backend as the server opens it: the coordinator's
				// transactions over a store of its own (reads at QUORUM).
				store, err := backends.OpenStore(ctx, "cassandra", backends.Config{Contacts: contacts, Keyspace: keyspace})
				if err != nil {
					return err
				}
				defer store.Close()
				db, err := backends.Open(ctx, "cassandra", backends.Config{Contacts: contacts, Keyspace: keyspace})
				if err != nil {
					return err
				}
				defer db.Close()
				var hosts []string
				for _, h := range strings.Split(contacts, ",") {
					if h = strings.TrimSpace(h); h != "" {
						hosts = append(hosts, h)
					}
				}
				targets = []bench.Target{
					&bench.CassRaw{Contacts: hosts},
					&bench.StorageTarget{DB: store, Label: "kiroku cassandra, Store"},
					&bench.StorageTarget{DB: db, Label: "kiroku cassandra, coordinator"},
				}
			default:
				return fmt.Errorf("bench storage: unknown backend %q (have: engine, postgres, cassandra)", backend)
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "bench storage: backend=%s ops=%d value=%dB workers=%d accounts=%d duration=%s runs=%d cpus=%d %s\n",
					backend, cfg.Ops, cfg.ValueSize, cfg.Workers, cfg.Accounts, cfg.Duration, cfg.Runs, runtime.NumCPU(),
					time.Now().UTC().Format(time.RFC3339))
			}
			if profile != "" {
				stop, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stop()
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
			printRatios(out, runs)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&backend, "backend", "engine", "storage backend: engine (embedded, the default), postgres or cassandra")
	f.StringVar(&contacts, "cassandra-contacts", "", "Cassandra contact points, host:port,... (default $KIROKU_CASSANDRA_CONTACTS)")
	f.StringVar(&keyspace, "cassandra-keyspace", "kiroku_bench", "the keyspace kiroku's Cassandra tables are made in")
	f.StringVar(&dataDir, "data-dir", "", "the engine's data directory (default: a temporary one, removed after)")
	f.StringVar(&dsn, "dsn", "", "PostgreSQL DSN (default $KIROKU_PG_DSN)")
	f.Int32Var(&maxConns, "max-conns", 32, "connection pool size, for kiroku and the baseline alike")
	f.IntVar(&cfg.Ops, "ops", 2000, "single-client operations per latency measurement")
	f.IntVar(&cfg.ValueSize, "value-size", 100, "bytes per value")
	f.IntVar(&cfg.Workers, "workers", 16, "bank-transfer and conditional-put goroutines")
	f.IntVar(&cfg.Accounts, "accounts", 1000, "bank accounts")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "length of each bank run")
	f.IntVar(&cfg.Runs, "runs", 3, "repetitions (medians are reported)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the runs (setup included) to this file")
	return cmd
}

func printResults(w io.Writer, rs []bench.TargetResult) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tput p50 µs\tput p99 µs\tcond put p50 µs\tcond put p99 µs\tcond puts/s\tget p50 µs\tget p99 µs\tbank txn/s\tbank p50 µs\tbank p99 µs\tretries\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%d\t%d\t", r.Target, r.Put.P50Micros, r.Put.P99Micros,
			r.CondPut.P50Micros, r.CondPut.P99Micros, r.CondPutTPS, r.Get.P50Micros, r.Get.P99Micros)
		if r.NoBank {
			fmt.Fprintln(tw, "-\t-\t-\t-\t")
			continue
		}
		fmt.Fprintf(tw, "%.0f\t%d\t%d\t%d\t\n", r.Bank.TPS, r.Bank.Latency.P50Micros, r.Bank.Latency.P99Micros, r.Bank.Retries)
	}
	tw.Flush()
}

// printRatios prints each target's p50 latencies over the baseline's
// (the first target) in the same run, as the median over the runs.
func printRatios(w io.Writer, runs [][]bench.TargetResult) {
	if len(runs) == 0 || len(runs[0]) < 2 {
		return
	}
	med := func(f func(r []bench.TargetResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	fmt.Fprintf(w, "p50 over the baseline's in the same run (median of %d runs):\n", len(runs))
	for i := 1; i < len(runs[0]); i++ {
		ratio := func(lat func(bench.TargetResult) bench.Latency) float64 {
			return med(func(r []bench.TargetResult) float64 {
				return float64(lat(r[i]).P50Micros) / float64(max(1, lat(r[0]).P50Micros))
			})
		}
		fmt.Fprintf(w, "  %s: put %.2f×, cond put %.2f×, get %.2f×\n", runs[0][i].Target,
			ratio(func(r bench.TargetResult) bench.Latency { return r.Put }),
			ratio(func(r bench.TargetResult) bench.Latency { return r.CondPut }),
			ratio(func(r bench.TargetResult) bench.Latency { return r.Get }))
	}
}
