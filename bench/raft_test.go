package bench

import (
	"context"
	"testing"
	"time"
)

// TestRaftRuns: a short run of every kind of policy commits puts through
// a three-node group and measures them.
func TestRaftRuns(t *testing.T) {
	cfg := RaftConfig{Nodes: 3, Clients: []int{4}, ValueSizes: []int{100}, KeySize: 8,
		Policies: []string{"entry", "append", "batch", "count:10", "group:1ms", "none"}, MaxWait: time.Millisecond,
		Warmup: 100 * time.Millisecond, Duration: 300 * time.Millisecond, Dir: t.TempDir()}
	points, err := RunRaft(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 6 {
		t.Fatalf("%d points, want 6", len(points))
	}
	for _, p := range points {
		if p.Puts == 0 || p.PutsPerS <= 0 || p.P50ms <= 0 || p.CPUus <= 0 {
			t.Errorf("%+v: nothing measured", p)
		}
		if p.Unsafe != (p.Policy == "none") {
			t.Errorf("%+v: unsafe only for none", p)
		}
	}
	failovers, err := RaftFailover(context.Background(), 3, 1, t.TempDir())
	if err != nil || len(failovers) != 1 || failovers[0] <= 0 || failovers[0] > 10*time.Second {
		t.Fatalf("failover: %v, %v", failovers, err)
	}
	for _, bad := range []string{"count:0", "group:x", "fast"} {
		if _, err := ParseRaftPolicy(bad, time.Millisecond); err == nil {
			t.Errorf("policy %q accepted", bad)
		}
	}
}

// TestEngineReplicated: the engine's workload on the leader of a
// three-member group commits, and its log is replicated.
func TestEngineReplicated(t *testing.T) {
	res, err := RunEngine(context.Background(), EngineConfig{Workload: "ycsb-wo", OpsPerTxn: 10, Records: 10000, KeySize: 8, ValueSize: 8,
		Threads: 2, Log: "wal", Epoch: 5 * time.Millisecond, Duration: 500 * time.Millisecond, Replicas: 2, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Committed == 0 || res.Replicas != 2 || res.ReplicatedBytesPerTxn < 10 {
		t.Fatalf("%+v: nothing replicated", res)
	}
}
