package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wal"
)

var kvTable = &storage.Table{Namespace: "u", Name: "kv",
	PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
	Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}

func openKV(t *testing.T, cfg engine.Config) *engine.DB { return openTable(t, cfg, kvTable) }

// openTable opens the engine of cfg and creates tbl (and its namespace) if
// the engine does not hold it yet.
func openTable(t *testing.T, cfg engine.Config, tbl *storage.Table) *engine.DB {
	t.Helper()
	db, err := engine.Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	ctx := context.Background()
	if _, err := db.DescribeTable(ctx, tbl.Namespace, tbl.Name); err == nil {
		return db
	}
	for _, err := range []error{db.CreateNamespace(ctx, tbl.Namespace), db.CreateTable(ctx, tbl)} {
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return db
}

func putKV(ctx context.Context, s storage.Ops, k, v int64) error {
	return s.Put(ctx, &storage.Put{Namespace: "u", Table: "kv", Partition: key(int(k)), Values: storage.Values{"v": storage.BigInt(v)}})
}

func getKV(ctx context.Context, s storage.Ops, k int64) (int64, error) {
	row, ok, err := s.Get(ctx, &storage.Get{Namespace: "u", Table: "kv", Partition: key(int(k))})
	if err != nil || !ok {
		return 0, err
	}
	return row["v"].AsBigInt(), nil
}

// gate holds every fsync while it is shut.
type gate struct {
	mu sync.Mutex
	ch chan struct{} // nil: open
}

func (g *gate) shut() { g.mu.Lock(); g.ch = make(chan struct{}); g.mu.Unlock() }
func (g *gate) open() { g.mu.Lock(); close(g.ch); g.ch = nil; g.mu.Unlock() }
func (g *gate) wait(bool) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// TestUnsyncedReturnsBeforeDurable holds every fsync and shows that a write
// through the unsynced view returns and is visible to the view's reads,
// while a durable write and a durable read of it wait for the fsync.
func TestUnsyncedReturnsBeforeDurable(t *testing.T) {
	g := &gate{}
	db := openKV(t, engine.Config{Dir: "/db", FS: vfsutil.SyncHookFS(vfs.NewMem(), g.wait), CheckpointInterval: -1, EpochInterval: time.Millisecond, LogSegmentSize: 1 << 16})
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u := storage.Unsynced(db)
	if u == storage.Ops(db) {
		t.Fatal("the engine offers no unsynced view")
	}

	g.shut()
	if err := putKV(ctx, u, 1, 7); err != nil {
		t.Fatalf("unsynced put with fsyncs held: %v", err)
	}
	if v, err := getKV(ctx, u, 1); err != nil || v != 7 {
		t.Fatalf("unsynced get = %d, %v; want 7", v, err)
	}
	durable := make(chan error, 2)
	go func() { durable <- putKV(ctx, db, 2, 8) }()
	go func() { _, err := getKV(ctx, db, 1); durable <- err }()
	select {
	case err := <-durable:
		t.Fatalf("a durable call returned while fsyncs were held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	g.open()
	for range 2 {
		if err := <-durable; err != nil {
			t.Fatalf("durable call after the fsync: %v", err)
		}
	}
}

// TestUnsyncedPrefix checks the promise storage.Unsyncer makes, across
// crashes that keep only synced bytes: whatever a call through the view
// wrote or read is present after recovery if a durable commit that began
// after that call was acknowledged, or if a later call through the view
// wrote something still present.
//
// Writer w raises its own register A_w through the view, copies the value
// to D_w through the view, then records it durably in B_w; a reader reads
// A_w through the view (a get or a scan) and records what it saw durably in
// C_r. After a crash, A_w must be at least every acknowledged B_w, every
// acknowledged C_r that read it, and the D_w that survived.
// The crashes must also lose some unsynced raise, or the check proved
// nothing.
func TestUnsyncedPrefix(t *testing.T) {
	seeds := testenv.Count(t, "KIROKU_ENGINE_CRASH_SEEDS", 24, 4)
	lost := 0
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			if unsyncedPrefixSeed(t, seed) {
				lost++
			}
		})
	}
	t.Logf("%d of %d crashes lost an unsynced write", lost, seeds)
	if lost == 0 && !t.Failed() {
		t.Errorf("no crash in %d seeds lost an unsynced write: the prefix check was vacuous", seeds)
	}
}

