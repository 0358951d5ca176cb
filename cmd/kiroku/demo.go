package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiroku-db/kiroku/auditor/auditorsrv"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
	"github.com/kiroku-db/kiroku/validator"
)

// demoContract records an inspection result for a piece of equipment.
const demoContract = `# Records one inspection of a piece of equipment.
# args: {"equipment": id, "inspector": name, "result": "pass" | "fail", "notes": text}
def invoke(ledger, args):
    if args.get("result") not in ("pass", "fail"):
        fail("result must be \"pass\" or \"fail\", got %r" % args.get("result"))
    cur = ledger.get(args["equipment"])
    history = {"inspections": 0, "failures": 0}
    if cur != None:
        history = cur["value"]
    failures = history["failures"] + (1 if args["result"] == "fail" else 0)
    ledger.put(args["equipment"], {
        "inspections": history["inspections"] + 1,
        "failures": failures,
        "last": {"inspector": args["inspector"], "result": args["result"], "notes": args.get("notes", "")},
    })
    return {"equipment": args["equipment"], "inspections": history["inspections"] + 1, "failures": failures}
`

func demoCmd() *cobra.Command {
	var (
		dataDir string
		cluster bool
		db      demoBackend
		mode    string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a ledger server on the embedded engine and walk through contracts, proofs, validation and tamper detection",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				tmp, err := os.MkdirTemp("", "kiroku-demo-*")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				dataDir = tmp
			}
			if cluster {
				if db.name != "engine" {
					return fmt.Errorf("demo: a cluster's members run the embedded engine, not --backend %s", db.name)
				}
				if mode != client.ModeDirect {
					return fmt.Errorf("demo: --cluster runs in direct mode only")
				}
				return runClusterDemo(cmd.Context(), cmd.OutOrStdout(), dataDir)
			}
			switch mode {
			case client.ModeDirect, client.ModeValidator, client.ModeAuditor:
			default:
				return fmt.Errorf("demo: unknown --mode %q (direct, validator or auditor)", mode)
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), dataDir, db, mode)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "data directory (default: a temporary one, removed afterwards)")
	f.BoolVar(&cluster, "cluster", false, "start three server processes as a cluster, kill the leader with SIGKILL, and show the failover and the catch-up")
	f.StringVar(&db.name, "backend", "engine", "where the ledger keeps its data: engine (embedded), postgres or cassandra; the database must hold no ledger yet, and what the demo creates in it is dropped afterwards")
	f.StringVar(&db.cfg.DSN, "postgres-dsn", os.Getenv("KIROKU_PG_DSN"), "PostgreSQL DSN for --backend=postgres (default $KIROKU_PG_DSN)")
	f.StringVar(&db.cfg.Contacts, "cassandra-contacts", os.Getenv("KIROKU_CASSANDRA_CONTACTS"), "Cassandra contact points for --backend=cassandra (default $KIROKU_CASSANDRA_CONTACTS)")
	f.StringVar(&db.cfg.Keyspace, "cassandra-keyspace", "kiroku_demo", "the keyspace for --backend=cassandra")
	f.StringVar(&mode, "mode", client.ModeDirect, "how the client executes: direct; validator (a Validator logs every request in an engine database in the data directory, and validates them at the end); or auditor (an Auditor started beside the ledger orders, validates and countersigns every execution)")
	return cmd
}

// demoBackend is the backend the demo's server runs on.
type demoBackend struct {
	name string
	cfg  backends.Config
}

