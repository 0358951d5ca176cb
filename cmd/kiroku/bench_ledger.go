package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/bench"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/internal/cpuset"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/cassandra"
	"github.com/kiroku-db/kiroku/validator"
)

func benchLedgerCmd() *cobra.Command {
	var (
		cfg                    bench.LedgerConfig
		threads, authName      string
		serverAddr, configFile string
		backend, dsn, dataDir  string
		contacts, keyspace     string
		asJSON                 bool
		profile                string
		validatorMode          string
		vf                     validatorFlags
		split                  bool
	)
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Seed 000's YCSB-C / YCSB-F on the ledger, through gRPC, proofs on",
		Long: `Loads --records assets (the built-in bulk loader, with a progress bar) and runs the workload
closed-loop at each --threads count: YCSB-C executes builtin.ycsb_c (reads 2 uniformly chosen
assets), YCSB-F builtin.ycsb_f (reads one and writes it back with a new --payload-byte payload).
Requests are signed and proofs made with --auth (hmac: HMAC-SHA256 both ways; ecdsa: ECDSA P-256
both ways). Without --server, a server is started in this process on loopback over
--backend (engine in --data-dir or a temporary directory, postgres at --postgres-dsn, or
cassandra at --cassandra-contacts). Several backends, comma-separated, each get a server and take
turns at every thread count, so that they are measured in the same run. On Cassandra each point
also reports the requests the store sent per committed transaction: round trips, lightweight
transactions and SERIAL reads.
The baseline, per thread count and in the same run, is the floor of the path: GetTxState
round trips/s through the same client and server (no signature, one storage read).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			for _, s := range strings.Split(threads, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 {
					return fmt.Errorf("--threads: %q is not a positive count", s)
				}
				cfg.Threads = append(cfg.Threads, n)
			}
			scheme, err := auth.ParseScheme(authName)
			if err != nil {
				return fmt.Errorf("--auth: %w", err)
			}
			if validatorMode != "on" && cfg.Rounds != 1 {
				return errors.New("--rounds alternates the runs with and without the Validator: it needs --validator on")
			}
			if split && serverAddr != "" {
				return errors.New("--split starts its own server; it cannot be used with --server")
			}
			names := strings.Split(backend, ",")
			if len(names) > 1 && (serverAddr != "" || validatorMode == "on" || dataDir != "") {
				return errors.New("--backend with several backends starts a server for each: it cannot be used with --server, --validator on or --data-dir")
			}
			if contacts == "" {
				contacts = os.Getenv("KIROKU_CASSANDRA_CONTACTS")
			}
			if dsn == "" {
				dsn = os.Getenv("KIROKU_PG_DSN")
			}
			errw := cmd.ErrOrStderr()
			// One server (and client) per backend, each loaded before any
			// is measured.
			runs := make([]*ledgerRun, len(names))
			for i, name := range names {
				name = strings.TrimSpace(name)
				c, proofKey, clocks, cleanup, err := benchLedgerClient(ctx, scheme, serverAddr, configFile,
					benchBackend{name: name, dsn: dsn, contacts: contacts, keyspace: keyspace}, dataDir, split, errw)
				if err != nil {
					return err
				}
				defer cleanup()
				r := &ledgerRun{backend: name, c: c, exec: c, cfg: cfg}
				runs[i] = r
				r.cfg.CPU, r.cfg.ServerCPU, r.cfg.Store = clocks.all, clocks.server, clocks.store
				if _, _, err := bench.MachineCPU(); err == nil {
					r.cfg.Machine = bench.MachineCPU
				}
				switch validatorMode {
				case "on":
					v, closeV, err := benchValidator(ctx, &vf, c, proofKey)
					if err != nil {
						return err
					}
					defer closeV()
					r.exec = v
				case "off":
				default:
					return fmt.Errorf("--validator: %q is neither on nor off", validatorMode)
				}
				if len(names) > 1 {
					fmt.Fprintf(errw, "backend %s:\n", name)
				}
				if r.load, err = bench.LoadLedger(ctx, c, r.exec, r.cfg, errw); err != nil {
					return err
				}
				if r.load.Skipped {
					fmt.Fprintf(errw, "%d assets already loaded\n", cfg.Records)
				} else {
					fmt.Fprintf(errw, "loaded %d assets in %.1fs (%.0f assets/s)\n", r.load.Records, r.load.Seconds, float64(r.load.Records)/r.load.Seconds)
				}
			}
			if profile != "" {
				stopProfile, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			progress := func(name string) func(p bench.LedgerPoint) {
				return func(p bench.LedgerPoint) {
					if len(names) > 1 {
						fmt.Fprintf(errw, "%s ", name)
					}
					fmt.Fprintf(errw, "threads %d: %.0f tx/s, p50 %.2f ms, p99 %.2f ms, CPU %s µs/tx, CPUs busy %s, machine %s, floor %.0f rpc/s%s\n",
						p.Threads, p.TPS, float64(p.Latency.P50Micros)/1000, float64(p.Latency.P99Micros)/1000, cpuCell(p.CPUMicros), busyCell(p), machineCell(p), p.FloorRPS, storeNote(p))
					if p.Errors > 0 {
						fmt.Fprintf(errw, "  %d calls failed; the first: %s\n", p.Errors, p.FirstError)
					}
					if p.Off != nil {
						fmt.Fprintf(errw, "  validator off: %.0f tx/s, p50 %.2f ms, CPUs busy %s, machine %s\n", p.Off.TPS, float64(p.Off.Latency.P50Micros)/1000, busyCell(*p.Off), machineCell(*p.Off))
					}
					if len(p.RoundsTPS) > 1 {
						fmt.Fprintf(errw, "  medians of %d rounds; tx/s on %s, off %s\n", len(p.RoundsTPS), roundsCell(p.RoundsTPS), roundsCell(p.Off.RoundsTPS))
					}
				}
			}
			if len(runs) == 1 {
				r := runs[0]
				var err error
				if r.points, err = bench.RunLedger(ctx, r.c, r.exec, r.cfg, progress(r.backend)); err != nil {
					return err
				}
			} else {
				// The backends take turns at each thread count, so that the
				// machine's drift hits them alike.
				for i, threads := range cfg.Threads {
					for _, r := range runs {
						one := r.cfg
						one.Threads = []int{threads}
						one.Seed = r.cfg.Seed + uint64(i)*1_000_000
						ps, err := bench.RunLedger(ctx, r.c, r.exec, one, progress(r.backend))
						if err != nil {
							return err
						}
						r.points = append(r.points, ps...)
					}
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				var docs []map[string]any
				for _, r := range runs {
					be := r.backend
					if serverAddr != "" {
						be = "server " + serverAddr
					} else if split {
						be += " (server process on its own CPU, clients on the others)"
					}
					docs = append(docs, map[string]any{"workload": cfg.Workload, "auth": authName, "backend": be,
						"payload": cfg.Payload, "load": r.load, "validator": validatorMode, "validator_db": vf.db, "points": r.points})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if len(docs) == 1 {
					return enc.Encode(docs[0])
				}
				return enc.Encode(map[string]any{"backends": docs})
			}
			for _, r := range runs {
				be := r.backend
				if serverAddr != "" {
					be = "server " + serverAddr
				} else if split {
					be += " (server process on its own CPU, clients on the others)"
				}
				if err := printLedgerPoints(out, cfg, authName, be, validatorMode, r.points); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Workload, "workload", "ycsb-f", "ycsb-c or ycsb-f")
	f.IntVar(&cfg.Records, "records", 1_000_000, "assets to load")
	f.IntVar(&cfg.Payload, "payload", 100, "payload bytes per asset")
	f.StringVar(&threads, "threads", "1,4,16,32,64", "comma-separated client thread counts")
	f.StringVar(&authName, "auth", "hmac", "hmac or ecdsa, for requests and proofs")
	f.DurationVar(&cfg.Warmup, "warmup", 10*time.Second, "unmeasured run before each thread count")
	f.DurationVar(&cfg.Duration, "duration", 60*time.Second, "measured run per thread count")
	f.IntVar(&cfg.LoadBatch, "load-batch", 200, "assets per bulk-load transaction")
	f.IntVar(&cfg.Loaders, "loaders", 4, "concurrent bulk-load requests")
	f.StringVar(&serverAddr, "server", "", "benchmark a running server (identity and admin token from --config)")
	f.StringVar(&configFile, "config", "", "client config for --server")
	f.StringVar(&backend, "backend", "engine", "without --server: engine, postgres or cassandra; several, comma-separated, take turns at each thread count")
	f.StringVar(&dsn, "postgres-dsn", "", "PostgreSQL DSN for --backend=postgres (default $KIROKU_PG_DSN)")
	f.StringVar(&contacts, "cassandra-contacts", "", "Cassandra contact points HOST:PORT,... for --backend=cassandra (default $KIROKU_CASSANDRA_CONTACTS)")
	f.StringVar(&keyspace, "cassandra-keyspace", "kiroku_bench_ledger", "the keyspace for --backend=cassandra; a loaded one is reused")
	f.StringVar(&dataDir, "data-dir", "", "without --server: the server's data directory (default: temporary)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the measured runs to this file")
	f.StringVar(&validatorMode, "validator", "off", "on: execute through a Validator (logging phase), and run each point again with it off")
	f.IntVar(&cfg.Rounds, "rounds", 1, "with --validator on: rounds of the logged and unlogged runs, alternating which goes first; the medians are reported")
	f.BoolVar(&split, "split", false, "start the server as a child process pinned to one CPU, and run the clients (and Validator) on the others")
	vf.add(cmd)
	return cmd
}

// ledgerRun is one backend's server, client and figures in a ledger
// benchmark.
type ledgerRun struct {
	backend string
	c       *client.Client
	exec    bench.Executor
	cfg     bench.LedgerConfig
	load    bench.LedgerLoad
	points  []bench.LedgerPoint
}

// printLedgerPoints prints one backend's table.
func printLedgerPoints(out io.Writer, cfg bench.LedgerConfig, authName, be, validatorMode string, points []bench.LedgerPoint) error {
	per := cfg.Duration.String() + " per point"
	if validatorMode == "on" && cfg.Rounds > 1 {
		per = fmt.Sprintf("%s per run, medians of %d alternating rounds", cfg.Duration, cfg.Rounds)
	}
	fmt.Fprintf(out, "ledger %s, auth %s, proofs on, backend %s, validator %s, %d assets × %d-byte payload, %s\n",
		cfg.Workload, authName, be, validatorMode, cfg.Records, cfg.Payload, per)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	if validatorMode == "on" {
		fmt.Fprintf(tw, "threads\ttx/s\tp50 ms\tp99 ms\terrors\tCPU µs/tx\tCPUs busy\tmachine\toff tx/s\toff p50 ms\toff p99 ms\toff CPU µs/tx\toff CPUs busy\toff machine\tlogging cost\tfloor rpc/s\t\n")
		for _, p := range points {
			fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%d\t%s\t%s\t%s\t%.0f\t%.2f\t%.2f\t%s\t%s\t%s\t%.1f%%\t%.0f\t\n", p.Threads, p.TPS,
				float64(p.Latency.P50Micros)/1000, float64(p.Latency.P99Micros)/1000, p.Errors, cpuCell(p.CPUMicros), busyCell(p), machineCell(p), p.Off.TPS,
				float64(p.Off.Latency.P50Micros)/1000, float64(p.Off.Latency.P99Micros)/1000, cpuCell(p.Off.CPUMicros), busyCell(*p.Off), machineCell(*p.Off),
				100*(1-p.TPS/p.Off.TPS), p.FloorRPS)
		}
		return tw.Flush()
	}
	store := len(points) > 0 && points[0].Store != nil
	fmt.Fprint(tw, "threads\ttx/s\tp50 ms\tp99 ms\terrors\tCPU µs/tx\tCPUs busy\tmachine\tfloor rpc/s (baseline)\t")
	if store {
		fmt.Fprint(tw, "requests/tx\tLWTs/tx\tserial reads/tx\t")
	}
	fmt.Fprintln(tw)
	for _, p := range points {
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%d\t%s\t%s\t%s\t%.0f\t", p.Threads, p.TPS,
			float64(p.Latency.P50Micros)/1000, float64(p.Latency.P99Micros)/1000, p.Errors, cpuCell(p.CPUMicros), busyCell(p), machineCell(p), p.FloorRPS)
		if p.Store != nil {
			fmt.Fprintf(tw, "%.2f\t%.2f\t%.2f\t", p.Store.Requests, p.Store.CondWrites, p.Store.SerialReads)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// storeNote is a progress line's note of a point's requests per
// transaction, when the store counts them.
func storeNote(p bench.LedgerPoint) string {
	if p.Store == nil {
		return ""
	}
	return fmt.Sprintf(", per tx %.2f requests, %.2f LWTs, %.2f serial reads", p.Store.Requests, p.Store.CondWrites, p.Store.SerialReads)
}

// roundsCell lists a point's rounds' tx/s.
func roundsCell(tps []float64) string {
	s := make([]string, len(tps))
	for i, v := range tps {
		s[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(s, " / ")
}

// cpuCell is a table cell for CPU µs per call: "-" when not measured
// (a --server run, whose server's CPU this process cannot see).
func cpuCell(us float64) string {
	if us == 0 {
		return "-"
	}
	return strconv.FormatFloat(us, 'f', 0, 64)
}

// busyCell is a table cell for the CPUs a run kept busy: with a server
// process of its own, the server's share plus the clients' ("0.79+0.26"),
// so that a reader sees which side was the bound; "-" when not measured.
func busyCell(p bench.LedgerPoint) string {
	if p.CPUsBusy == 0 {
		return "-"
	}
	if p.ServerCPUsBusy == 0 {
		return strconv.FormatFloat(p.CPUsBusy, 'f', 2, 64)
	}
	return strconv.FormatFloat(p.ServerCPUsBusy, 'f', 2, 64) + "+" + strconv.FormatFloat(p.CPUsBusy-p.ServerCPUsBusy, 'f', 2, 64)
}

// machineCell is a table cell for how many of the machine's CPUs every
// process kept busy, and how many it has ("1.86/2"): the physical limit,
// which the run's own CPUs busy do not show when another process (a
// Validator database's server) shares the machine; "-" when not measured.
func machineCell(p bench.LedgerPoint) string {
	if p.MachineCPUs == 0 {
		return "-"
	}
	return strconv.FormatFloat(p.MachineCPUsBusy, 'f', 2, 64) + "/" + strconv.Itoa(p.MachineCPUs)
}

// benchValidator opens a Validator over c, on a temporary engine database
// unless --validator-dir or --validator-dsn say otherwise.
func benchValidator(ctx context.Context, vf *validatorFlags, c *client.Client, proofKey auth.Verifier) (*validator.Validator, func(), error) {
	cleanup := func() {}
	if vf.db == "engine" && vf.dir == "" {
		tmp, err := os.MkdirTemp("", "kiroku-bench-validator-*")
		if err != nil {
			return nil, nil, err
		}
		vf.dir = tmp
		cleanup = func() { os.RemoveAll(tmp) }
	}
	db, err := vf.openDB(ctx)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	v, err := vf.open(ctx, db, c, proofKey)
	if err != nil {
		db.Close()
		cleanup()
		return nil, nil, err
	}
	rm := cleanup
	return v, func() { db.Close(); rm() }, nil
}

// cpuClocks are a ledger benchmark's CPU clocks: all of its processes',
// and a server process's of its own when it runs in one (nil otherwise);
// and, for a server in this process on Cassandra, the counts of the
// requests its store sent.
type cpuClocks struct {
	all, server func() (time.Duration, error)
	store       func() cassandra.Stats
}

// benchBackend is the storage backend of a server the benchmark starts.
type benchBackend struct {
	name, dsn          string // the backend, and PostgreSQL's DSN
	contacts, keyspace string // Cassandra's
}

// benchLedgerClient returns a client with a registered identity of the
// given scheme, on a server it starts or on --server, and for a server it
// started its proof verifier (an HMAC proof key cannot be fetched). With
// split the server is a child process on a CPU of its own (splitServer);
// otherwise it runs in this process. clocks are the CPU clocks of the run:
// none with --server, whose server's CPU this process cannot see.
func benchLedgerClient(ctx context.Context, scheme auth.Scheme, addr, configFile string, backend benchBackend, dataDir string, split bool, errw io.Writer) (_ *client.Client, proofKey auth.Verifier, clocks cpuClocks, _ func(), _ error) {
	cleanup := func() {}
	var cfg client.Config
	if addr != "" {
		if configFile == "" {
			return nil, nil, cpuClocks{}, nil, errors.New("--server needs --config with the identity (and the admin token to enrol it)")
		}
		var err error
		if cfg, err = client.LoadConfig(configFile); err != nil {
			return nil, nil, cpuClocks{}, nil, err
		}
		cfg.Server = addr
	} else {
		if dataDir == "" {
			tmp, err := os.MkdirTemp("", "kiroku-bench-ledger-*")
			if err != nil {
				return nil, nil, cpuClocks{}, nil, err
			}
			dataDir = tmp
			cleanup = func() { os.RemoveAll(tmp) }
		}
		tok := make([]byte, 16)
		rand.Read(tok)
		o := server.Options{DataDir: dataDir, Listen: "127.0.0.1:0", Backend: backend.name,
			PostgresDSN: backend.dsn, CassandraContacts: backend.contacts, CassandraKeyspace: backend.keyspace,
			AdminToken: hex.EncodeToString(tok), ProofScheme: scheme,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if split {
			var err error
			if proofKey, err = server.LoadProofVerifier(dataDir, scheme); err != nil {
				cleanup()
				return nil, nil, cpuClocks{}, nil, err
			}
			stop, pid, err := splitServer(ctx, &o, errw)
			if err != nil {
				cleanup()
				return nil, nil, cpuClocks{}, nil, err
			}
			clocks = cpuClocks{all: bench.CPUClock(pid), server: bench.ProcessCPUClock(pid)}
			rm := cleanup
			cleanup = func() { stop(); rm() }
		} else {
			srv, err := server.Start(ctx, o)
			if err != nil {
				cleanup()
				return nil, nil, cpuClocks{}, nil, err
			}
			rm := cleanup
			cleanup = func() { srv.Stop(5 * time.Second); rm() }
			proofKey = srv.ProofVerifier
			o.Listen = srv.Addr()
			clocks.all = bench.CPUClock()
			clocks.store = storeStats(srv.Backend)
		}
		cfg = client.Config{Server: o.Listen, AdminToken: o.AdminToken}
		suffix := make([]byte, 4)
		rand.Read(suffix)
		cfg.Entity = "bench-" + hex.EncodeToString(suffix)
		if scheme == auth.SchemeHMAC {
			cfg.Secret = make([]byte, 32)
			rand.Read(cfg.Secret)
		} else {
			var err error
			cfg.PrivateKeyPEM, cfg.CertificatePEM, err = auth.GenerateIdentity(cfg.Entity, time.Now().Add(-time.Hour), time.Now().AddDate(1, 0, 0))
			if err != nil {
				cleanup()
				return nil, nil, cpuClocks{}, nil, err
			}
		}
	}
	c, err := client.Dial(cfg)
	if err != nil {
		cleanup()
		return nil, nil, cpuClocks{}, nil, err
	}
	if cfg.AdminToken != "" {
		if scheme == auth.SchemeHMAC {
			err = c.RegisterSecret(ctx)
		} else {
			err = c.RegisterCertificate(ctx)
		}
		if err != nil && !errors.Is(err, ledger.ErrIdentityExists) {
			c.Close()
			cleanup()
			return nil, nil, cpuClocks{}, nil, err
		}
	}
	rm := cleanup
	return c, proofKey, clocks, func() { c.Close(); rm() }, nil
}

// storeStats returns the request counts of b's Cassandra store, whether
// b is that store or a coordinator over it; nil for another backend.
func storeStats(b storage.Store) func() cassandra.Stats {
	if c, ok := b.(interface{ Store() storage.Store }); ok {
		b = c.Store()
	}
	if db, ok := b.(*cassandra.DB); ok {
		return db.Stats
	}
	return nil
}

// splitServer starts the ledger server of o as a child process ("kiroku
// server") pinned to the first CPU this process may use, and pins this
// process, its clients and any Validator to the others: the shape of a
// deployment, where the ledger and its clients do not share cores. It sets
// o.Listen to the child's address and returns once the child accepts
// connections, with the child's pid; stop ends the child with SIGTERM
// (SIGKILL after 15 s) and gives this process its CPUs back. The two
// processes split this one's memory limit half and half while both run
// (shareMemoryLimit).
func splitServer(ctx context.Context, o *server.Options, errw io.Writer) (stop func(), pid int, err error) {
	cpus, err := cpuset.Allowed()
	if err != nil {
		return nil, 0, err
	}
	if len(cpus) < 2 {
		return nil, 0, fmt.Errorf("--split needs at least 2 CPUs; this process may use %d", len(cpus))
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	// The child picks its port and says which in addrFile: a port this
	// process found free and let go of could be taken before the child
	// bound it.
	tmp, err := os.MkdirTemp("", "kiroku-bench-split-*")
	if err != nil {
		return nil, 0, err
	}
	addrFile := filepath.Join(tmp, "addr")
	cmd := exec.Command(exe, "server", "--data-dir", o.DataDir, "--listen", "127.0.0.1:0", "--addr-file", addrFile,
		"--backend", o.Backend, "--postgres-dsn", o.PostgresDSN, "--cassandra-contacts", o.CassandraContacts,
		"--cassandra-keyspace", o.CassandraKeyspace, "--proof-scheme", o.ProofScheme.String(),
		"--cpus", strconv.Itoa(cpus[0]), "--log-level", "warn")
	cmd.Env = append(os.Environ(), "KIROKU_ADMIN_TOKEN="+o.AdminToken)
	memEnv, restoreMem := shareMemoryLimit()
	if memEnv != "" {
		cmd.Env = append(cmd.Env, memEnv) // the last of a key's values is the one used
	}
	// The child writes to this process's standard error, not to errw: a
	// copying goroutine writing errw would race this process's own writes.
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// If this process dies without stopping it, the kernel stops the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		restoreMem()
		os.RemoveAll(tmp)
		return nil, 0, fmt.Errorf("starting the ledger server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// release gives back, once the child is gone, what this process lent
	// it: its CPUs and half its memory limit.
	release := func() {
		cpuset.Pin(cpus)
		restoreMem()
		os.RemoveAll(tmp)
	}
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		release()
	}
	if err := cpuset.Pin(cpus[1:]); err != nil {
		stop()
		return nil, 0, err
	}
	deadline := time.Now().Add(30 * time.Second)
	o.Listen = ""
	for {
		if o.Listen == "" {
			if b, err := os.ReadFile(addrFile); err == nil {
				o.Listen = strings.TrimSpace(string(b))
			}
		}
		if o.Listen != "" { // the child has written its address
			if conn, err := net.DialTimeout("tcp", o.Listen, time.Second); err == nil {
				conn.Close()
				fmt.Fprintf(errw, "ledger server: pid %d on CPU %d at %s; clients on CPUs %s\n",
					cmd.Process.Pid, cpus[0], o.Listen, cpuset.Format(cpus[1:]))
				return stop, cmd.Process.Pid, nil
			}
		}
		select {
		case err := <-exited:
			release()
			return nil, 0, fmt.Errorf("the ledger server exited before accepting connections: %v", err)
		case <-ctx.Done():
			stop()
			return nil, 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			if o.Listen == "" {
				return nil, 0, fmt.Errorf("the ledger server did not write its address to %s within 30 s", addrFile)
			}
			return nil, 0, fmt.Errorf("the ledger server did not accept connections at %s within 30 s", o.Listen)
		}
	}
}

// shareMemoryLimit halves this process's memory limit (GOMEMLIMIT, or the
// share of the machine's memory main sets without it) and returns the
// environment entry that gives the child server the other half, with a
// function that restores this process's limit. Each process would
// otherwise take the whole limit for its heap, together more than the
// machine has: the databases of a long run grow without bound, and the
// collector would let both heaps past the memory there is. Without a
// limit there is nothing to share: the entry is empty.
func shareMemoryLimit() (env string, restore func()) {
	limit := debug.SetMemoryLimit(-1) // reads it
	if limit == math.MaxInt64 {
		return "", func() {}
	}
	half := limit / 2
	debug.SetMemoryLimit(half)
	return "GOMEMLIMIT=" + strconv.FormatInt(half, 10), func() { debug.SetMemoryLimit(limit) }
}
