package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/internal/testenv"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "kiroku "+version) {
		t.Fatalf("kiroku version: %q, %v", out, err)
	}
	if _, err := run(t, "version", "extra"); err == nil {
		t.Fatal("kiroku version with an argument must fail")
	}
}

func TestBenchStorageBadFlags(t *testing.T) {
	if _, err := run(t, "bench", "storage", "--backend", "nope", "--dsn", "x"); err == nil || !strings.Contains(err.Error(), "unknown backend") {
		t.Fatalf("unknown backend: %v", err)
	}
	if _, err := run(t, "bench", "storage", "--backend", "postgres", "--dsn", "postgres://127.0.0.1:1/x"); err == nil ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("an unreachable server must fail as such: %v", err)
	}
}

// benchStorage runs a tiny bench storage with the given backend flags and
// checks it measured kiroku and a baseline end to end with sane figures,
// not how fast anything is. It returns the targets' names.
func benchStorage(t *testing.T, flags ...string) []string {
	t.Helper()
	args := append([]string{"bench", "storage", "--ops", "20", "--accounts", "20", "--workers", "4",
		"--duration", "300ms", "--runs", "1", "--json"}, flags...)
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("bench storage: %v\n%s", err, out)
	}
	var res struct {
		Median []struct {
			Target string
			Put    struct{ Ops int }
			Bank   struct{ Committed int64 }
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if len(res.Median) != 2 {
		t.Fatalf("want kiroku and a baseline, got %+v", res.Median)
	}
	var names []string
	for _, r := range res.Median {
		if r.Put.Ops != 20 || r.Bank.Committed == 0 {
			t.Fatalf("%s: %+v", r.Target, r)
		}
		names = append(names, r.Target)
	}
	return names
}

func TestBenchStorageRuns(t *testing.T) {
	benchStorage(t, "--backend", "postgres", "--dsn", testenv.PostgresDSN(t))
}

// TestBenchStorageEngine runs bench storage on the default backend, the
// embedded engine, with its no-log baseline.
func TestBenchStorageEngine(t *testing.T) {
	names := benchStorage(t, "--data-dir", t.TempDir())
	if !strings.Contains(names[0], "baseline") || names[1] != "kiroku engine" {
		t.Fatalf("want the engine and its baseline, got %v", names)
	}
}

func TestBenchEngineRuns(t *testing.T) {
	out, err := run(t, "bench", "engine", "--records", "2000", "--duration", "300ms", "--dir", t.TempDir(), "--recovery", "--json")
	if err != nil {
		t.Fatalf("bench engine: %v\n%s", err, out)
	}
	var res struct {
		Median []struct {
			Log             string
			Committed       int64
			RecoverySeconds float64 `json:"recovery_seconds"`
			LogBytes        int64   `json:"log_bytes"`
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if len(res.Median) != 2 || res.Median[0].Log != "wal" || res.Median[1].Log != "none" {
		t.Fatalf("want wal and the no-log baseline, got %+v", res.Median)
	}
	for _, r := range res.Median {
		if r.Committed == 0 {
			t.Fatalf("%s measured nothing: %+v", r.Log, r)
		}
	}
	if wal := res.Median[0]; wal.LogBytes == 0 || wal.RecoverySeconds <= 0 {
		t.Fatalf("no log written or no recovery timed: %+v", wal)
	}
	if none := res.Median[1]; none.RecoverySeconds != 0 {
		t.Fatalf("the no-log baseline has nothing to recover, yet timed a recovery: %+v", none)
	}
	if _, err := run(t, "bench", "engine", "--workload", "nope", "--dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "unknown workload") {
		t.Fatalf("unknown workload: %v", err)
	}
}

// TestBenchEngineInterleaved runs bench engine --interleave and checks
// the flags it refuses beside it.
func TestBenchEngineInterleaved(t *testing.T) {
	out, err := run(t, "bench", "engine", "--records", "2000", "--duration", "300ms", "--interleave", "100ms", "--dir", t.TempDir(), "--json")
	if err != nil {
		t.Fatalf("bench engine --interleave: %v\n%s", err, out)
	}
	var res struct {
		WAL, None struct {
			Log       string
			Committed int64
		}
		Slices []struct{ Log string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if res.WAL.Log != "wal" || res.None.Log != "none" || res.WAL.Committed == 0 || res.None.Committed == 0 || len(res.Slices) != 8 {
		t.Fatalf("want 4 slices of each mode pooled into wal and none, got %+v", res)
	}
	out, err = run(t, "bench", "engine", "--records", "2000", "--duration", "300ms", "--interleave", "100ms", "--dir", t.TempDir())
	if err != nil || !strings.Contains(out, "logging cost:") || !strings.Contains(out, "pairs of slices: cost median") {
		t.Fatalf("bench engine --interleave: %v\n%s", err, out)
	}
	for _, extra := range [][]string{{"--runs", "3"}, {"--log", "none"}, {"--baseline=false"}, {"--disk-baseline"}} {
		args := append([]string{"bench", "engine", "--records", "2000", "--duration", "300ms", "--interleave", "100ms", "--dir", t.TempDir()}, extra...)
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "--interleave compares wal with none") {
			t.Fatalf("%v: %v", extra, err)
		}
	}
}

func TestBenchEngineDiskBaseline(t *testing.T) {
	out, err := run(t, "bench", "engine", "--records", "2000", "--duration", "300ms", "--dir", t.TempDir(), "--disk-baseline", "--json")
	if err != nil {
		t.Fatalf("bench engine: %v\n%s", err, out)
	}
	type load struct {
		Rate float64 `json:"bytes_per_s"`
		Span int64   `json:"span_bytes"`
	}
	var res struct {
		Median []struct {
			Log       string
			Committed int64
			DiskRate  float64 `json:"disk_write_bytes_per_s"`
			LogSpan   int64   `json:"log_span_bytes"`
			DiskLoad  *load   `json:"disk_load"`
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	m := res.Median
	if len(m) != 3 || m[0].Log != "wal" || m[1].Log != "none" || m[2].Log != "none" || m[1].DiskLoad != nil || m[2].DiskLoad == nil {
		t.Fatalf("want wal, none, and none under a disk load, got %+v", m)
	}
	wal, loaded := m[0], m[2]
	if wal.DiskRate <= 0 || wal.LogSpan <= 0 || loaded.Committed == 0 {
		t.Fatalf("the wal run wrote nothing, or the loaded run measured nothing: %+v", m)
	}
	if *loaded.DiskLoad != (load{wal.DiskRate, wal.LogSpan}) {
		t.Fatalf("the load is %+v, want the wal run's %.0f B/s over %d bytes", *loaded.DiskLoad, wal.DiskRate, wal.LogSpan)
	}
	// The load writes its file in full before the window, then at most
	// one write ahead of its rate: what the window saw is no more. (It
	// may see nothing: a 4 MiB write can outlast 300 ms on a busy disk.)
	if limit := wal.DiskRate + (4<<20)/0.3; loaded.DiskRate < 0 || loaded.DiskRate > limit {
		t.Fatalf("the loaded run wrote %.0f B/s, want 0..%.0f", loaded.DiskRate, limit)
	}
	if _, err := run(t, "bench", "engine", "--log", "none", "--disk-baseline", "--dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "--disk-baseline needs") {
		t.Fatalf("--disk-baseline without a wal run: %v", err)
	}
}

func TestBenchWALRuns(t *testing.T) {
	out, err := run(t, "bench", "wal", "--sync=group", "--window=1ms", "--writers=4", "--duration=200ms",
		"--dir", t.TempDir(), "--json")
	if err != nil {
		t.Fatalf("bench wal: %v\n%s", err, out)
	}
	var res []struct {
		Mode    string
		Appends int64
		Fsyncs  uint64
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if len(res) != 2 || res[0].Mode != "group" || res[1].Mode != "raw" {
		t.Fatalf("want the policy and the raw baseline, got %+v", res)
	}
	for _, r := range res {
		if r.Appends == 0 || r.Fsyncs == 0 {
			t.Fatalf("%s measured nothing: %+v", r.Mode, r)
		}
	}
	if _, err := run(t, "bench", "wal", "--sync=nope", "--duration=10ms", "--dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Fatalf("unknown mode: %v", err)
	}
	if _, err := run(t, "bench", "wal", "--curve", "--rates=abc", "--dir", t.TempDir()); err == nil {
		t.Fatal("a bad --rates must fail")
	}
}

// TestMain lets a test start this binary as the kiroku command: a child
// started with KIROKU_TEST_RUN_MAIN=1 (bench ledger --split starts "kiroku
// server" from os.Executable) runs main instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("KIROKU_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// jsonOf decodes the JSON object a command printed after its progress
// lines into v, failing the test (not panicking) if there is none.
func jsonOf(t *testing.T, out string, v any) {
	t.Helper()
	i, j := strings.Index(out, "{"), strings.LastIndex(out, "}")
	if i < 0 || j < i {
		t.Fatalf("no JSON object in the output:\n%s", out)
	}
	if err := json.Unmarshal([]byte(out[i:j+1]), v); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestMemoryAvailable: the default memory limit is taken from the
// machine's memory as /proc/meminfo reports it, or from a lower cgroup
// limit.
func TestMemoryAvailable(t *testing.T) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Skip("no /proc/meminfo:", err)
	}
	var kb uint64
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			if _, err := fmt.Sscan(f[1], &kb); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := memoryAvailable()
	if got == 0 || got > kb*1024 {
		t.Fatalf("memoryAvailable() = %d; MemTotal is %d bytes", got, kb*1024)
	}
	if lim, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err != nil || strings.TrimSpace(string(lim)) == "max" {
		if got != kb*1024 {
			t.Fatalf("memoryAvailable() = %d without a cgroup limit; MemTotal is %d bytes", got, kb*1024)
		}
	}
}
