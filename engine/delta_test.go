package engine_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

var versionsTable = &storage.Table{Namespace: "b", Name: "versions", PartitionKey: []storage.Column{{Name: "id", Type: storage.TypeText}},
	ClusteringKey: []storage.ClusteringColumn{{Name: "age", Type: storage.TypeBigInt, Order: storage.Asc}},
	Columns:       []storage.Column{{Name: "v", Type: storage.TypeText}}}

// chainDB is an engine on an in-memory filesystem with a model of what it
// must hold: blobTable's keys 0..39 and versionsTable's partitions p0..p4,
// ages 0..9.
type chainDB struct {
	t    *testing.T
	fs   vfs.FS
	cfg  engine.Config
	db   *engine.DB
	want map[string]string
}

func newChainDB(t *testing.T, share float64) *chainDB {
	c := &chainDB{t: t, fs: vfs.NewMem(), want: map[string]string{}}
	c.cfg = engine.Config{Dir: "/db", FS: c.fs, EpochInterval: time.Millisecond, CheckpointInterval: -1,
		LogSegmentSize: 16 << 10, CheckpointDeltaShare: share}
	c.open()
	ctx := context.Background()
	if err := c.db.CreateNamespace(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	for _, tb := range []*storage.Table{blobTable, versionsTable} {
		if err := c.db.CreateTable(ctx, tb); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *chainDB) open() {
	c.t.Helper()
	db, err := engine.Open(c.cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.db = db
}

// step puts or deletes a random row of either table.
func (c *chainDB) step(rng *rand.Rand, n int) {
	c.t.Helper()
	ctx := context.Background()
	pad := strings.Repeat("x", rng.IntN(400))
	var err error
	if rng.IntN(2) == 0 {
		k := rng.IntN(40)
		label := fmt.Sprint("blob ", k)
		if rng.IntN(3) == 0 {
			err = c.db.Delete(ctx, &storage.Delete{Namespace: "b", Table: "blobs", Partition: key(k)})
			delete(c.want, label)
		} else {
			v := fmt.Sprint(n, pad)
			err = c.db.Put(ctx, &storage.Put{Namespace: "b", Table: "blobs", Partition: key(k), Values: storage.Values{"v": storage.Blob([]byte(v))}})
			c.want[label] = v
		}
	} else {
		p, age := rng.IntN(5), rng.IntN(10)
		id, cl := storage.Values{"id": storage.Text(fmt.Sprint("p", p))}, storage.Values{"age": storage.BigInt(int64(age))}
		label := fmt.Sprintf("version p%d@%d", p, age)
		if rng.IntN(3) == 0 {
			err = c.db.Delete(ctx, &storage.Delete{Namespace: "b", Table: "versions", Partition: id, Clustering: cl})
			delete(c.want, label)
		} else {
			v := fmt.Sprint(n, pad)
			err = c.db.Put(ctx, &storage.Put{Namespace: "b", Table: "versions", Partition: id, Clustering: cl, Values: storage.Values{"v": storage.Text(v)}})
			c.want[label] = v
		}
	}
	if err != nil {
		c.t.Fatal(err)
	}
}

// check compares every row of both tables with the model.
func (c *chainDB) check(what string) {
	c.t.Helper()
	ctx := context.Background()
	got := map[string]string{}
	for k := range 40 {
		row, ok, err := c.db.Get(ctx, &storage.Get{Namespace: "b", Table: "blobs", Partition: key(k)})
		if err != nil {
			c.t.Fatal(err)
		}
		if ok {
			got[fmt.Sprint("blob ", k)] = string(row["v"].AsBlob())
		}
	}
	for p := range 5 {
		rows, err := c.db.Scan(ctx, &storage.Scan{Namespace: "b", Table: "versions", Partition: storage.Values{"id": storage.Text(fmt.Sprint("p", p))}})
		if err != nil {
			c.t.Fatal(err)
		}
		for rows.Next() {
			row := rows.Row()
			got[fmt.Sprintf("version p%d@%d", p, row["age"].AsBigInt())] = row["v"].AsText()
		}
		if err := rows.Close(); err != nil {
			c.t.Fatal(err)
		}
	}
	if !maps.Equal(got, c.want) {
		for k, v := range c.want {
			if g, ok := got[k]; !ok || g != v {
				c.t.Errorf("%s: %s is %.20q (present %v), want %.20q", what, k, g, ok, v)
			}
		}
		for k, g := range got {
			if _, ok := c.want[k]; !ok {
				c.t.Errorf("%s: %s is %.20q, want it absent", what, k, g)
			}
		}
		c.t.FailNow()
	}
}

// reopen closes the engine and opens it again, without its log if
// dropLog: from the checkpoints alone.
func (c *chainDB) reopen(dropLog bool) {
	c.t.Helper()
	if err := c.db.Close(); err != nil {
		c.t.Fatal(err)
	}
	if dropLog {
		names, _ := c.fs.List("/db/log")
		for _, n := range names {
			if err := c.fs.Remove("/db/log/" + n); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	c.open()
}

func (c *chainDB) files(prefix string) int {
	names, _ := c.fs.List("/db")
	n := 0
	for _, name := range names {
		if strings.HasPrefix(name, prefix) && !strings.HasSuffix(name, ".tmp") {
			n++
		}
	}
	return n
}

// TestDeltaCheckpointChain: random puts and deletes on a table with and
// one without clustering key, checkpoints after each burst, full or delta
// as CheckpointDeltaShare decides, and reopenings: from the checkpoints
// and the log, and from the checkpoints alone after a checkpoint that
// follows the last write. The engine must hold exactly the model each
// time, deleted rows staying deleted after a delta over a full checkpoint
// that held them.
func TestDeltaCheckpointChain(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(12) {
		share := []float64{1e9, 1, 0.3}[seed%3] // 1e9: deltas only, after the first
		t.Run(fmt.Sprintf("seed=%d,share=%g", seed, share), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			c := newChainDB(t, share)
			deltas, n := 0, 0
			for round := range 10 {
				for range 10 + rng.IntN(60) {
					c.step(rng, n)
					n++
				}
				st, err := c.db.Checkpoint(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.Base != 0 {
					deltas++
				}
				switch rng.IntN(3) {
				case 0:
					c.reopen(true)
					c.check(fmt.Sprintf("round %d, from the checkpoints alone", round))
				case 1:
					for range rng.IntN(30) {
						c.step(rng, n)
						n++
					}
					c.reopen(false)
					c.check(fmt.Sprintf("round %d, from the checkpoints and the log", round))
				}
			}
			if share == 1e9 && (deltas != 9 || c.files("delta-") != 9 || c.files("checkpoint-") != 1) {
				t.Errorf("%d deltas written, %d delta and %d full files; want 9, 9, 1", deltas, c.files("delta-"), c.files("checkpoint-"))
			}
			if share == 0.3 && deltas == 0 {
				t.Error("no delta written")
			}
			c.check("at the end")
			c.db.Close()
		})
	}
}

// TestDeltaCheckpointRows: a delta holds the rows written since the
// checkpoint before it began, deleted ones as tombstones, and nothing
// else; a full checkpoint comes once the deltas outweigh the share.
func TestDeltaCheckpointRows(t *testing.T) {
	ctx := context.Background()
	c := newChainDB(t, 0.5)
	for k := range 40 {
		if err := c.db.Put(ctx, &storage.Put{Namespace: "b", Table: "blobs", Partition: key(k),
			Values: storage.Values{"v": storage.Blob([]byte(strings.Repeat("v", 100)))}}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func(wantBase bool, wantRows int) {
		t.Helper()
		st, err := c.db.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if (st.Base != 0) != wantBase || st.Rows != wantRows {
			t.Fatalf("checkpoint of %d rows, base %d; want %d rows, a delta: %v", st.Rows, st.Base, wantRows, wantBase)
		}
	}
	checkpoint(false, 40)
	// Two puts and a delete: three rows, about a twentieth of the full one.
	for _, k := range []int{3, 7} {
		if err := c.db.Put(ctx, &storage.Put{Namespace: "b", Table: "blobs", Partition: key(k), Values: storage.Values{"v": storage.Blob([]byte("new"))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.db.Delete(ctx, &storage.Delete{Namespace: "b", Table: "blobs", Partition: key(9)}); err != nil {
		t.Fatal(err)
	}
	checkpoint(true, 3)
	checkpoint(true, 0) // nothing written since
	// Half the rows rewritten: the deltas pass half the full one's bytes.
	for k := 10; k < 40; k++ {
		if err := c.db.Put(ctx, &storage.Put{Namespace: "b", Table: "blobs", Partition: key(k), Values: storage.Values{"v": storage.Blob([]byte(strings.Repeat("w", 100)))}}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint(true, 30)
	checkpoint(false, 39)
	if d, f := c.files("delta-"), c.files("checkpoint-"); d != 0 || f != 1 {
		t.Errorf("after a full checkpoint: %d deltas and %d full ones on disk; want 0 and 1", d, f)
	}
	c.db.Close()
}

// TestDeltaCheckpointBroken: a delta whose predecessor is missing, or one
// without a full checkpoint, stops Open with a CorruptionError: the log it
// would need may be truncated already.
func TestDeltaCheckpointBroken(t *testing.T) {
	ctx := context.Background()
	c := newChainDB(t, 1e9)
	for round := range 3 {
		c.step(rand.New(rand.NewPCG(uint64(round), 1)), round)
		if _, err := c.db.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.db.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := c.fs.List("/db")
	var deltas, fulls []string
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, "delta-"):
			deltas = append(deltas, n)
		case strings.HasPrefix(n, "checkpoint-"):
			fulls = append(fulls, n)
		}
	}
	if len(deltas) != 2 || len(fulls) != 1 {
		t.Fatalf("files %v", names)
	}
	for _, gone := range []string{min(deltas[0], deltas[1]), fulls[0]} {
		if err := c.fs.Rename("/db/"+gone, "/db/aside"); err != nil {
			t.Fatal(err)
		}
		db, err := engine.Open(c.cfg)
		var ce *engine.CorruptionError
		if !errors.As(err, &ce) {
			if err == nil {
				db.Close()
			}
			t.Fatalf("without %s: Open returned %v, want a CorruptionError", gone, err)
		}
		if err := c.fs.Rename("/db/aside", "/db/"+gone); err != nil {
			t.Fatal(err)
		}
	}
	c.open()
	c.check("with every file back")
	c.db.Close()
}

// TestDeltaCheckpointConcurrent: writers insert rows while deltas are
// taken. A row written during one checkpoint's walk, of that
// checkpoint's start epoch, may be missed by the walk; the next delta
// must hold it, since the log before that delta's start is truncated.
// After the writers stop and a last delta is taken, the checkpoints
// alone (the log removed) must hold every acknowledged row.
func TestDeltaCheckpointConcurrent(t *testing.T) {
	ctx := context.Background()
	c := newChainDB(t, 1e9)
	var stop atomic.Bool
	var wg sync.WaitGroup
	acked := make([][]int, 2)
	for w := range acked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := 1_000_000*(w+1) + i
				if err := c.db.Put(ctx, &storage.Put{Namespace: "b", Table: "blobs", Partition: key(k), Values: storage.Values{"v": storage.Blob([]byte("v"))}}); err != nil {
					t.Error(err)
					return
				}
				acked[w] = append(acked[w], k)
			}
		}()
	}
	deltas := 0
	for range 20 {
		st, err := c.db.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Base != 0 {
			deltas++
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}
	stop.Store(true)
	wg.Wait()
	if _, err := c.db.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	c.reopen(true)
	defer c.db.Close()
	n := 0
	for _, ks := range acked {
		for _, k := range ks {
			if _, ok, err := c.db.Get(ctx, &storage.Get{Namespace: "b", Table: "blobs", Partition: key(k)}); err != nil {
				t.Fatal(err)
			} else if !ok {
				t.Errorf("row %d, acknowledged, is missing", k)
			}
			n++
		}
	}
	if deltas < 19 || n < 100 {
		t.Errorf("%d deltas, %d rows written: the test proves little", deltas, n)
	}
}
