package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// lingerDB opens an engine whose epochs close only when a committer asks
// (the tick is a minute away), with the commit delay bounded by delay.
func lingerDB(t *testing.T, delay time.Duration) (*DB, func(k int64) error) {
	t.Helper()
	db, err := Open(Config{Dir: t.TempDir(), EpochInterval: time.Minute, CommitDelay: delay, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	createKV(t, db, "t", storage.TypeBigInt)
	h, err := db.Table("t", "t")
	if err != nil {
		t.Fatal(err)
	}
	commit := func(k int64) error {
		x := db.BeginRaw()
		x.Write(h, h.PartitionKey(storage.BigInt(k)), []storage.Value{storage.BigInt(k)})
		e, err := x.CommitAsync(context.Background())
		if err != nil {
			return err
		}
		return db.WaitDurable(context.Background(), e)
	}
	return db, commit
}

// TestLoneCommitterNeverLingers: one client committing and waiting in a
// loop is never held for others, so its latency stays one write and
// fsync.
func TestLoneCommitterNeverLingers(t *testing.T) {
	db, commit := lingerDB(t, time.Minute)
	for i := range 200 {
		if err := commit(int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.loggers[0].lingers.Load(); n != 0 {
		t.Fatalf("a lone committer was held %d times", n)
	}
}

// TestLingerHoldsCloseForArrivingCommitters: once four committers have
// waited at once, a committer waiting alone is held until as many as the
// decayed peak (three) wait, and all of them are then made durable by the
// same close. Nothing is released early, and the waiting count returns to
// zero.
func TestLingerHoldsCloseForArrivingCommitters(t *testing.T) {
	db, commit := lingerDB(t, time.Minute)
	lg := db.loggers[0]

	// Four committers waiting together set the peak: the logger is held
	// before it reads the count until all four wait.
	hold := func() {
		for deadline := time.Now().Add(10 * time.Second); db.waiting.Load() < 4 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	testHookLinger.Store(&hold)
	var wg sync.WaitGroup
	for k := range 4 {
		wg.Go(func() {
			if err := commit(int64(k)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	testHookLinger.Store(nil)
	if t.Failed() {
		return
	}
	if lg.peakWaiting != 4 || lg.lingers.Load() != 0 {
		t.Fatalf("after four waited together: peak %d, lingers %d; want 4 and 0", lg.peakWaiting, lg.lingers.Load())
	}

	// The bound is the commit delay (a minute) rather than three rounds.
	lg.roundNs.Store(int64(time.Minute))
	first := make(chan error, 1)
	go func() { first <- commit(10) }()
	select {
	case err := <-first:
		t.Fatalf("a committer waiting alone after a peak of four was released at once (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if n := lg.lingers.Load(); n != 1 {
		t.Fatalf("lingers = %d, want 1", n)
	}
	for k := int64(11); k <= 12; k++ {
		wg.Go(func() {
			if err := commit(k); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held committer was not released when the others arrived")
	}
	if w := db.waiting.Load(); w != 0 {
		t.Fatalf("waiting = %d after every committer returned", w)
	}
}

// TestCommitDelayOff: with a negative CommitDelay a committer is never
// held, whatever the recent peak.
func TestCommitDelayOff(t *testing.T) {
	db, commit := lingerDB(t, -1)
	var wg sync.WaitGroup
	for round := range 20 {
		for k := range 8 {
			wg.Go(func() {
				if err := commit(int64(round*8 + k)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if n := db.loggers[0].lingers.Load(); n != 0 {
		t.Fatalf("held %d times with the delay off", n)
	}
}
