package engine_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wal"
)

// TestCrashRecovery runs concurrent transactions against the engine on a
// filesystem that keeps only synced bytes (and a random share of unsynced
// ones) at a crash, crashes at a random moment, often mid-checkpoint,
// recovers, checks, and goes on for several crash cycles per seed.
//
// Each transaction i inserts K_i rows of its own (partition i), and reads
// and overwrites 1-3 of 16 shared registers with i. After each recovery:
//   - every acknowledged transaction is present (all of its rows);
//   - no transaction is partly present (it has 0 or K_i rows);
//   - nothing that failed is present;
//   - what is present is closed under read-from: a transaction present
//     read only from transactions present (durability is a prefix of the
//     serialization order, so nothing of an epoch beyond the durable one
//     appears without what it depends on);
//   - each register holds the last present writer of its chain.
func TestCrashRecovery(t *testing.T) {
	seeds := testenv.Count(t, "KIROKU_ENGINE_CRASH_SEEDS", 24, 4)
	for seed := range seeds {
		crashSeed(t, uint64(seed))
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
	}
}

const registers = 16

type txnRec struct {
	k     int      // rows inserted
	reads [][2]int // (register, value read)
	state int      // 1 acked, 2 unknown, 3 failed
}

type history struct {
	mu      sync.Mutex
	txns    map[int]*txnRec
	crashed bool // the crash clone is taken: later acknowledgements are not required
	next    atomic.Int64
}

// acked counts the transactions acknowledged so far.
func (h *history) acked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.txns {
		if r.state == 1 {
			n++
		}
	}
	return n
}

var (
	regTable = &storage.Table{Namespace: "crash", Name: "reg",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}, {Name: "pad", Type: storage.TypeBlob}}}
	rowTable = &storage.Table{Namespace: "crash", Name: "rows",
		PartitionKey:  []storage.Column{{Name: "txn", Type: storage.TypeBigInt}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "j", Type: storage.TypeBigInt, Order: storage.Desc}},
		Columns:       []storage.Column{{Name: "n", Type: storage.TypeBigInt}, {Name: "note", Type: storage.TypeText}}}
)

func crashSeed(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 42))
	mem := vfs.NewCrashableMem()
	cfg := engine.Config{
		Dir:                "/db",
		Loggers:            1 + rng.IntN(2),
		Workers:            4,
		EpochInterval:      time.Duration(200+rng.IntN(3000)) * time.Microsecond,
		LogBufferSize:      4096 << rng.IntN(3),
		CheckpointInterval: -1,
		LogSegmentSize:     int64(16384 << rng.IntN(5)),
		// Full checkpoints only, deltas after the first only, or both.
		CheckpointDeltaShare: []float64{-1, 1e9, 1}[rng.IntN(3)],
	}
	// A slow fsync holds written, unsynced bytes for a while, so crashes
	// land among them.
	cfg.FS = wal.DelaySyncFS(mem, time.Duration(rng.IntN(800))*time.Microsecond)
	// A follower applies the records as the leader makes them durable.
	m := newMirror(t)
	cfg.OpenSink = m.openSink(cfg.LogSegmentSize)
	db, err := engine.Open(cfg)
	if err != nil {
		t.Fatalf("seed %d: open: %v", seed, err)
	}
	ctx := context.Background()
	for _, err := range []error{db.CreateNamespace(ctx, "crash"), db.CreateTable(ctx, regTable), db.CreateTable(ctx, rowTable)} {
		if err != nil {
			t.Fatalf("seed %d: setup: %v", seed, err)
		}
	}
	h := &history{txns: map[int]*txnRec{}}
	h.next.Store(1)
	prevAcked := 0
	for cycle := range 3 {
		mem2, ckpts := runUntilCrash(t, db, mem, m, h, rng, prevAcked)
		// The check below proves something only if commits were
		// acknowledged before this crash.
		if acked := h.acked(); acked <= prevAcked {
			t.Fatalf("seed %d cycle %d: no commit acknowledged before the crash", seed, cycle)
		}
		db.Close()
		mem = mem2
		// The follower stopped where the crash came; what else the crash
		// left durable in the log it applies from there.
		m.catchUp(mem, cfg.LogSegmentSize)
		cfg.FS = wal.DelaySyncFS(mem, time.Duration(rng.IntN(800))*time.Microsecond)
		db, err = engine.Open(cfg)
		if err != nil {
			t.Fatalf("seed %d cycle %d: reopen after crash: %v", seed, cycle, err)
		}
		if err := verify(db, h); err != nil {
			t.Fatalf("seed %d cycle %d (%d checkpoints, %d loggers): %v", seed, cycle, ckpts, cfg.Loggers, err)
		}
		// Recovery and the follower applied the same records with the same
		// state machine.
		if err := m.same(db); err != nil {
			t.Fatalf("seed %d cycle %d: the recovered leader and its follower differ: %v", seed, cycle, err)
		}
		// After verify, which counts the survivors whose outcome was
		// unknown as acknowledged: the next cycle must add its own.
		prevAcked = h.acked()
	}
	db.Close()
}

