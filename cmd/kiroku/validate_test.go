package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/bench"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/cpuset"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/validator"
)

// TestValidateCommand logs transactions through a Validator, validates
// them with `kiroku validate` (clean, exit 0), then tampers with a stored
// output in the ledger and expects the command to report it (exit ≠ 0).
func TestValidateCommand(t *testing.T) {
	ctx := context.Background()
	const token = "cli-test-token-0123456789"
	srv, err := server.Start(ctx, server.Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		AdminToken: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(time.Second)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "client.json")
	if err := os.WriteFile(cfg, []byte(`{"server":"`+srv.Addr()+`","entity":"ops","secret_hex":"`+strings.Repeat("cd", 32)+`","admin_token_file":"token"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(dir, "validator")

	// Log some transactions with the library, as an application would.
	ccfg, err := client.LoadConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := engine.Open(engine.Config{Dir: vdir})
	if err != nil {
		t.Fatal(err)
	}
	v, err := validator.Open(ctx, validator.Config{DB: db, Client: c})
	if err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{`{"prefix":"k","first":0,"count":3,"payload":"x"}`} {
		if _, err := v.Execute(ctx, "builtin.bulk_load", []byte(arg)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"k0", "k1", "k0"} {
		if _, err := v.Execute(ctx, "builtin.ycsb_f", []byte(`{"id":"`+id+`","payload":"y"}`)); err != nil {
			t.Fatal(err)
		}
	}
	db.Close() // the command opens the same data directory

	out, err := run(t, "validate", "--config", cfg, "--validator-dir", vdir)
	if err != nil || !strings.Contains(out, "validated 4 transactions") || !strings.Contains(out, "no violations") {
		t.Fatalf("clean validate: %v\n%s", err, out)
	}
	// The ledger's operator rewrites k0@1.
	if err := srv.Backend.Put(ctx, &storage.Put{Namespace: ledger.DefaultNamespace, Table: ledger.AssetsTable,
		Partition: storage.Values{"id": storage.Text("k0")}, Clustering: storage.Values{"age": storage.BigInt(1)},
		Values: storage.Values{"output": storage.Text(`{"payload":"forged","updates":1}`)}, Condition: storage.IfExists()}); err != nil {
		t.Fatal(err)
	}
	// A default run validates what is new (nothing) and says plainly that
	// it did not re-check what earlier runs validated.
	out, err = run(t, "validate", "--config", cfg, "--validator-dir", vdir)
	if err != nil || !strings.Contains(out, "validated 0 transactions") || !strings.Contains(out, "were not re-checked") || !strings.Contains(out, "--all") {
		t.Fatalf("default validate after tampering: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--all"}, {"--key", "k0"}} {
		out, err = run(t, append([]string{"validate", "--config", cfg, "--validator-dir", vdir, "--json"}, args...)...)
		if err == nil {
			t.Fatalf("validate %v: tampering not reported:\n%s", args, out)
		}
		var rep validator.Report
		jsonOf(t, out, &rep)
		if len(rep.Violations) != 1 || rep.Violations[0].Kind != validator.KindIODivergence || rep.Violations[0].Key != "k0" || rep.Violations[0].Age != 1 {
			t.Fatalf("validate %v: report: %+v", args, rep.Violations)
		}
		if args[0] == "--all" && (rep.CrossCheckedKeys != 3 || !strings.Contains(rep.Scope, "every asset ever logged")) {
			t.Fatalf("validate --all cross-checked %d assets (%q); want all 3 logged", rep.CrossCheckedKeys, rep.Scope)
		}
	}
}

func TestBenchValidate(t *testing.T) {
	out, err := run(t, "bench", "validate", "--records", "50", "--txs", "300", "--threads", "4", "--json")
	if err != nil {
		t.Fatalf("bench validate: %v\n%s", err, out)
	}
	var res struct {
		Validated  int
		TPS        float64 `json:"tx_per_s"`
		GraphNodes int     `json:"graph_nodes"`
	}
	jsonOf(t, out, &res)
	if res.Validated != 300+4 || res.TPS <= 0 || res.GraphNodes < 300 { // 300 and one bulk load per loader (4)
		t.Fatalf("bench validate: %+v\n%s", res, out)
	}
}

func TestBenchLedgerValidator(t *testing.T) {
	out, err := run(t, "bench", "ledger", "--records", "60", "--threads", "2", "--warmup", "0s", "--duration", "200ms",
		"--load-batch", "25", "--validator", "on", "--rounds", "3", "--json")
	if err != nil {
		t.Fatalf("bench ledger --validator on: %v\n%s", err, out)
	}
	checkValidatorPoint(t, out, 3)
	checkBusy(t, out, runtime.NumCPU(), false)
	if _, err := run(t, "bench", "ledger", "--records", "60", "--validator", "on", "--rounds", "-1"); err == nil || !strings.Contains(err.Error(), "round") {
		t.Errorf("--rounds -1: %v", err)
	}
	if _, err := run(t, "bench", "ledger", "--records", "60", "--rounds", "3"); err == nil || !strings.Contains(err.Error(), "--validator on") {
		t.Errorf("--rounds 3 without the Validator: %v", err)
	}
}

// TestBenchLedgerSplit runs the bench with the server in a child process
// on a CPU of its own, through a Validator, and checks that the child is
// gone afterwards and this process has its CPUs back.
func TestBenchLedgerSplit(t *testing.T) {
	cpus, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		t.Skipf("--split needs 2 CPUs; this process may use %d", len(cpus))
	}
	t.Setenv("KIROKU_TEST_RUN_MAIN", "1") // the child is this test binary
	const limit = 6 << 30
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(limit))
	out, err := run(t, "bench", "ledger", "--split", "--records", "60", "--threads", "2", "--warmup", "0s", "--duration", "300ms",
		"--load-batch", "25", "--validator", "on", "--json")
	if err != nil {
		t.Fatalf("bench ledger --split: %v\n%s", err, out)
	}
	var pid, cpu int
	if _, err := fmt.Sscanf(out[max(0, strings.Index(out, "ledger server: pid")):], "ledger server: pid %d on CPU %d", &pid, &cpu); err != nil || cpu != cpus[0] {
		t.Fatalf("no child server reported on CPU %d (%v):\n%s", cpus[0], err, out)
	}
	if be := checkValidatorPoint(t, out, 1); !strings.Contains(be, "own CPU") {
		t.Fatalf("bench ledger --split reports backend %q", be)
	}
	checkBusy(t, out, len(cpus), true)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the child server %d is still there after the bench: %v", pid, err)
	}
	if got, _ := cpuset.Allowed(); !slices.Equal(got, cpus) {
		t.Errorf("after the bench this process may use CPUs %v, before %v", got, cpus)
	}
	if got := debug.SetMemoryLimit(-1); got != limit {
		t.Errorf("after the bench this process's memory limit is %d, before %d", got, limit)
	}
	if _, err := run(t, "bench", "ledger", "--split", "--server", "127.0.0.1:1", "--config", "x"); err == nil || !strings.Contains(err.Error(), "--split") {
		t.Errorf("--split with --server: %v", err)
	}
}

// TestShareMemoryLimit: --split gives its child server half of this
// process's memory limit and keeps the other half until the child stops;
// without a limit it shares nothing.
func TestShareMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(3 << 30))
	env, restore := shareMemoryLimit()
	if want := fmt.Sprintf("GOMEMLIMIT=%d", 3<<29); env != want {
		t.Errorf("the child's environment gets %q, want %q", env, want)
	}
	if got := debug.SetMemoryLimit(-1); got != 3<<29 {
		t.Errorf("this process keeps a limit of %d, want %d", got, 3<<29)
	}
	restore()
	if got := debug.SetMemoryLimit(-1); got != 3<<30 {
		t.Errorf("restored limit %d, want %d", got, 3<<30)
	}

	debug.SetMemoryLimit(math.MaxInt64)
	env, restore = shareMemoryLimit()
	if env != "" {
		t.Errorf("without a limit the child's environment gets %q", env)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("without a limit this process got one: %d", got)
	}
	restore()
}

// checkBusy checks that the JSON of a bench ledger --validator on run
// reports CPUs busy for both modes: the run's own (some were used), the
// server's exactly when it ran in a process of its own (split), and the
// whole machine's with its CPU count. The figures themselves are
// measurements, which a loaded machine moves; no bound is asserted on them.
func checkBusy(t *testing.T, out string, cpus int, split bool) {
	t.Helper()
	type busy struct {
		All         float64 `json:"cpus_busy"`
		Server      float64 `json:"server_cpus_busy"`
		Machine     float64 `json:"machine_cpus_busy"`
		MachineCPUs int     `json:"machine_cpus"`
	}
	var res struct {
		Points []struct {
			busy
			Off busy `json:"validator_off"`
		}
	}
	jsonOf(t, out, &res)
	for _, b := range []busy{res.Points[0].busy, res.Points[0].Off} {
		if b.All <= 0 || b.Machine <= 0 {
			t.Errorf("CPUs busy %.2f, machine %.2f; want both measured", b.All, b.Machine)
		}
		if split != (b.Server > 0) {
			t.Errorf("server CPUs busy %.2f (split: %v); want a share exactly when split", b.Server, split)
		}
		if b.MachineCPUs < cpus {
			t.Errorf("the machine has %d CPUs; this process may use %d", b.MachineCPUs, cpus)
		}
	}
}

// checkValidatorPoint checks that the JSON of a one-point bench ledger
// --validator on run measured both modes, each the median of its rounds,
// and returns its backend.
func checkValidatorPoint(t *testing.T, out string, rounds int) string {
	t.Helper()
	type point struct {
		TPS    float64   `json:"tx_per_s"`
		Rounds []float64 `json:"rounds_tx_per_s"`
	}
	var res struct {
		Backend string
		Points  []struct {
			point
			Off *point `json:"validator_off"`
		}
	}
	jsonOf(t, out, &res)
	if len(res.Points) != 1 || res.Points[0].TPS <= 0 || res.Points[0].Off == nil || res.Points[0].Off.TPS <= 0 {
		t.Fatalf("bench ledger --validator on: %+v", res)
	}
	for mode, p := range map[string]point{"on": res.Points[0].point, "off": *res.Points[0].Off} {
		if rounds == 1 {
			if p.Rounds != nil {
				t.Errorf("%s: one round, rounds listed: %v", mode, p.Rounds)
			}
			continue
		}
		sorted := slices.Sorted(slices.Values(p.Rounds))
		if len(p.Rounds) != rounds || p.TPS != sorted[(rounds-1)/2] {
			t.Errorf("%s: %v tx/s, rounds %v; want the median of %d", mode, p.TPS, p.Rounds, rounds)
		}
	}
	return res.Backend
}

func TestBusyCell(t *testing.T) {
	for _, c := range []struct {
		p    bench.LedgerPoint
		want string
	}{
		{bench.LedgerPoint{}, "-"},
		{bench.LedgerPoint{CPUsBusy: 1.564}, "1.56"},
		{bench.LedgerPoint{CPUsBusy: 1.05, ServerCPUsBusy: 0.79}, "0.79+0.26"},
	} {
		if got := busyCell(c.p); got != c.want {
			t.Errorf("busyCell(%+v) = %q; want %q", c.p, got, c.want)
		}
	}
}

func TestMachineCell(t *testing.T) {
	for _, c := range []struct {
		p    bench.LedgerPoint
		want string
	}{
		{bench.LedgerPoint{}, "-"},
		{bench.LedgerPoint{MachineCPUsBusy: 1.857, MachineCPUs: 2}, "1.86/2"},
	} {
		if got := machineCell(c.p); got != c.want {
			t.Errorf("machineCell(%+v) = %q; want %q", c.p, got, c.want)
		}
	}
}

// TestValidatorMode: execute-contract --mode validator logs each request
// in the Validator database before the ledger runs it, so `kiroku
// validate` over that database validates what the CLI executed; a mode
// without what it needs is refused before anything is sent.
func TestValidatorMode(t *testing.T) {
	ctx := context.Background()
	const token = "cli-test-token-0123456789"
	srv, err := server.Start(ctx, server.Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		AdminToken: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(time.Second)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(dir, "validator")
	cfg := filepath.Join(dir, "client.json")
	if err := os.WriteFile(cfg, []byte(`{"server":"`+srv.Addr()+`","entity":"ops","secret_hex":"`+strings.Repeat("ef", 32)+
		`","admin_token_file":"token","mode":"validator","validator":"engine:`+vdir+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "register-secret", "--config", cfg); err != nil {
		t.Fatalf("register-secret: %v\n%s", err, out)
	}
	for i, call := range [][2]string{{"builtin.bulk_load", `{"prefix":"m","first":0,"count":2,"payload":"x"}`},
		{"builtin.ycsb_f", `{"id":"m0","payload":"p"}`}, {"builtin.ycsb_f", `{"id":"m1","payload":"p"}`}} {
		out, err := run(t, "execute-contract", "--config", cfg, "--contract-id", call[0], "--contract-argument", call[1],
			"--nonce", fmt.Sprintf("vm-%d", i))
		if err != nil {
			t.Fatalf("execute-contract in validator mode: %v\n%s", err, out)
		}
	}
	out, err := run(t, "validate", "--config", cfg, "--validator-dir", vdir)
	if err != nil || !strings.Contains(out, "validated 3 transactions") || !strings.Contains(out, "no violations") {
		t.Fatalf("validate after CLI executions in validator mode: %v\n%s", err, out)
	}
	if out, err := run(t, "execute-contract", "--config", cfg, "--validator", "", "--mode", "validator", "--contract-id", "builtin.ycsb_f",
		"--contract-argument", `{"id":"m0","payload":"q"}`, "--server", srv.Addr()); err != nil {
		t.Fatalf("flags that override nothing changed the mode: %v\n%s", err, out)
	}
	if out, err := run(t, "execute-contract", "--config", cfg, "--mode", "sideways", "--contract-id", "builtin.ycsb_f",
		"--contract-argument", `{"id":"z","payload":"p"}`); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Fatalf("an unknown mode: %v\n%s", err, out)
	}
}
