package replication

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

var siloTable = &storage.Table{Namespace: "s", Name: "kv", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
	Columns: []storage.Column{{Name: "v", Type: storage.TypeText}}}

// TestSiloFailover: three members; writers commit on the leader; the
// leader is stopped; a new one takes over within the election timeout
// and every commit acknowledged before is there, on every member, once
// the stopped one is back and has caught up.
func TestSiloFailover(t *testing.T) {
	ctx := context.Background()
	c, err := StartLocalSilos(3, t.TempDir(), Config{TickInterval: 20 * time.Millisecond, PreVote: true, CheckQuorum: true, SegmentSize: 8 << 20},
		engine.Config{EpochInterval: 5 * time.Millisecond, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	oldID, first, err := c.Leader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	db := first.DB()
	if err := db.CreateNamespace(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, siloTable); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		acked  = map[string]string{}
		cur    atomic.Pointer[Silo]
		stopW  = make(chan struct{})
		wg     sync.WaitGroup
		errors atomic.Int64
	)
	cur.Store(first)
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopW:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%d", w, i), fmt.Sprint(i)
				err := cur.Load().DB().Put(ctx, &storage.Put{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)},
					Values: storage.Values{"v": storage.Text(v)}})
				if err != nil {
					errors.Add(1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				mu.Lock()
				acked[k] = v
				mu.Unlock()
			}
		})
	}
	time.Sleep(700 * time.Millisecond)
	killed := time.Now()
	if err := c.Stop(oldID); err != nil {
		t.Logf("stopping the leader: %v", err)
	}
	_, next, err := c.Leader(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	failover := time.Since(killed)
	cur.Store(next)
	time.Sleep(700 * time.Millisecond)
	close(stopW)
	wg.Wait()
	mu.Lock()
	n := len(acked)
	mu.Unlock()
	t.Logf("failover in %v; %d commits acknowledged, %d attempts failed", failover, n, errors.Load())
	if n < 100 {
		t.Fatalf("only %d commits acknowledged", n)
	}
	if failover > 2*time.Second {
		t.Errorf("failover took %v", failover)
	}
	if err := c.Start(oldID); err != nil {
		t.Fatal(err)
	}
	// Every acknowledged commit is on every member, the restarted one
	// included, once it has applied the log.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		missing := ""
		for _, id := range c.Peers() {
			m := c.Member(id)
			for k, v := range acked {
				row, ok, err := m.DB().Get(ctx, &storage.Get{Namespace: "s", Table: "kv", Partition: storage.Values{"k": storage.Text(k)}})
				if err != nil || !ok || row["v"].AsText() != v {
					missing = fmt.Sprintf("member %d: %s: %v %v %v", id, k, ok, err, row)
					break
				}
			}
			if missing != "" {
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an acknowledged commit is missing: %s", missing)
		}
	}
}
