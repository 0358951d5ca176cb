package engine_test

import (
	"sync"
	"testing"

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