// prepare checks that a shared database holds no ledger yet, and returns
// what puts it back as it was found: the namespaces the demo created are
// dropped, with their tables.
func (d demoBackend) prepare(ctx context.Context) (cleanup func() error, _ error) {
	if d.name == "engine" {
		return func() error { return nil }, nil
	}
	st, err := backends.OpenStore(ctx, d.name, d.cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	before, err := st.ListNamespaces(ctx)
	st.Close()
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	if slices.Contains(before, ledger.DefaultNamespace) {
		return nil, fmt.Errorf("demo: the %s database already holds a ledger (namespace %q); the demo runs on one without", d.name, ledger.DefaultNamespace)
	}
	return func() error {
		st, err := backends.OpenStore(context.Background(), d.name, d.cfg)
		if err != nil {
			return err
		}
		defer st.Close()
		after, err := st.ListNamespaces(ctx)
		if err != nil {
			return err
		}
		for _, ns := range after {
			if slices.Contains(before, ns) {
				continue
			}
			tables, err := st.ListTables(ctx, ns)
			if err != nil {
				return err
			}
			for _, tb := range tables {
				if err := st.DropTable(ctx, ns, tb); err != nil {
					return err
				}
			}
			if err := st.DropNamespace(ctx, ns); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func (d demoBackend) describe(dataDir string) string {
	switch d.name {
	case "engine":
		return "embedded engine, data in " + dataDir
	case "cassandra":
		return fmt.Sprintf("Cassandra at %s, keyspace %s", d.cfg.Contacts, d.cfg.Keyspace)
	}
	return d.name
}

func runDemo(ctx context.Context, w io.Writer, dataDir string, db demoBackend, mode string) (err error) {
	step := func(format string, a ...any) { fmt.Fprintf(w, "\n== "+format+"\n", a...) }
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	cleanup, err := db.prepare(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := cleanup(); cerr != nil && err == nil {
			err = fmt.Errorf("demo: dropping what it created: %w", cerr)
		}
	}()
	opts := server.Options{DataDir: dataDir, Listen: "127.0.0.1:0", AdminToken: hex.EncodeToString(token),
		Backend: db.name, PostgresDSN: db.cfg.DSN, CassandraContacts: db.cfg.Contacts, CassandraKeyspace: db.cfg.Keyspace,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	audDir := filepath.Join(dataDir, "auditor")
	var audPrint string
	if mode == client.ModeAuditor {
		if opts.AuditorKeyPEM, audPrint, err = auditorsrv.InitKey(audDir); err != nil {
			return err
		}
	}
	srv, err := server.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer srv.Stop(5 * time.Second)
	step("Started a ledger server on %s (%s)", srv.Addr(), db.describe(dataDir))
	fmt.Fprintf(w, "ledger proof key: %s, fingerprint %s\n", srv.Key.Scheme, srv.Key.Fingerprint)

	keyPEM, certPEM, err := auth.GenerateIdentity("inspector-1", time.Now().Add(-time.Minute), time.Now().AddDate(1, 0, 0))
	if err != nil {
		return err
	}
	ccfg := client.Config{Server: srv.Addr(), Entity: "inspector-1", KeyVersion: 1,
		PrivateKeyPEM: keyPEM, CertificatePEM: certPEM, AdminToken: hex.EncodeToString(token)}
	if mode == client.ModeAuditor {
		aud, err := auditorsrv.Start(ctx, auditorsrv.Options{DataDir: audDir, Listen: "127.0.0.1:0", AdminToken: hex.EncodeToString(token),
			Ledger: srv.Addr(), LedgerKey: srv.Key.Fingerprint, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return err
		}
		defer aud.Stop(5 * time.Second)
		step("Started an Auditor on %s (its own engine and key, fingerprint %s); the ledger runs only what it orders", aud.Addr(), audPrint)
		ccfg.Mode, ccfg.Auditor, ccfg.AuditorKey = client.ModeAuditor, aud.Addr(), audPrint
	}
	c, err := client.Dial(ccfg)
	if err != nil {
		return err
	}
	defer c.Close()
	execute := func(contract string, arg []byte) (*proof.Result, error) { return c.Execute(ctx, contract, arg) }
	var val *validator.Validator
	if mode == client.ModeValidator {
		vdb, err := engine.Open(engine.Config{Dir: filepath.Join(dataDir, "validator")})
		if err != nil {
			return err
		}
		defer vdb.Close()
		if val, err = validator.Open(ctx, validator.Config{DB: vdb, Client: c}); err != nil {
			return err
		}
		execute = func(contract string, arg []byte) (*proof.Result, error) { return val.Execute(ctx, contract, arg) }
		step("Opened a Validator on its own engine in %s: it logs every request before the ledger sees it", filepath.Join(dataDir, "validator"))
	}
	if err := c.RegisterCertificate(ctx); err != nil {
		return err
	}
	step("Registered identity inspector-1 (ECDSA P-256 certificate)")
	if err := c.RegisterContract(ctx, "inspection", []byte(demoContract)); err != nil {
		return err
	}
	step("Registered contract \"inspection\" (Starlark, signed by inspector-1):")
	fmt.Fprint(w, demoContract)

	step("Executed it:")
	runs := []string{
		`{"equipment":"boiler-7","inspector":"sato","result":"pass","notes":"pressure 1.2 MPa"}`,
		`{"equipment":"boiler-7","inspector":"tanaka","result":"fail","notes":"valve leak"}`,
		`{"equipment":"boiler-7","inspector":"sato","result":"pass","notes":"valve replaced"}`,
		`{"equipment":"crane-2","inspector":"suzuki","result":"pass"}`,
	}
	for _, a := range runs {
		res, err := execute("inspection", []byte(a))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n  → %s\n", a, res.Result)
		for i := range res.Proofs {
			printProof(w, proofJSON(&res.Proofs[i]))
		}
	}
	_, err = execute("inspection", []byte(`{"equipment":"boiler-7","inspector":"x","result":"maybe"}`))
	fmt.Fprintf(w, "a bad result is refused and writes nothing: %v\n", err)

	step("History of boiler-7, with proofs:")
	vs, err := c.History(ctx, "boiler-7", ledger.ScanRange{End: -1, Ascending: true})
	if err != nil {
		return err
	}
	for _, v := range vs {
		printVersions(w, []VersionJSON{versionJSON(v)})
	}

	step("validate-ledger boiler-7:")
	v, err := c.ValidateLedger(ctx, "boiler-7", 0, -1)
	if err != nil {
		return err
	}
	if !v.Ok {
		return fmt.Errorf("demo: the untouched ledger fails validation: %s", (&validationFailed{v}).Error())
	}
	printValidation(w, v)
	switch mode {
	case client.ModeAuditor:
		fmt.Fprintln(w, "every execution above was ordered, validated and countersigned by the Auditor, its approval verified")
	case client.ModeValidator:
		rep, err := val.Validate(ctx, validator.Scope{})
		if err != nil {
			return err
		}
		if !rep.OK() {
			return fmt.Errorf("demo: the Validator found violations in an honest run: %v", rep.Violations)
		}
		fmt.Fprintf(w, "the Validator validated %d logged transactions: no violations\n", rep.Validated)
	}

	step("Tampering: rewriting boiler-7 version 1 in storage, behind the ledger's back (failure → pass)")
	tampered := `{"failures":0,"inspections":2,"last":{"inspector":"tanaka","notes":"","result":"pass"}}`
	if err := srv.Backend.Put(ctx, &storage.Put{Namespace: ledger.DefaultNamespace, Table: ledger.AssetsTable,
		Partition: storage.Values{"id": storage.Text("boiler-7")}, Clustering: storage.Values{"age": storage.BigInt(1)},
		Values: storage.Values{"output": storage.Text(tampered)}, Condition: storage.IfExists()}); err != nil {
		return err
	}
	fmt.Fprintf(w, "stored output of boiler-7@1 is now %s\n", tampered)

	step("validate-ledger boiler-7 again:")
	v, err = c.ValidateLedger(ctx, "boiler-7", 0, -1)
	if err != nil {
		return err
	}
	if v.Ok {
		return fmt.Errorf("demo: tampering was not detected")
	}
	fmt.Fprintf(w, "DETECTED: %s (%d version(s) before it are valid)\n", (&validationFailed{v}).Error(), v.Checked)
	return nil
}
