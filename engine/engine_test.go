package engine_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/storagetest"
)

// opener returns a storagetest.Opener whose backends reach the same data
// directory on every call within one test.
func opener(cfg engine.Config) storagetest.Opener {
	var mu sync.Mutex
	dirs := map[*testing.T]string{}
	return func(t *testing.T) storage.Backend {
		t.Helper()
		mu.Lock()
		dir, ok := dirs[t]
		if !ok {
			dir = t.TempDir()
			dirs[t] = dir
		}
		mu.Unlock()
		c := cfg
		c.Dir = dir
		db, err := engine.Open(c)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		return db
	}
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, opener(engine.Config{}))
}

// TestContentionHistory runs list-append histories on a hot set of 10 keys
// with 2 to 8 clients and checks each for dependency cycles.
func TestContentionHistory(t *testing.T) {
	open := opener(engine.Config{EpochInterval: time.Millisecond})
	for _, workers := range []int{2, 4, 8} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("workers=%d/seed=%d", workers, seed), func(t *testing.T) {
				storagetest.RunHistory(t, open, storagetest.HistoryConfig{Keys: 10, Workers: workers, PerWorker: 60, Seed: seed})
			})
		}
	}
}
