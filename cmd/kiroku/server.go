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

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/internal/cpuset"
	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage/backends"
)

func serverCmd() *cobra.Command {
	var (
		o              server.Options
		adminTokenFile string
		proofScheme    string
		logLevel       string
		logJSON        bool
		cpus           string
		addrFile       string
		cl             clusterFlags
		auditorKey     string
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the ledger server (gRPC, with reflection)",
		Long: `Runs the ledger over gRPC on --listen, with server reflection (grpcurl -plaintext ADDR list).
Storage is the embedded engine in --data-dir by default, or PostgreSQL with --backend=postgres.
Identity registration is enabled only with an administrator token (--admin-token-file, or the
KIROKU_ADMIN_TOKEN environment variable). SIGINT or SIGTERM stops it gracefully.

With --node-id and --peers the server is one member of a replicated cluster: the embedded engine's
log is replicated through Raft to every member, the member that leads executes every call, and the
others apply the log and answer clients with the leader's address (the SDK and CLI follow it).
Each member serves clients and its peers on its address in --peers. Every member needs the same
keys: create them once with 'kiroku keys init --data-dir DIR' and copy DIR/keys into each member's
--data-dir before its first start. A member added later starts with --join and is added with
'kiroku cluster add-node'.

With --auditor-key the ledger runs with an Auditor (see 'kiroku auditor'): it executes a request
only with that Auditor's signed order token for it, and lets only that Auditor abort a nonce.`,
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
			scheme, err := auth.ParseScheme(proofScheme)
			if err != nil {
				return fmt.Errorf("--proof-scheme: %w", err)
			}
			o.ProofScheme = scheme
			o.AdminToken = os.Getenv("KIROKU_ADMIN_TOKEN")
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
			if cpus != "" {
				set, err := cpuset.Parse(cpus)
				if err != nil {
					return fmt.Errorf("--cpus: %w", err)
				}
				if err := cpuset.Pin(set); err != nil {
					return err
				}
			}
			if auditorKey != "" {
				if o.AuditorKeyPEM, err = pemOrFile(auditorKey); err != nil {
					return fmt.Errorf("--auditor-key: %w", err)
				}
			}
			if o.Cluster, err = cl.options(); err != nil {
				return err
			}
			if o.Cluster != nil && !cmd.Flags().Changed("listen") {
				o.Listen = ""
			}
			ctx := cmd.Context()
			r, err := server.Start(ctx, o)
			if err != nil {
				return err
			}
			if addrFile != "" {
				dir, name := filepath.Split(addrFile)
				if err := vfsutil.WriteFileAtomic(vfs.Default, filepath.Clean(dir), name, []byte(r.Addr()+"\n"), nil); err != nil {
					return errors.Join(fmt.Errorf("--addr-file: %w", err), r.Stop(10*time.Second))
				}
			}
			var failed error
			select {
			case <-ctx.Done():
			case failed = <-r.Failed():
			}
			o.Logger.Info("shutting down")
			if addrFile != "" {
				// Gone before the server is: a stale address would send the
				// next reader to a server no longer there.
				if err := os.Remove(addrFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
					o.Logger.Warn("removing the address file", "err", err)
				}
			}
			return errors.Join(failed, r.Stop(10*time.Second))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "kiroku-data", "directory for keys and the embedded engine's data")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:50051", "gRPC listen address")
	f.StringVar(&o.Backend, "backend", "engine", "storage backend: "+backends.Help())
	f.StringVar(&o.PostgresDSN, "postgres-dsn", "", "PostgreSQL DSN for --backend=postgres")
	f.StringVar(&o.CassandraContacts, "cassandra-contacts", "", "Cassandra contact points HOST:PORT,... for --backend=cassandra")
	f.StringVar(&o.CassandraKeyspace, "cassandra-keyspace", "", "the keyspace for --backend=cassandra (default: the cassandra package's)")
	f.StringVar(&o.CassandraConsistency, "cassandra-consistency", "", "consistency of Cassandra's writes: QUORUM (default), LOCAL_QUORUM, EACH_QUORUM or ALL")
	f.StringVar(&o.CassandraSerialConsistency, "cassandra-serial-consistency", "", "consistency of Cassandra's Paxos rounds and reads: SERIAL (default) or LOCAL_SERIAL (linearizable within one datacenter only)")
	f.StringVar(&o.CassandraLocalDC, "cassandra-local-dc", "", "the Cassandra datacenter whose nodes are preferred")
	f.StringVar(&o.MetricsListen, "metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics")
	f.StringVar(&adminTokenFile, "admin-token-file", "", "file holding the administrator token that enables identity registration")
	f.StringVar(&auditorKey, "auditor-key", "", "run with the Auditor whose ECDSA public key this is: PEM, or a file holding it ('kiroku keys auditor' prints it)")
	f.StringVar(&proofScheme, "proof-scheme", "ecdsa", "how the ledger signs proofs: ecdsa or hmac")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&logJSON, "log-json", false, "log in JSON")
	f.StringVar(&addrFile, "addr-file", "", "once the server accepts connections, write its gRPC address to this file (whole: written aside, then renamed), for --listen with port 0; removed at shutdown")
	cl.add(f)
	f.StringVar(&cpus, "cpus", "", "run only on these CPUs (a list such as 0 or 0,2-3), with GOMAXPROCS to match")
	f.IntVar(&o.Limits.MaxMemoryBytes, "max-contract-memory", 0,
		"bytes one request's Starlark contracts may allocate, counted cumulatively, nested calls included (0: 64 MiB)")
	f.DurationVar(&o.Limits.MaxExecutionTime, "max-contract-time", 0,
		"wall-clock time one request's Starlark contracts may run, whatever the client's deadline; also the longest a request waits for room to run (0: 10s)")
	f.IntVar(&o.Limits.MaxConcurrentExecutions, "max-concurrent-contracts", 0,
		"requests whose Starlark contracts run at once; more wait (0: 64)")
	f.IntVar(&o.Limits.MaxTotalMemoryBytes, "max-total-contract-memory", 0,
		"bytes the memory budgets of the requests whose contracts run at once may add up to; each reserves --max-contract-memory (0: 1 GiB)")
	// What a connection can make the server hold before any request of
	// its is authenticated: at most --max-streams × --max-request-bytes of
	// request bytes, each for at most --body-timeout.
	f.IntVar(&o.Transport.MaxConnections, "max-connections", 0, "client connections open at once; more wait to be accepted (0: 1024)")
	f.IntVar(&o.Transport.MaxStreams, "max-streams", 0, "calls open at once on one connection; more wait (0: 16)")
	f.IntVar(&o.Transport.MaxRequestBytes, "max-request-bytes", 0, "largest request message, in bytes (0: 2 MiB)")
	f.DurationVar(&o.Transport.BodyTimeout, "body-timeout", 0,
		"a unary call whose request message is not whole this long after its headers is cancelled (0: 10s)")
	f.DurationVar(&o.Transport.IdleTimeout, "idle-timeout", 0, "a connection with no call open this long is closed (0: 5m)")
	return cmd
}

// pemOrFile returns v if it holds a PEM block, else the contents of the
// file v names.
func pemOrFile(v string) ([]byte, error) {
	if strings.Contains(v, "-----BEGIN ") {
		return []byte(v), nil
	}
	return os.ReadFile(v)
}