// runUntilCrash runs the workload and a checkpointer, then crashes: it
// returns a clone of the filesystem holding what a power cut would leave.
// The acknowledged set is copied before the clone, so everything in it
// was durable before the crash.
func runUntilCrash(t *testing.T, db *engine.DB, mem *vfs.MemFS, m *mirror, h *history, rng *rand.Rand, prevAcked int) (*vfs.MemFS, int) {
	ctx := context.Background()
	var stop atomic.Bool
	var wg sync.WaitGroup
	clients := 2 + rng.IntN(5)
	for c := range clients {
		r := rand.New(rand.NewPCG(rng.Uint64(), uint64(c)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				runTxn(ctx, db, h, r)
			}
		}()
	}
	var ckpts atomic.Int64
	cr := rand.New(rand.NewPCG(rng.Uint64(), 3))
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if _, err := db.Checkpoint(ctx); err == nil {
				ckpts.Add(1)
			}
			time.Sleep(time.Duration(cr.IntN(3000)) * time.Microsecond)
		}
	}()
	// The crash comes at a random time after the cycle's first
	// acknowledgement: a fixed delay from the start crashed before any, on
	// a loaded machine under the race detector. Nothing acknowledged in
	// ten seconds fails the caller's check.
	for deadline := time.Now().Add(10 * time.Second); h.acked() <= prevAcked && time.Now().Before(deadline); {
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
	unsynced := []int{0, 100, 25 + rng.IntN(51)}[rng.IntN(3)]
	cloneRNG := rand.New(rand.NewPCG(rng.Uint64(), 7))
	h.mu.Lock()
	m.mu.Lock() // the follower gets nothing from after the crash
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: cloneRNG})
	m.frozen = true
	m.mu.Unlock()
	h.crashed = true
	h.mu.Unlock()
	stop.Store(true)
	wg.Wait()
	return crashed, int(ckpts.Load())
}

func key(k int) storage.Values { return storage.Values{"k": storage.BigInt(int64(k))} }

