package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wal"
)

// startupData makes a server data directory whose engine holds rows
// written in many commits, a full and a delta checkpoint, and log after
// them; it returns the engine's directory.
func startupData(t *testing.T) (dataDir, engineDir string) {
	t.Helper()
	dataDir = t.TempDir()
	engineDir = filepath.Join(dataDir, "engine")
	db, err := engine.Open(engine.Config{Dir: engineDir, EpochInterval: time.Millisecond, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tb := &storage.Table{Namespace: "s", Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeText}}}
	if err := errors.Join(db.CreateNamespace(ctx, "s"), db.CreateTable(ctx, tb)); err != nil {
		t.Fatal(err)
	}
	k := int64(0)
	burst := func() {
		for range 150 {
			k++
			if err := db.Put(ctx, &storage.Put{Namespace: "s", Table: "t", Partition: storage.Values{"k": storage.BigInt(k)},
				Values: storage.Values{"v": storage.Text(strings.Repeat("v", 200))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 2 { // a full checkpoint, then a delta
		burst()
		if _, err := db.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	burst()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dataDir, engineDir
}

func newest(t *testing.T, dir, prefix string) string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatalf("no %s* in %s", prefix, dir)
	}
	return names[len(names)-1]
}

// TestStartupFailures: every way the data directory or the backend can
// fail a server's start ends `kiroku server` with the underlying typed
// error, never a panic: a corrupt catalog, log or checkpoint, a checkpoint
// missing from the chain the logs need, a full disk, an unreachable
// PostgreSQL.
func TestStartupFailures(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, engineDir string)
		check  func(err error) bool
	}{
		{"catalog edited in a checkpoint", func(t *testing.T, dir string) {
			name := newest(t, dir, "delta-")
			b, _ := os.ReadFile(name)
			os.WriteFile(name, []byte(strings.Replace(string(b), `"t"`, `"u"`, 1)), 0o644)
		}, func(err error) bool { var ce *engine.CorruptionError; return errors.As(err, &ce) }},
		{"a data directory of an older format", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "catalog.json"), []byte("{}\n"), 0o644)
		}, func(err error) bool { return errors.Is(err, engine.ErrOldLayout) }},
		{"log zeroed at its start", func(t *testing.T, dir string) {
			zero(t, newest(t, filepath.Join(dir, "log"), "0"), 0, 4096)
		}, func(err error) bool { var ce *wal.CorruptionError; return errors.As(err, &ce) }},
		{"checkpoint damaged", func(t *testing.T, dir string) {
			zero(t, newest(t, dir, "checkpoint-"), 100, 8)
		}, func(err error) bool { var ce *engine.CorruptionError; return errors.As(err, &ce) }},
		{"newest delta checkpoint missing", func(t *testing.T, dir string) {
			os.Remove(newest(t, dir, "delta-"))
		}, func(err error) bool { return errors.Is(err, engine.ErrLogGap) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dataDir, engineDir := startupData(t)
			c.damage(t, engineDir)
			out, err := startOnce(t, "--data-dir", dataDir)
			if err == nil || !c.check(err) {
				t.Fatalf("kiroku server returned %v; output:\n%s", err, out)
			}
			t.Log(err)
		})
	}

	t.Run("disk full", func(t *testing.T) {
		fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
			if op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt {
				return syscall.ENOSPC
			}
			return nil
		}))
		_, err := server.Start(context.Background(), server.Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
			Engine: engine.Config{FS: fs}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Start on a full disk returned %v, want ENOSPC", err)
		}
	})

	t.Run("PostgreSQL unreachable", func(t *testing.T) {
		out, err := startOnce(t, "--data-dir", t.TempDir(), "--backend", "postgres",
			"--postgres-dsn", "postgres://kiroku@127.0.0.1:1/kiroku?connect_timeout=5")
		if err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
			t.Fatalf("kiroku server returned %v; output:\n%s", err, out)
		}
	})
}

// TestStartupFailureExit runs the binary itself on a corrupt checkpoint:
// it must print the error and exit with status 1, not panic.
func TestStartupFailureExit(t *testing.T) {
	dataDir, engineDir := startupData(t)
	zero(t, newest(t, engineDir, "checkpoint-"), 100, 8)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "server", "--data-dir", dataDir, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "KIROKU_TEST_RUN_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(string(out), "panic") || !strings.Contains(string(out), "corrupt checkpoint-") {
		t.Fatalf("kiroku server on a corrupt catalog: %v, output:\n%s", err, out)
	}
}

// startOnce runs `kiroku server` with args; a server that starts instead
// of failing is stopped after 30 s and reported as started.
func startOnce(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := rootCmd()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"server", "--listen", "127.0.0.1:0", "--log-level", "warn"}, args...))
	err := cmd.ExecuteContext(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the server started and ran (stopped: %v); output:\n%s", err, out.String())
	}
	return out.String(), err
}

// zero overwrites n bytes of a file at off with zeros.
func zero(t *testing.T, name string, off int64, n int) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, n), off); err != nil {
		t.Fatal(fmt.Errorf("zeroing %s: %w", name, err))
	}
}
