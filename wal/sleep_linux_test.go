package wal

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
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
	s, err := newSleeper()
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
