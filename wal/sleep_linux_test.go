package wal

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"

	"github.com/kiroku-db/kiroku/internal/testenv"
)

// waitArmed waits until the sleeper is in (or entering) a sleep, and
// reports false if unless ends first.
func waitArmed(t *testing.T, s *sleeper, unless <-chan error) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.armed.Load() {
		select {
		case err := <-unless:
			if err != nil {
				t.Fatal(err)
			}
			return false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the sleeper never slept")
		}
		runtime.Gosched()
	}
	return true
}

func TestSleeperInterrupt(t *testing.T) {
	s, err := newSleeper(clockwork.NewRealClock())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	wake := make(chan struct{}, 1)

	// A nudge left in the channel before the sleep ends it at once.
	wake <- struct{}{}
	s.sleep(time.Hour, wake)
	if len(wake) != 0 || s.woken.Load() != 1 {
		t.Fatalf("token: channel %d, woken %d", len(wake), s.woken.Load())
	}

	// An interrupt during the sleep ends it.
	done := make(chan struct{})
	go func() { s.sleep(time.Hour, wake); close(done) }()
	waitArmed(t, s, nil)
	s.interrupt()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an interrupted hour-long sleep did not end")
	}
	if s.woken.Load() != 2 {
		t.Fatalf("woken %d, want 2", s.woken.Load())
	}

	// The eventfd was drained: the next sleep runs to its timeout.
	start := time.Now()
	s.sleep(2*time.Millisecond, wake)
	if d := time.Since(start); d < 2*time.Millisecond || s.woken.Load() != 2 {
		t.Fatalf("a plain sleep lasted %v, woken %d", d, s.woken.Load())
	}
}

// A Count log whose threshold is reached while the syncer sleeps out the
// last stretch of MaxWait starts the round then, not when the sleep ends.
func TestCountThresholdEndsThePreciseSleep(t *testing.T) {
	l := mustOpen(t, testConfig(vfs.NewMem(), CountPolicy(2, time.Millisecond)))
	defer l.Close()
	for i := range 20 {
		first := appendAsync(l, payload(0, i))
		if !waitArmed(t, l.sleeper, first) { // the syncer sleeps toward MaxWait
			continue // the first append's round came before the test looked
		}
		before := l.sleeper.woken.Load()
		if _, err := l.Append(context.Background(), payload(1, i)); err != nil {
			t.Fatal(err)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if l.sleeper.woken.Load() > before {
			return
		}
	}
	t.Fatal("in 20 tries the second append never ended the syncer's sleep: the round waited for MaxWait")
}

// With buffered I/O, a segment the syncer has left, synced, has its pages
// dropped from the page cache; the active one keeps its pages.
func TestSealedSegmentsLeaveCache(t *testing.T) {
	dir := testenv.DiskDir(t)
	cfg := testConfig(vfs.Default, BatchPolicy())
	cfg.Dir, cfg.SegmentSize, cfg.BufferedIO = dir, 256<<10, true
	l := mustOpen(t, cfg)
	defer l.Close()
	var names []string
	for i := 0; len(names) < 4; i++ {
		if _, err := l.Append(context.Background(), payload(0, i)); err != nil {
			t.Fatal(err)
		}
		var err error
		if names, err = filepath.Glob(filepath.Join(dir, "*"+segSuffix)); err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(names)
	active := names[len(names)-1]
	if n := testenv.Resident(t, active); n == 0 {
		t.Fatalf("the active segment has no page cached: the check cannot see pages")
	}
	for _, name := range names[:len(names)-1] {
		deadline := time.Now().Add(10 * time.Second)
		for testenv.Resident(t, name) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("sealed segment %s still has %d pages cached", filepath.Base(name), testenv.Resident(t, name))
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// By default segments are written with direct I/O: neither the zero-fill
// nor the records leave a page in the cache, and what was written (every
// append of a few bytes rewrites its block's start) reads back whole,
// across segments and a reopen.
func TestDirectIOBypassesCache(t *testing.T) {
	dir := testenv.DiskDir(t)
	cfg := testConfig(vfs.Default, BatchPolicy())
	cfg.Dir, cfg.SegmentSize = dir, 64<<10
	l := mustOpen(t, cfg)
	const n = 2000 // about 4 segments of 64 KiB
	for i := range n {
		if _, err := l.Append(context.Background(), payload(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	names, err := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 3 {
		t.Fatalf("%d segments, want several", len(names))
	}
	for _, name := range names {
		if r := testenv.Resident(t, name); r > 0 {
			t.Fatalf("%s has %d pages cached: not written with direct I/O", filepath.Base(name), r)
		}
	}
	check := func(l *Log) {
		t.Helper()
		all := readAll(t, l)
		if len(all) != n {
			t.Fatalf("%d records, want %d", len(all), n)
		}
		for i := range n {
			if !bytes.Equal(all[uint64(i+1)], payload(0, i)) {
				t.Fatalf("record %d lost or changed", i+1)
			}
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, cfg)
	defer l.Close()
	check(l)
}

// TestZeros checks the zero-fill source: zeros, block-aligned, read-only,
// and in huge pages wherever the kernel offers them, so that one write of
// it is one request to the disk.
func TestZeros(t *testing.T) {
	zeros := zeros()
	if len(zeros) != zeroSize || !allZero(zeros) {
		t.Fatalf("zeros: %d bytes, all zero %v", len(zeros), allZero(zeros))
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(zeros)))
	if addr%(2<<20) != 0 {
		t.Errorf("zeros at %#x, not on a 2 MiB boundary", addr)
	}

	faulted := func() (faulted bool) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { faulted = recover() != nil }()
		zeros[zeroSize/2] = 1
		return false
	}()
	if !faulted {
		zeros[zeroSize/2] = 0
		t.Error("a write to zeros did not fault: it is writable")
	}

	thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || bytes.Contains(thp, []byte("[never]")) {
		t.Logf("transparent huge pages are off (%q, %v): not checking the page size", thp, err)
		return
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	huge, found := int64(-1), false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
			found = uint64(addr) >= lo && uint64(addr) < hi
			continue
		}
		if kb, ok := strings.CutPrefix(line, "AnonHugePages:"); ok && found {
			huge, _ = strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			break
		}
	}
	if huge != zeroSize>>10 {
		t.Errorf("the mapping of zeros holds %d KiB of huge pages, want %d", huge, zeroSize>>10)
	}
}
