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
	for _, bad := range []string{"count:0", "group:x", "fast"} {
		if _, err := ParseRaftPolicy(bad, time.Millisecond); err == nil {
			t.Errorf("policy %q accepted", bad)
		}
	}
}
