package replication

import (
	"sync"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

// replicatedBackend is the leader's engine of a three-member group in
// this process; closing it stops the whole group, and opening the same
// directory again restarts it: the new leader's engine is rebuilt from
// the Raft log before it takes writes.
type replicatedBackend struct {
	*engine.DB
	silos *LocalSilos
}

func (b replicatedBackend) Close() error { return b.silos.Close() }

// TestConformance runs the storage conformance suite on the leader of a
// three-member replicated engine.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("the conformance suite on a replicated engine takes a while; run without -short")
	}
	var mu sync.Mutex
	dirs := map[*testing.T]string{}
	storagetest.Run(t, func(t *testing.T) storage.Backend {
		t.Helper()
		mu.Lock()
		dir, ok := dirs[t]
		if !ok {
			dir = t.TempDir()
			dirs[t] = dir
		}
		mu.Unlock()
		silos, err := StartLocalSilos(3, dir, Config{TickInterval: 10 * time.Millisecond, PreVote: true, CheckQuorum: true, SegmentSize: 8 << 20},
			engine.Config{EpochInterval: 2 * time.Millisecond, CheckpointInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		_, leader, err := silos.Leader(20 * time.Second)
		if err != nil {
			silos.Close()
			t.Fatal(err)
		}
		return replicatedBackend{DB: leader.DB(), silos: silos}
	})
}
