package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startServer runs "kiroku server" with args in this process until stop
// is called or the test ends. done closes when the command returns, its
// error then in *result.
func startServer(t *testing.T, args ...string) (done <-chan struct{}, result *error, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"server", "--log-level", "warn"}, args...))
	ch, res := make(chan struct{}), new(error)
	go func() {
		*res = cmd.ExecuteContext(ctx)
		close(ch)
	}()
	stop = func() {
		cancel()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Error("the server did not stop within 30 s of its context's end")
		}
	}
	t.Cleanup(stop)
	return ch, res, stop
}

// TestServerAddrFile: with --listen on port 0, --addr-file receives the
// address the server picked, whole, once it accepts connections, the
// ledger answers there, and the file goes when the server stops.
func TestServerAddrFile(t *testing.T) {
	const token = "addr-file-token-0123456789"
	t.Setenv("KIROKU_ADMIN_TOKEN", token)
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	done, result, stop := startServer(t, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--addr-file", addrFile)
	var addr string
	for deadline := time.Now().Add(30 * time.Second); addr == ""; {
		b, err := os.ReadFile(addrFile)
		switch {
		case err == nil:
			addr = string(b)
		case !errors.Is(err, fs.ErrNotExist):
			t.Fatal(err)
		case time.Now().After(deadline):
			t.Fatal("no address file within 30 s")
		}
		select {
		case <-done:
			t.Fatalf("the server stopped: %v", *result)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !strings.HasSuffix(addr, "\n") {
		t.Fatalf("address file %q does not end its line", addr)
	}
	addr = strings.TrimSuffix(addr, "\n")
	if host, port, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("address file holds %q (%v); want 127.0.0.1 and the port picked", addr, err)
	}
	if _, err := os.Stat(addrFile + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the address file's temporary copy is left: %v", err)
	}
	cfg := filepath.Join(dir, "client.json")
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(`{"server":"`+addr+`","entity":"ops","secret_hex":"`+strings.Repeat("cd", 32)+
		`","admin_token_file":"token"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "register-secret", "--config", cfg); err != nil {
		t.Fatalf("register-secret at the address in the file: %v\n%s", err, out)
	}
	if out, err := run(t, "list-contracts", "--config", cfg); err != nil || !strings.Contains(out, "builtin.ycsb_f") {
		t.Fatalf("list-contracts at the address in the file: %v\n%s", err, out)
	}
	stop()
	if err := *result; err != nil {
		t.Fatalf("the server's shutdown: %v", err)
	}
	if _, err := os.Stat(addrFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the address file outlives the server: %v", err)
	}
}

// TestServerAddrFileUnwritable: a server that cannot write its address
// file stops with an error naming the flag rather than serving where no
// one will find it.
func TestServerAddrFileUnwritable(t *testing.T) {
	dir := t.TempDir()
	done, result, _ := startServer(t, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
		"--addr-file", filepath.Join(dir, "missing", "addr"))
	select {
	case <-done:
		if err := *result; err == nil || !strings.Contains(err.Error(), "--addr-file") {
			t.Fatalf("server with an unwritable --addr-file: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the server kept running without its address file")
	}
}
