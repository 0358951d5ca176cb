package auditor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func acquireAsync(lt *lockTable, nonce string, reads, writes []string) chan error {
	ch := make(chan error, 1)
	go func() { ch <- lt.acquire(context.Background(), nonce, reads, writes, time.Minute) }()
	return ch
}

func granted(t *testing.T, ch chan error, want bool) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
		if !want {
			t.Fatal("granted while a conflicting request holds the lock")
		}
	case <-time.After(100 * time.Millisecond):
		if want {
			t.Fatal("not granted")
		}
	}
}

// TestLockConflicts: writers exclude everyone, readers share, a waiting
// writer is not overtaken by later readers, and release hands the lock on.
func TestLockConflicts(t *testing.T) {
	lt := newLockTable(nil)
	granted(t, acquireAsync(lt, "r1", []string{"x"}, nil), true)
	granted(t, acquireAsync(lt, "r2", []string{"x", "y"}, nil), true) // readers share
	w1 := acquireAsync(lt, "w1", nil, []string{"x"})
	granted(t, w1, false)
	r3 := acquireAsync(lt, "r3", []string{"x"}, nil) // behind the waiting writer
	granted(t, r3, false)
	lt.release("r1")
	granted(t, w1, false)
	lt.release("r2")
	granted(t, w1, true)
	granted(t, r3, false)
	lt.release("w1")
	granted(t, r3, true)
	// Disjoint requests hold at once; read-and-write of one asset is a write.
	granted(t, acquireAsync(lt, "w2", []string{"z"}, []string{"z"}), true)
	r4 := acquireAsync(lt, "r4", []string{"z"}, nil)
	granted(t, r4, false)
	lt.release("w2")
	granted(t, r4, true)
	if err := lt.acquire(context.Background(), "r4", nil, []string{"q"}, time.Minute); !errors.As(err, new(*errLocked)) {
		t.Fatalf("a nonce ordered twice: %v", err)
	}
	lt.release("r3")
	lt.release("r4")
	if lt.size() != 0 || len(lt.assets) != 0 {
		t.Fatalf("after every release: %d holders, %d assets", lt.size(), len(lt.assets))
	}
}

// TestLockCancel: a request whose context ends while it waits gives back
// what it took, and the requests behind it go on.
func TestLockCancel(t *testing.T) {
	lt := newLockTable(nil)
	granted(t, acquireAsync(lt, "a", nil, []string{"y"}), true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lt.acquire(ctx, "b", nil, []string{"x", "y"}, time.Minute) }() // takes x, waits for y
	time.Sleep(50 * time.Millisecond)
	c := acquireAsync(lt, "c", nil, []string{"x"})
	granted(t, c, false)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled acquire: %v", err)
	}
	granted(t, c, true)
	if lt.holds("b") {
		t.Fatal("a cancelled request holds locks")
	}
}

// TestLeases: a holder whose lease ran out is reported, not released;
// extend renews it.
func TestLeases(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	lt := newLockTable(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	if err := lt.acquire(context.Background(), "a", []string{"x"}, nil, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := lt.acquire(context.Background(), "b", nil, []string{"y"}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if got := lt.expired(); fmt.Sprint(got) != "[a]" {
		t.Fatalf("expired %v, want [a]", got)
	}
	if !lt.holds("a") {
		t.Fatal("an expired lease freed its locks")
	}
	if !lt.extend("a", 10*time.Second) || len(lt.expired()) != 0 {
		t.Fatal("extend did not renew the lease")
	}
	if lt.extend("nobody", time.Second) {
		t.Fatal("extended the lease of a request that holds nothing")
	}
}

// TestLockStress: random requests over few assets all complete (no
// deadlock), and no two conflicting requests ever hold at once.
func TestLockStress(t *testing.T) {
	lt := newLockTable(nil)
	assets := []string{"a", "b", "c", "d", "e"}
	var writers [5]atomic.Int32
	var readers [5]atomic.Int32
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 300 {
				var reads, writes []string
				var ri, wi []int
				for j, a := range assets {
					switch rng.IntN(4) {
					case 0:
						reads, ri = append(reads, a), append(ri, j)
					case 1:
						writes, wi = append(writes, a), append(wi, j)
					}
				}
				nonce := fmt.Sprintf("%d-%d", g, i)
				if err := lt.acquire(ctx, nonce, reads, writes, time.Minute); err != nil {
					t.Error(err)
					return
				}
				for _, j := range wi {
					if writers[j].Add(1) != 1 || readers[j].Load() != 0 {
						t.Errorf("%s writes %s beside another holder", nonce, assets[j])
					}
				}
				for _, j := range ri {
					readers[j].Add(1)
					if writers[j].Load() != 0 {
						t.Errorf("%s reads %s while it is written", nonce, assets[j])
					}
				}
				for _, j := range wi {
					writers[j].Add(-1)
				}
				for _, j := range ri {
					readers[j].Add(-1)
				}
				lt.release(nonce)
			}
		}()
	}
	wg.Wait()
	if lt.size() != 0 {
		t.Fatalf("%d requests left holding locks", lt.size())
	}
}
