package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestDiskLoad checks that the load paces itself to its rate, writes
// with the process's write_bytes counting it, and that its file goes.
func TestDiskLoad(t *testing.T) {
	if diskWriteBytes() < 0 {
		t.Skip("no /proc/self/io here")
	}
	dir := t.TempDir()
	dl := DiskLoad{Rate: 40e6, Span: 64 << 20}
	io0 := diskWriteBytes()
	l, err := openDiskLoad(dir, dl)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := l.run(stop)
		done <- result{n, err}
	}()
	t0 := time.Now()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	r := <-done
	elapsed, io1 := time.Since(t0), diskWriteBytes()
	l.close()
	if r.err != nil {
		t.Fatal(r.err)
	}
	// Pacing bounds it from above whatever the disk's speed: one write
	// ahead of the rate at most.
	if limit := int64(dl.Rate*elapsed.Seconds()) + loadWrite; r.n > limit || r.n < loadWrite {
		t.Fatalf("wrote %d bytes in %v at %.0f B/s: want %d..%d", r.n, elapsed, dl.Rate, loadWrite, limit)
	}
	// The file is written in full before the load, then the load's bytes.
	if io1-io0 < dl.Span+r.n {
		t.Fatalf("write_bytes grew by %d over a load that wrote %d after filling %d", io1-io0, r.n, dl.Span)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("the load left %d files in its directory", len(left))
	}
}

func TestDiskLoadNeedsNoLog(t *testing.T) {
	for _, c := range []struct {
		log string
		dl  DiskLoad
	}{{"wal", DiskLoad{Rate: 1e6}}, {"none", DiskLoad{}}, {"none", DiskLoad{Rate: -1}}} {
		cfg := EngineConfig{Workload: "ycsb-wo", OpsPerTxn: 1, Records: 1, KeySize: 8, ValueSize: 1, Threads: 1,
			Log: c.log, Duration: time.Second, DiskLoad: &c.dl}
		if _, err := RunEngine(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "disk load") {
			t.Errorf("log %s, load %+v: err %v, want a disk load error", c.log, c.dl, err)
		}
	}
}