func runTxn(ctx context.Context, db *engine.DB, h *history, r *rand.Rand) {
	id := int(h.next.Add(1) - 1)
	k := 1 + r.IntN(4)
	nregs := 1 + r.IntN(3)
	var reads [][2]int
	err := storage.Update(ctx, db, func(tx storage.Txn) error {
		reads = reads[:0]
		seen := map[int]bool{}
		for range nregs {
			reg := r.IntN(registers)
			if seen[reg] {
				continue
			}
			seen[reg] = true
			row, ok, err := tx.Get(ctx, &storage.Get{Namespace: "crash", Table: "reg", Partition: key(reg)})
			if err != nil {
				return err
			}
			v := 0
			if ok {
				v = int(row["v"].AsBigInt())
			}
			reads = append(reads, [2]int{reg, v})
			if err := tx.Put(ctx, &storage.Put{Namespace: "crash", Table: "reg", Partition: key(reg),
				Values: storage.Values{"v": storage.BigInt(int64(id))}}); err != nil {
				return err
			}
		}
		for j := range k {
			if err := tx.Put(ctx, &storage.Put{Namespace: "crash", Table: "rows",
				Partition: storage.Values{"txn": storage.BigInt(int64(id))}, Clustering: storage.Values{"j": storage.BigInt(int64(j))},
				Values: storage.Values{"n": storage.BigInt(int64(k)), "note": storage.Text(fmt.Sprintf("txn %d row %d %x", id, j, r.Uint64()))}}); err != nil {
				return err
			}
		}
		return nil
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	tr := &txnRec{k: k, reads: append([][2]int(nil), reads...)}
	switch {
	case err == nil && !h.crashed:
		tr.state = 1
	case err == nil, errors.Is(err, storage.ErrCommitUnknown), errors.Is(err, engine.ErrFailed):
		tr.state = 2 // acknowledged after the crash clone, or not known
	default:
		tr.state = 3
	}
	h.txns[id] = tr
}

func verify(db *engine.DB, h *history) error {
	ctx := context.Background()
	present := map[int]bool{}
	for id, tr := range h.txns {
		rows, err := db.Scan(ctx, &storage.Scan{Namespace: "crash", Table: "rows", Partition: storage.Values{"txn": storage.BigInt(int64(id))}})
		if err != nil {
			return err
		}
		got, err := storage.CollectRows(rows)
		if err != nil {
			return err
		}
		switch {
		case len(got) == 0:
			if tr.state == 1 {
				return fmt.Errorf("acknowledged transaction %d lost", id)
			}
		case len(got) != tr.k:
			return fmt.Errorf("transaction %d partly present: %d of %d rows", id, len(got), tr.k)
		case tr.state == 3:
			return fmt.Errorf("failed transaction %d present", id)
		default:
			for _, row := range got {
				if row["n"].AsBigInt() != int64(tr.k) {
					return fmt.Errorf("transaction %d: row %v", id, row)
				}
			}
			present[id] = true
		}
	}
	succ := map[[2]int]int{} // (register, value read) → writer
	for id := range present {
		for _, rd := range h.txns[id].reads {
			if rd[1] != 0 && !present[rd[1]] {
				return fmt.Errorf("transaction %d present but %d, which it read from register %d, is not", id, rd[1], rd[0])
			}
			if other, dup := succ[rd]; dup {
				return fmt.Errorf("transactions %d and %d both overwrote %d in register %d", id, other, rd[1], rd[0])
			}
			succ[rd] = id
		}
	}
	for reg := range registers {
		row, ok, err := db.Get(ctx, &storage.Get{Namespace: "crash", Table: "reg", Partition: key(reg)})
		if err != nil {
			return err
		}
		v := 0
		if ok {
			v = int(row["v"].AsBigInt())
		}
		if v != 0 && !present[v] {
			return fmt.Errorf("register %d holds %d, which is not present", reg, v)
		}
		if next, ok := succ[[2]int{reg, v}]; ok {
			return fmt.Errorf("register %d holds %d, but %d, present, overwrote it", reg, v, next)
		}
	}
	// Forget what is gone for good, so later cycles check only the rest.
	for id, tr := range h.txns {
		if !present[id] {
			delete(h.txns, id)
		} else {
			tr.state = 1
		}
	}
	h.crashed = false
	return nil
}

// mirror is a follower of the leader under test, fed by a sink wrapped
// around the leader's: every record, once durable, in log order, until the
// crash freezes it.
type mirror struct {
	t        *testing.T
	follower *engine.DB
	mu       sync.Mutex
	frozen   bool
	last     uint64 // index of the last record applied
	err      error
}

func newMirror(t *testing.T) *mirror {
	f, err := engine.Open(engine.Config{Dir: "/follower", FS: vfs.NewMem(), Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &mirror{t: t, follower: f}
}

func (m *mirror) openSink(seg int64) func(vfs.FS, string) (engine.LogSink, error) {
	return func(fs vfs.FS, dir string) (engine.LogSink, error) {
		s, err := engine.OpenWALSink(fs, dir, seg)
		m.mu.Lock()
		m.frozen = false
		m.mu.Unlock()
		return &mirrorSink{LogSink: s, m: m}, err
	}
}

// apply hands the follower records first.. in order, unless frozen.
func (m *mirror) apply(first uint64, recs [][]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.frozen || m.err != nil {
		return
	}
	for i, r := range recs {
		if err := m.follower.Apply(first+uint64(i), r); err != nil {
			m.err = err
			return
		}
		m.last = first + uint64(i)
	}
}

// catchUp applies the records of the crashed log after the last one the
// follower had.
func (m *mirror) catchUp(fs vfs.FS, seg int64) {
	l, err := wal.Open(wal.Config{Dir: "/db/log", FS: fs, Policy: wal.BatchPolicy(), SegmentSize: seg})
	if err != nil {
		m.t.Fatal(err)
	}
	defer l.Close()
	if from := max(m.last+1, l.FirstIndex()); from <= l.LastIndex() {
		var recs [][]byte
		if err := l.Scan(from, func(_ uint64, p []byte) error { recs = append(recs, slices.Clone(p)); return nil }); err != nil {
			m.t.Fatal(err)
		}
		m.mu.Lock()
		m.frozen = false
		m.mu.Unlock()
		m.apply(from, recs)
	}
}

// same reports how db and the follower differ, if they do.
func (m *mirror) same(db *engine.DB) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return fmt.Errorf("the follower refused a record: %w", m.err)
	}
	sa, ra := engine.Dump(db)
	sb, rb := engine.Dump(m.follower)
	if !maps.Equal(sa, sb) {
		return fmt.Errorf("schemas %v and %v", sa, sb)
	}
	if !maps.Equal(ra, rb) {
		for k, v := range ra {
			if rb[k] != v {
				return fmt.Errorf("%d and %d rows; %s is %q and %q", len(ra), len(rb), k, v, rb[k])
			}
		}
		return fmt.Errorf("%d and %d rows", len(ra), len(rb))
	}
	return nil
}

type mirrorSink struct {
	engine.LogSink
	m *mirror
}

func (s *mirrorSink) Propose(recs [][]byte, done func(uint64, error)) error {
	copies := make([][]byte, len(recs))
	for i, r := range recs {
		copies[i] = slices.Clone(r)
	}
	return s.LogSink.Propose(recs, func(last uint64, err error) {
		if err == nil {
			s.m.apply(last-uint64(len(copies))+1, copies)
		}
		done(last, err)
	})
}
