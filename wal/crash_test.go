package wal

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kiroku-db/kiroku/internal/testenv"
)

// crashSeeds is the number of seeds per policy: KIROKU_WAL_CRASH_SEEDS, or
// 100 (20 with -short).
func crashSeeds(t *testing.T) int { return testenv.Count(t, "KIROKU_WAL_CRASH_SEEDS", 100, 20) }

// TestCrashRecovery: writers append under each policy; at a random moment
// the machine "crashes" (the filesystem keeps what was synced and a random
// share of what was not, 4 KiB blocks at a time, so writes tear); the log
// is reopened on what survived. Every acknowledged record (for Periodic:
// every record covered by an fsync) must be there, at its index, intact;
// nothing that was never appended may appear; each writer's records must
// be in its order; and recovery must never mistake the crash for corruption.
func TestCrashRecovery(t *testing.T) {
	seeds := crashSeeds(t)
	for _, p := range []Policy{BatchPolicy(), GroupPolicy(500 * time.Microsecond), CountPolicy(8, time.Millisecond),
		PeriodicPolicy(time.Millisecond)} {
		t.Run(p.String(), func(t *testing.T) {
			torn, recycled := 0, uint64(0)
			for seed := range seeds {
				tt, r := crashOnce(t, p, uint64(seed))
				if tt {
					torn++
				}
				recycled += r
				if t.Failed() {
					t.Fatalf("seed %d failed", seed)
				}
			}
			t.Logf("%d crashes, %d left a torn tail; %d segments were reused", seeds, torn, recycled)
			if seeds >= 20 && recycled == 0 {
				t.Errorf("no crash run reused a truncated segment")
			}
		})
	}
}

func crashOnce(t *testing.T, p Policy, seed uint64) (tornTail bool, recycled uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(p.Kind)))
	fs := vfs.NewCrashableMem()
	// A slow fsync holds written, unsynced bytes in the file for a while,
	// so crashes land among them and tear them.
	cfg := testConfig(DelaySyncFS(fs, time.Duration(rng.IntN(1500))*time.Microsecond), p)
	cfg.SegmentSize = int64(8192 * (1 + rng.IntN(6)))
	cfg.MaxRecordSize = 4096
	// Half the crashes run with a checkpointer that truncates the log's
	// prefix, and most of those keep truncated segments for reuse: a
	// crash then lands among renames and overwrites of kept files too.
	truncating := rng.IntN(2) == 0
	if truncating {
		cfg.RecycleSegments = rng.IntN(4)
	}
	l := mustOpen(t, cfg)
	writers := 1 + rng.IntN(16)
	fill := 50 + rng.IntN(3500) // records often larger than the FS's 4 KiB crash blocks
	crashAfter := rng.IntN(250)
	unsynced := []int{0, 100, 25 + rng.IntN(51), 25 + rng.IntN(51)}[rng.IntN(4)] // none, all, or (most often) a share that tears
	cloneRNG := rand.New(rand.NewPCG(seed, 7))

	var mu sync.Mutex
	acked := map[uint64][]byte{}
	attempted := map[string]bool{}
	var stop atomic.Bool
	var wg sync.WaitGroup
	ackc := make(chan struct{}, 1000)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 0; s < 300 && !stop.Load(); s++ {
				pl := payloadUpTo(w, s, fill)
				mu.Lock()
				attempted[string(pl)] = true
				mu.Unlock()
				idx, err := l.Append(context.Background(), pl)
				if err != nil {
					if !stop.Load() {
						t.Errorf("seed %d: append: %v", seed, err)
					}
					return
				}
				mu.Lock()
				acked[idx] = pl
				mu.Unlock()
				select {
				case ackc <- struct{}{}:
				default:
				}
			}
		}()
	}
	if truncating {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if d := l.DurableIndex(); d > 20 {
					if err := l.TruncateFront(d - 20); err != nil && !stop.Load() {
						t.Errorf("seed %d: truncate front: %v", seed, err)
						return
					}
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for n := 0; n < crashAfter; n++ {
		select {
		case <-ackc:
		case <-done:
			n = crashAfter
		}
	}
	// Crash at a random moment, often inside an fsync with bytes written
	// and not yet synced.
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
	// The crash: what was acknowledged, and what an fsync covered, before it.
	mu.Lock()
	snapshot := make(map[uint64][]byte, len(acked))
	for k, v := range acked {
		snapshot[k] = v
	}
	durable := l.DurableIndex()
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: cloneRNG})
	durableAfter := l.DurableIndex() // the truncator went no further than this - 20
	mu.Unlock()
	stop.Store(true)
	<-done
	recycled = l.Stats().Recycled
	l.Close()

	cfg.FS = crashed
	l2, err := Open(cfg)
	if err != nil {
		t.Errorf("seed %d (%d writers, %d%% unsynced kept): reopen after crash: %v", seed, writers, unsynced, err)
		return false, recycled
	}
	defer l2.Close()
	all := readAll(t, l2)
	first := l2.FirstIndex()
	if uint64(len(all)) != l2.LastIndex()+1-first {
		t.Errorf("seed %d: %d records for indexes %d..%d", seed, len(all), first, l2.LastIndex())
	}
	if !truncating && first != 1 {
		t.Errorf("seed %d: first index %d without truncation", seed, first)
	}
	for idx, pl := range snapshot {
		if p.Kind == Periodic && idx > durable {
			continue // acknowledged but never synced: Periodic may lose it
		}
		if idx < first && idx+20 <= durableAfter {
			continue // truncated
		}
		if !bytes.Equal(all[idx], pl) {
			t.Errorf("seed %d: acknowledged record %d lost or changed: have %.20q, want %.20q", seed, idx, all[idx], pl)
			return false, recycled
		}
	}
	lastSeq := map[int]int{}
	seen := map[string]bool{}
	for idx := first; idx <= l2.LastIndex(); idx++ {
		pl := all[idx]
		if !attempted[string(pl)] || seen[string(pl)] {
			t.Errorf("seed %d: record %d (%.20q) was never appended, or appears twice", seed, idx, pl)
			return false, recycled
		}
		seen[string(pl)] = true
		var w, s int
		if _, err := fmt.Sscanf(string(pl), "w%d/s%d/", &w, &s); err != nil {
			t.Errorf("seed %d: record %d unparsable", seed, idx)
			return false, recycled
		}
		if prev, ok := lastSeq[w]; ok && s <= prev {
			t.Errorf("seed %d: writer %d's record %d comes after its record %d", seed, w, s, prev)
			return false, recycled
		}
		lastSeq[w] = s
	}
	// The recovered log takes appends and survives a clean reopen.
	if _, err := l2.Append(context.Background(), []byte("after")); err != nil {
		t.Errorf("seed %d: append after recovery: %v", seed, err)
	}
	return l2.Recovery().TornTail != nil, recycled
}
