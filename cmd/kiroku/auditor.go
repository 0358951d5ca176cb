package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/auditor/auditorsrv"
	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage/backends"
)

func auditorCmd() *cobra.Command {
	var (
		o              auditorsrv.Options
		adminTokenFile string
		ledgerKey      string
		logLevel       string
		logJSON        bool
		addrFile       string
	)
	cmd := &cobra.Command{
		Use:   "auditor",
		Short: "Run the Auditor, the second domain that orders and validates every request (gRPC, with reflection)",
		Long: `Runs the Auditor over gRPC on --listen, with server reflection. The Auditor is run by another
operator than the ledger, with its own database (the embedded engine in --data-dir, or
--backend=postgres|cassandra) and its own ECDSA key, created in --data-dir/keys on first start
('kiroku keys auditor --data-dir DIR' creates it beforehand and prints the public key that the
ledger is started with: 'kiroku server --auditor-key FILE').

A client in Auditor mode orders each request here, has the ledger run it with the order token,
and brings the ledger's reply back for validation: the Auditor runs the contract on its own
replica, checks the ledger's signed result against it and countersigns the receipt, or answers
with a Byzantine fault naming the asset, version and check.

--ledger and --ledger-key name the ledger and pin its ECDSA proof key (a PEM file or PEM text,
or the key's fingerprint, which the Auditor checks against the key the ledger serves). Every
--recover-every (a quarter of --lease by default), the Auditor settles the orders whose lease
ran out with the ledger: it validates what committed and has the ledger abort what did not.

Identity registration is enabled only with the Auditor's administrator token
(--admin-token-file, or KIROKU_AUDITOR_ADMIN_TOKEN). SIGINT or SIGTERM stops it gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			hopts := &slog.HandlerOptions{Level: level}
			o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopts))
			if logJSON {
				o.Logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopts))
			}
			o.AdminToken = os.Getenv("KIROKU_AUDITOR_ADMIN_TOKEN")
			if adminTokenFile != "" {
				b, err := os.ReadFile(adminTokenFile)
				if err != nil {
					return err
				}
				o.AdminToken = strings.TrimSpace(string(b))
			}
			if o.AdminToken != "" && len(o.AdminToken) < 16 {
				return fmt.Errorf("the admin token must be at least 16 characters")
			}
			if o.Ledger == "" {
				return errors.New("--ledger is required: the address of the ledger to audit")
			}
			if ledgerKey == "" {
				return errors.New("--ledger-key is required: the ledger's proof key (PEM file or text) or its fingerprint")
			}
			o.LedgerKey = ledgerKey
			if !strings.Contains(ledgerKey, "-----BEGIN ") && !isFingerprint(ledgerKey) {
				b, err := os.ReadFile(ledgerKey)
				if err != nil {
					return fmt.Errorf("--ledger-key: neither a fingerprint nor a readable PEM file: %w", err)
				}
				o.LedgerKey = string(b)
			}
			ctx := cmd.Context()
			r, err := auditorsrv.Start(ctx, o)
			if err != nil {
				return err
			}
			if addrFile != "" {
				dir, name := filepath.Split(addrFile)
				if err := vfsutil.WriteFileAtomic(vfs.Default, filepath.Clean(dir), name, []byte(r.Addr()+"\n"), nil); err != nil {
					return errors.Join(fmt.Errorf("--addr-file: %w", err), r.Stop(10*time.Second))
				}
			}
			<-ctx.Done()
			o.Logger.Info("shutting down")
			if addrFile != "" {
				if err := os.Remove(addrFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
					o.Logger.Warn("removing the address file", "err", err)
				}
			}
			return r.Stop(10 * time.Second)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "kiroku-auditor-data", "directory for the Auditor's keys and its embedded engine's data")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:50061", "gRPC listen address")
	f.StringVar(&o.Backend, "backend", "engine", "the Auditor's storage backend: "+backends.Help())
	f.StringVar(&o.Storage.DSN, "postgres-dsn", "", "PostgreSQL DSN for --backend=postgres (the Auditor's database, not the ledger's)")
	f.StringVar(&o.Storage.Contacts, "cassandra-contacts", "", "Cassandra contact points HOST:PORT,... for --backend=cassandra")
	f.StringVar(&o.Storage.Keyspace, "cassandra-keyspace", "", "the keyspace for --backend=cassandra (default: the cassandra package's)")
	f.StringVar(&o.Storage.Consistency, "cassandra-consistency", "", "consistency of Cassandra's writes: QUORUM (default), LOCAL_QUORUM, EACH_QUORUM or ALL")
	f.StringVar(&o.Storage.SerialConsistency, "cassandra-serial-consistency", "", "consistency of Cassandra's Paxos rounds and reads: SERIAL (default) or LOCAL_SERIAL")
	f.StringVar(&o.Storage.LocalDC, "cassandra-local-dc", "", "the Cassandra datacenter whose nodes are preferred")
	f.StringVar(&o.MetricsListen, "metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics")
	f.StringVar(&adminTokenFile, "admin-token-file", "", "file holding the Auditor's administrator token, which enables identity registration")
	f.StringVar(&o.Ledger, "ledger", "", "the ledger's address HOST:PORT (or a cluster's members, comma-separated): recovery asks it about orders whose lease ran out")
	f.StringVar(&ledgerKey, "ledger-key", "", "the ledger's ECDSA proof key: a PEM file, PEM text, or its fingerprint (64 hex digits, checked against the key the ledger serves at start)")
	f.DurationVar(&o.Lease, "lease", 10*time.Second, "how long an ordered request holds its locks before recovery settles it with the ledger")
	f.DurationVar(&o.RecoverEvery, "recover-every", 0, "how often recovery runs (0: a quarter of --lease)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&logJSON, "log-json", false, "log in JSON")
	f.StringVar(&addrFile, "addr-file", "", "once the Auditor accepts connections, write its gRPC address to this file (written aside, then renamed); removed at shutdown")
	f.IntVar(&o.Limits.MaxMemoryBytes, "max-contract-memory", 0, "as for 'kiroku server': run contracts under the ledger's limits (0: 64 MiB)")
	f.DurationVar(&o.Limits.MaxExecutionTime, "max-contract-time", 0, "as for 'kiroku server' (0: 10s)")
	f.IntVar(&o.Limits.MaxConcurrentExecutions, "max-concurrent-contracts", 0, "as for 'kiroku server' (0: 64)")
	f.IntVar(&o.Limits.MaxTotalMemoryBytes, "max-total-contract-memory", 0, "as for 'kiroku server' (0: 1 GiB)")
	f.IntVar(&o.Transport.MaxConnections, "max-connections", 0, "client connections open at once; more wait to be accepted (0: 1024)")
	f.IntVar(&o.Transport.MaxStreams, "max-streams", 0, "calls open at once on one connection; more wait (0: 16)")
	f.IntVar(&o.Transport.MaxRequestBytes, "max-request-bytes", 0, "largest request message, in bytes (0: 2 MiB)")
	return cmd
}

// isFingerprint reports whether s is 64 hex digits.
func isFingerprint(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range strings.ToLower(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// keysAuditorCmd creates the Auditor's key and prints its public key.
func keysAuditorCmd() *cobra.Command {
	var dir, out string
	cmd := &cobra.Command{
		Use:   "auditor",
		Short: "Create the Auditor's key in DATA-DIR/keys and print its public key (PEM)",
		Long: `Creates, in --data-dir/keys, the Auditor's ECDSA key and the key that seals clients' HMAC
secrets at rest, as 'kiroku auditor' does on its first start, keeping keys already there, and
prints the Auditor's public key in PEM (to --out if given): what the ledger is started with
('kiroku server --auditor-key FILE'). Its fingerprint goes to standard error; clients in Auditor
mode pin either.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pub, fp, err := auditorsrv.InitKey(dir)
			if err != nil {
				return err
			}
			if out != "" {
				d, name := filepath.Split(out)
				if d == "" {
					d = "."
				}
				if err := vfsutil.WriteFileAtomic(vfs.Default, filepath.Clean(d), name, pub, nil); err != nil {
					return err
				}
			} else if _, err := cmd.OutOrStdout().Write(pub); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "the Auditor's key in %s/keys, fingerprint %s\n", dir, fp)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "data-dir", "kiroku-auditor-data", "the Auditor's data directory")
	cmd.Flags().StringVar(&out, "out", "", "write the public key (PEM) to this file instead of standard output")
	return cmd
}
