package engine_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
)

// TestOpenLocksDirectory checks that a data directory has one open engine
// at a time in a process: a second Open, under the same or a relative
// name, or on the same in-memory filesystem, fails with ErrLocked and
// leaves the first engine working; Close releases the directory.
func TestOpenLocksDirectory(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	dir := filepath.Join(parent, "db")
	first := openKV(t, engine.Config{Dir: dir})
	t.Chdir(parent)
	for _, name := range []string{dir, "db", "./db/"} {
		if db, err := engine.Open(engine.Config{Dir: name}); !errors.Is(err, engine.ErrLocked) {
			if db != nil {
				db.Close()
			}
			t.Fatalf("second Open of %q: %v; want ErrLocked", name, err)
		}
	}
	if err := putKV(ctx, first, 1, 42); err != nil {
		t.Fatalf("the first engine after the refused opens: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again := openKV(t, engine.Config{Dir: dir})
	defer again.Close()
	if got, err := getKV(ctx, again, 1); err != nil || got != 42 {
		t.Fatalf("reopened: %d, %v", got, err)
	}

	mem := vfs.NewMem()
	m := openKV(t, engine.Config{Dir: "/m", FS: mem})
	if db, err := engine.Open(engine.Config{Dir: "/m", FS: mem}); !errors.Is(err, engine.ErrLocked) {
		if db != nil {
			db.Close()
		}
		t.Fatalf("second Open on one MemFS: %v; want ErrLocked", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := openKV(t, engine.Config{Dir: "/m", FS: mem}).Close(); err != nil {
		t.Fatal(err)
	}
}

// lockHelperEnv names the directory a helper process opens and holds.
const lockHelperEnv = "KIROKU_ENGINE_LOCK_HELPER_DIR"

// TestOpenLockedByAnotherProcess checks the lock across processes: while a
// child process (this test binary) holds the engine open, Open here fails
// with ErrLocked; once the child is killed, without closing anything, the
// directory opens and holds what the child committed.
func TestOpenLockedByAnotherProcess(t *testing.T) {
	if dir := os.Getenv(lockHelperEnv); dir != "" {
		if err := putKV(context.Background(), openKV(t, engine.Config{Dir: dir}), 1, 7); err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("open\n")
		// Until killed; a child its parent failed to kill still exits.
		time.Sleep(2 * time.Minute)
		t.Fatal("the helper was not killed")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenLockedByAnotherProcess$")
	cmd.Env = append(os.Environ(), lockHelperEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}
	if db, err := engine.Open(engine.Config{Dir: dir}); !errors.Is(err, engine.ErrLocked) {
		if db != nil {
			db.Close()
		}
		t.Fatalf("Open while another process has the directory open: %v; want ErrLocked", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	db := openKV(t, engine.Config{Dir: dir})
	defer db.Close()
	if got, err := getKV(context.Background(), db, 1); err != nil || got != 7 {
		t.Fatalf("after the child was killed: %d, %v", got, err)
	}
}