// unsyncedPrefixSeed runs one crash and reports whether it lost a raise
// made through the view.
func unsyncedPrefixSeed(t *testing.T, seed uint64) bool {
	const writers, readers = 3, 2
	const aBase, bBase, cBase, dBase = 0, 100, 200, 300
	rng := rand.New(rand.NewPCG(seed, 9))
	mem := vfs.NewCrashableMem()
	cfg := engine.Config{Dir: "/db", Loggers: 1 + rng.IntN(2), CheckpointInterval: -1, LogSegmentSize: int64(16384 << rng.IntN(4)),
		EpochInterval: time.Duration(200+rng.IntN(3000)) * time.Microsecond,
		FS:            wal.DelaySyncFS(mem, time.Duration(rng.IntN(800))*time.Microsecond)}
	db := openKV(t, cfg)
	ctx := context.Background()
	u := db.Unsynced()

	var mu sync.Mutex
	var crashed bool
	ackB := map[int64]int64{}    // writer → highest acknowledged B
	ackC := map[int64][2]int64{} // reader → (writer read, value) acknowledged
	var raised [writers]atomic.Int64
	ack := func(f func()) {
		mu.Lock()
		if !crashed {
			f()
		}
		mu.Unlock()
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range int64(writers) {
		wg.Go(func() {
			for v := int64(1); !stop.Load(); v++ {
				if putKV(ctx, u, aBase+w, v) != nil {
					return // the database closed under us
				}
				raised[w].Store(v)
				if putKV(ctx, u, dBase+w, v) != nil || putKV(ctx, db, bBase+w, v) != nil {
					return
				}
				ack(func() { ackB[w] = v })
			}
		})
	}
	for r := range int64(readers) {
		wg.Go(func() {
			for i := int64(0); !stop.Load(); i++ {
				w := i % writers
				v, err := readKV(ctx, u, aBase+w, i%2 == 0)
				if err != nil || putKV(ctx, db, cBase+r, v) != nil {
					return
				}
				ack(func() { ackC[r] = [2]int64{w, v} })
			}
		})
	}
	time.Sleep(time.Duration(5+rng.IntN(60)) * time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(ackB)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
	}
	mu.Lock()
	clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: []int{0, 50}[rng.IntN(2)], RNG: rand.New(rand.NewPCG(seed, 1))})
	crashed = true
	var before [writers]int64
	for w := range before {
		before[w] = raised[w].Load() // every one of these returned before the clone
	}
	mu.Unlock()
	stop.Store(true)
	wg.Wait()
	db.Close()

	cfg.FS = clone
	db = openKV(t, cfg)
	defer db.Close()
	if len(ackB) == 0 {
		t.Fatalf("no write was acknowledged in 10 s before the crash")
	}
	lost := false
	for w, b := range ackB {
		a, err := getKV(ctx, db, aBase+w)
		if err != nil || a < b {
			t.Errorf("writer %d: A = %d (%v) after recovery, but B = %d was acknowledged after it", w, a, err, b)
		}
		lost = lost || a < before[w]
	}
	for w := range int64(writers) {
		a, aerr := getKV(ctx, db, aBase+w)
		d, derr := getKV(ctx, db, dBase+w)
		if aerr != nil || derr != nil || a < d {
			t.Errorf("writer %d: A = %d (%v) after recovery, but D = %d (%v), written through the view after it, survived", w, a, aerr, d, derr)
		}
	}
	for r, c := range ackC {
		if a, err := getKV(ctx, db, aBase+c[0]); err != nil || a < c[1] {
			t.Errorf("reader %d: A_%d = %d (%v) after recovery, but it saw %d and acknowledged that", r, c[0], a, err, c[1])
		}
	}
	return lost
}

// readKV reads register k through s with a get, or with a scan of its
// partition.
func readKV(ctx context.Context, s storage.Ops, k int64, scan bool) (int64, error) {
	if !scan {
		return getKV(ctx, s, k)
	}
	rows, err := s.Scan(ctx, &storage.Scan{Namespace: "u", Table: "kv", Partition: key(int(k))})
	if err != nil {
		return 0, err
	}
	all, err := storage.CollectRows(rows)
	if err != nil || len(all) == 0 {
		return 0, err
	}
	return all[0]["v"].AsBigInt(), nil
}
