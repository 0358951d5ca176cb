package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestAuditorHelp(t *testing.T) {
	out, err := run(t, "auditor", "--help")
	if err != nil || !strings.Contains(out, "--ledger-key") || !strings.Contains(out, "--lease") {
		t.Fatalf("kiroku auditor --help: %v\n%s", err, out)
	}
	if _, err := run(t, "auditor", "--data-dir", t.TempDir(), "--ledger-key", strings.Repeat("ab", 32)); err == nil ||
		!strings.Contains(err.Error(), "--ledger") {
		t.Fatalf("kiroku auditor without --ledger: %v", err)
	}
}

// startCmd runs kiroku with args in this process until the test ends,
// and returns the address it writes to its --addr-file (which args must
// not name; it is added).
func startCmd(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrFile := filepath.Join(t.TempDir(), "addr")
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--log-level", "warn", "--listen", "127.0.0.1:0", "--addr-file", addrFile))
	done, result := make(chan struct{}), new(error)
	go func() {
		*result = cmd.ExecuteContext(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
			if *result != nil {
				t.Errorf("kiroku %s: %v", args[0], *result)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("kiroku %s did not stop within 30 s of its context's end", args[0])
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, err := os.ReadFile(addrFile)
		if err == nil {
			return strings.TrimSpace(string(b))
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("kiroku %s wrote no address within 30 s", args[0])
		}
		select {
		case <-done:
			t.Fatalf("kiroku %s stopped: %v", args[0], *result)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestAuditorCommand: the operators' walk-through — the Auditor's key
// created and its public key handed to the ledger (kiroku keys auditor,
// kiroku server --auditor-key), the ledger's key created and its
// fingerprint handed to the Auditor (kiroku keys init, kiroku auditor
// --ledger-key) — and a client in Auditor mode that enrols with both and
// executes through them with the CLI.
func TestAuditorCommand(t *testing.T) {
	dir := t.TempDir()
	ledgerDir, auditorDir := filepath.Join(dir, "ledger"), filepath.Join(dir, "auditor")
	pemFile := filepath.Join(dir, "auditor.pem")
	out, err := run(t, "keys", "auditor", "--data-dir", auditorDir, "--out", pemFile)
	if err != nil {
		t.Fatalf("keys auditor: %v\n%s", err, out)
	}
	audPrint := regexp.MustCompile(`fingerprint ([0-9a-f]{64})`).FindStringSubmatch(out)
	if audPrint == nil {
		t.Fatalf("keys auditor printed no fingerprint: %s", out)
	}
	if b, err := os.ReadFile(pemFile); err != nil || !bytes.HasPrefix(b, []byte("-----BEGIN PUBLIC KEY-----")) {
		t.Fatalf("the Auditor's public key file: %q %v", b, err)
	}
	out, err = run(t, "keys", "init", "--data-dir", ledgerDir)
	if err != nil {
		t.Fatalf("keys init: %v\n%s", err, out)
	}
	ledgerPrint := regexp.MustCompile(`proof key ([0-9a-f]{64})`).FindStringSubmatch(out)
	if ledgerPrint == nil {
		t.Fatalf("keys init printed no fingerprint: %s", out)
	}

	const ledgerToken, auditorToken = "ledger-admin-token-0123", "auditor-admin-token-0123"
	t.Setenv("KIROKU_ADMIN_TOKEN", ledgerToken)
	t.Setenv("KIROKU_AUDITOR_ADMIN_TOKEN", auditorToken)
	ledgerAddr := startCmd(t, "server", "--data-dir", ledgerDir, "--auditor-key", pemFile)
	auditorAddr := startCmd(t, "auditor", "--data-dir", auditorDir, "--ledger", ledgerAddr, "--ledger-key", ledgerPrint[1], "--lease", "2s")

	for name, content := range map[string]string{"ledger.token": ledgerToken, "auditor.token": auditorToken,
		"counter.star": "def invoke(ledger, args):\n    cur = ledger.get('n')\n    n = 0 if cur == None else cur['value']\n    ledger.put('n', n + 1)\n    return n + 1\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := json.Marshal(map[string]any{"server": ledgerAddr, "entity": "ops", "secret_hex": strings.Repeat("cd", 32),
		"admin_token_file": "ledger.token", "mode": "auditor", "auditor": auditorAddr, "auditor_key": audPrint[1],
		"auditor_admin_token_file": "auditor.token"})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "client.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"register-secret"}, {"register-contract", "--contract-id", "counter", "--contract-file", filepath.Join(dir, "counter.star")}} {
		if out, err := run(t, append(args, "--config", cfgFile)...); err != nil {
			t.Fatalf("%s: %v\n%s", args[0], err, out)
		}
	}
	for i := 1; i <= 2; i++ {
		out, err := run(t, "execute-contract", "--config", cfgFile, "--contract-id", "counter", "--json")
		if err != nil {
			t.Fatalf("execute-contract through the Auditor: %v\n%s", err, out)
		}
		var res struct{ Result json.RawMessage }
		if err := json.Unmarshal([]byte(out), &res); err != nil || string(res.Result) != string(rune('0'+i)) {
			t.Fatalf("execute %d: %s (%v)", i, out, err)
		}
	}
	// Without the Auditor, the ledger refuses.
	direct, _ := json.Marshal(map[string]any{"server": ledgerAddr, "entity": "ops", "secret_hex": strings.Repeat("cd", 32)})
	if err := os.WriteFile(cfgFile, direct, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "execute-contract", "--config", cfgFile, "--contract-id", "counter"); err == nil || !strings.Contains(err.Error(), "order token") {
		t.Fatalf("a direct execute on a ledger with an Auditor: %v\n%s", err, out)
	}
}
