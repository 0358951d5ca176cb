package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
)

func TestDemo(t *testing.T) {
	out, err := run(t, "demo")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"3 versions valid", "DETECTED: asset boiler-7 version 1 fails hash", "a bad result is refused"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// TestDemoModes: the demo runs with a Validator logging every request and
// validating them, and with an Auditor ordering and countersigning every
// execution; the tampering is detected either way.
func TestDemoModes(t *testing.T) {
	for mode, want := range map[string]string{"validator": "the Validator validated 5 logged transactions: no violations",
		"auditor": "countersigned by the Auditor"} {
		out, err := run(t, "demo", "--mode", mode)
		if err != nil {
			t.Fatalf("demo --mode %s: %v\n%s", mode, err, out)
		}
		for _, w := range []string{want, "3 versions valid", "DETECTED: asset boiler-7 version 1 fails hash"} {
			if !strings.Contains(out, w) {
				t.Fatalf("demo --mode %s output lacks %q:\n%s", mode, w, out)
			}
		}
	}
	if out, err := run(t, "demo", "--mode", "sideways"); err == nil {
		t.Fatalf("demo with an unknown mode ran:\n%s", out)
	}
}

// TestDemoOnCassandra: the demo's tamper detection works the same way on
// Cassandra, and the demo leaves the keyspace without the tables it made.
func TestDemoOnCassandra(t *testing.T) {
	contacts := testenv.CassandraContacts(t)
	ks := fmt.Sprintf("kiroku_demo_test_%d", time.Now().UnixNano()%1e9)
	out, err := run(t, "demo", "--backend", "cassandra", "--cassandra-contacts", contacts, "--cassandra-keyspace", ks)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"Cassandra at", "3 versions valid", "DETECTED: asset boiler-7 version 1 fails hash", "a bad result is refused"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
	st, err := backends.OpenStore(context.Background(), "cassandra", backends.Config{Contacts: contacts, Keyspace: ks})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ns, err := st.ListNamespaces(context.Background()); err != nil || len(ns) != 0 {
		t.Fatalf("after the demo the keyspace holds namespaces %v (%v), want none", ns, err)
	}
}

func TestClientCommands(t *testing.T) {
	const token = "cli-test-token-0123456789"
	srv, err := server.Start(context.Background(), server.Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		AdminToken: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(time.Second)
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("token", token)
	cfg := write("client.json", `{"server":"`+srv.Addr()+`","entity":"ops","secret_hex":"`+strings.Repeat("ab", 32)+`","admin_token_file":"token"}`)
	src := write("c.star", "def invoke(ledger, args):\n    ledger.put(args['id'], args['v'])\n    return args['v']\n")
	cli := func(args ...string) string {
		t.Helper()
		out, err := run(t, append(args, "--config", cfg)...)
		if err != nil {
			t.Fatalf("kiroku %v: %v\n%s", args, err, out)
		}
		return out
	}
	cli("register-secret")
	cli("register-contract", "--contract-id", "set", "--contract-file", src)
	if out := cli("list-contracts"); !strings.Contains(out, "set") || !strings.Contains(out, "builtin.ycsb_f") {
		t.Fatalf("list-contracts:\n%s", out)
	}
	var res struct {
		Nonce  string
		Result json.RawMessage
		Proofs []struct{ ID string }
	}
	out := cli("execute-contract", "--contract-id", "set", "--contract-argument", `{"id":"a","v":1}`, "--nonce", "cli-n1", "--json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Nonce != "cli-n1" || string(res.Result) != "1" || len(res.Proofs) != 1 {
		t.Fatalf("execute-contract: %v\n%s", err, out)
	}
	cli("execute-contract", "--contract-id", "set", "--contract-argument", `{"id":"a","v":2}`)
	if out := cli("get-asset", "a"); !strings.Contains(out, "a@1  2") {
		t.Fatalf("get-asset:\n%s", out)
	}
	if out := cli("get-tx-state", "cli-n1"); !strings.HasPrefix(out, "committed") {
		t.Fatalf("get-tx-state:\n%s", out)
	}
	if out := cli("validate-ledger", "a"); !strings.Contains(out, "2 versions valid") {
		t.Fatalf("validate-ledger:\n%s", out)
	}
	if out, err := run(t, "execute-contract", "--contract-id", "set", "--contract-argument", `{"id":"a","v":3}`, "--nonce", "cli-n1", "--config", cfg); err == nil || !strings.Contains(err.Error(), "nonce") {
		t.Fatalf("a replayed nonce must fail: %v\n%s", err, out)
	}
	if err := srv.Backend.Put(context.Background(), &storage.Put{Namespace: ledger.DefaultNamespace, Table: ledger.AssetsTable,
		Partition: storage.Values{"id": storage.Text("a")}, Clustering: storage.Values{"age": storage.BigInt(0)},
		Values: storage.Values{"output": storage.Text("7")}}); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "validate-ledger", "a", "--config", cfg, "--json")
	if err == nil || !strings.Contains(err.Error(), "version 0 fails hash") || !strings.Contains(out, `"fault_check": "hash"`) {
		t.Fatalf("validate-ledger after tampering must fail naming version 0 and the hash: %v\n%s", err, out)
	}
}

func TestBenchLedger(t *testing.T) {
	out, err := run(t, "bench", "ledger", "--records", "60", "--threads", "1,3", "--warmup", "0s", "--duration", "300ms",
		"--load-batch", "25", "--json")
	if err != nil {
		t.Fatalf("bench ledger: %v\n%s", err, out)
	}
	var res struct {
		Load   struct{ Records int }
		Points []struct {
			Threads   int
			Committed int64
			TPS       float64 `json:"tx_per_s"`
			Floor     float64 `json:"floor_rpc_per_s"`
		}
	}
	jsonOf(t, out, &res)
	if res.Load.Records != 60 || len(res.Points) != 2 || res.Points[1].Threads != 3 {
		t.Fatalf("bench ledger: %+v", res)
	}
	for _, p := range res.Points {
		if p.Committed == 0 || p.TPS <= 0 || p.Floor <= 0 {
			t.Fatalf("a point measured nothing: %+v", p)
		}
	}
}
