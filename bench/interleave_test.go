package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRunEngineInterleaved: the two engines run in wal-none-none-wal
// order until each has run for the duration, each mode pools its own
// slices, and a wal slice runs on while one of its checkpoints is busy,
// which a small CheckpointLogSize makes frequent. The runner itself
// fails if a checkpoint of the wal engine is busy around a none slice.
func TestRunEngineInterleaved(t *testing.T) {
	cfg := EngineConfig{Workload: "ycsb-wo", OpsPerTxn: 10, Records: 20000, KeySize: 8, ValueSize: 8, Threads: 2,
		Epoch: 5 * time.Millisecond, Duration: 500 * time.Millisecond, Dir: t.TempDir(), CheckpointLogSize: 1 << 20}
	slice := 100 * time.Millisecond
	res, err := RunEngineInterleaved(context.Background(), cfg, slice)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Slices) != 12 {
		t.Fatalf("%d slices, want 12: 6 of each mode (5 rounded up to whole wal-none-none-wal blocks)", len(res.Slices))
	}
	var seconds [2]float64
	var committed [2]int64
	for i, s := range res.Slices {
		want := []string{"wal", "none", "none", "wal"}[i%4]
		if s.Log != want {
			t.Fatalf("slice %d is %s, want %s", i, s.Log, want)
		}
		m := 0
		if s.Log == "none" {
			m = 1
		}
		if s.Committed == 0 || s.Seconds < slice.Seconds() || s.CPUMicros <= 0 {
			t.Fatalf("slice %d: %+v", i, s)
		}
		seconds[m] += s.Seconds
		committed[m] += s.Committed
	}
	if res.WAL.Log != "wal" || res.None.Log != "none" || res.WAL.Committed != committed[0] || res.None.Committed != committed[1] ||
		res.WAL.Seconds != seconds[0] || res.None.Seconds != seconds[1] {
		t.Fatalf("pooled %+v and %+v, slices sum to %v s %d and %v s %d", res.WAL, res.None, seconds[0], committed[0], seconds[1], committed[1])
	}
	if want := 1 - res.WAL.TxnPerSec/res.None.TxnPerSec; res.Cost != want {
		t.Fatalf("cost %v, want %v", res.Cost, want)
	}
	if len(res.PairCosts) != 6 {
		t.Fatalf("%d pair costs, want 6", len(res.PairCosts))
	}
	if res.Extended <= 0 {
		t.Fatalf("no wal slice ran on for a checkpoint, with one due every MiB of log: %+v", res)
	}

	bad := cfg
	bad.SyncClients = 1
	if _, err := RunEngineInterleaved(context.Background(), bad, slice); err == nil || !strings.Contains(err.Error(), "workers only") {
		t.Fatalf("sync clients: %v", err)
	}
	if _, err := RunEngineInterleaved(context.Background(), cfg, time.Second); err == nil || !strings.Contains(err.Error(), "at most the duration") {
		t.Fatalf("a slice longer than the duration: %v", err)
	}
}
