package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// teeSink is a leader's sink that hands every record, once durable, to a
// follower's Apply, in log order, before the leader learns it is durable:
// the follower is built purely from the records as they are produced.
type teeSink struct {
	LogSink
	follower *DB
	mu       sync.Mutex
	err      error
}

func (t *teeSink) Propose(recs [][]byte, done func(uint64, error)) error {
	copies := make([][]byte, len(recs))
	for i, r := range recs {
		copies[i] = slices.Clone(r)
	}
	return t.LogSink.Propose(recs, func(last uint64, err error) {
		if err == nil {
			first := last - uint64(len(copies)) + 1
			for i, r := range copies {
				if aerr := t.follower.Apply(first+uint64(i), r); aerr != nil {
					t.mu.Lock()
					t.err = errors.Join(t.err, aerr)
					t.mu.Unlock()
				}
			}
		}
		done(last, err)
	})
}

func (t *teeSink) failure() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// dump is an engine's state: every table's schema under its id, and every
// present record under table id, keys, with its TID and row.
func dump(db *DB) (schemas map[uint64]string, rows map[string]string) {
	schemas, rows = map[uint64]string{}, map[string]string{}
	for _, t := range db.cat.tables() {
		schemas[t.id] = fmt.Sprintf("%s.%s %v %v %v", t.schema.Namespace, t.schema.Name, t.schema.PartitionKey, t.schema.ClusteringKey, t.schema.Columns)
		add := func(p *partition, r *record) {
			tid, rw := r.readStable()
			if tid&tidAbsent != 0 || tidEpoch(tid) == 0 {
				return
			}
			enc := ""
			if rw != nil {
				enc = rw.enc()
			}
			rows[fmt.Sprintf("%d/%q/%q", t.id, p.pk, r.ck)] = fmt.Sprintf("%#x %q", tidVersion(tid), enc)
		}
		t.rangeParts(func(p *partition) bool {
			if p.cl == nil {
				add(p, &p.one)
				return true
			}
			p.cl.mu.RLock()
			var recs []*record
			p.cl.tree.Ascend(func(it ckItem) bool { recs = append(recs, it.r); return true })
			p.cl.mu.RUnlock()
			for _, r := range recs {
				add(p, r)
			}
			return true
		})
	}
	return schemas, rows
}

// sameState fails the test unless a and b hold the same schemas and rows.
func sameState(t *testing.T, what string, a, b *DB) {
	t.Helper()
	sa, ra := dump(a)
	sb, rb := dump(b)
	if !maps.Equal(sa, sb) {
		t.Fatalf("%s: schemas differ:\n%v\n%v", what, sa, sb)
	}
	if !maps.Equal(ra, rb) {
		keys := slices.Collect(maps.Keys(ra))
		for k := range rb {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		n := 0
		for _, k := range keys {
			if ra[k] != rb[k] && n < 5 {
				t.Errorf("%s: %s is %q and %q", what, k, ra[k], rb[k])
				n++
			}
		}
		t.Fatalf("%s: %d and %d rows differ", what, len(ra), len(rb))
	}
}

var (
	followFlat = &storage.Table{Namespace: "f", Name: "flat", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeText}}}
	followClustered = &storage.Table{Namespace: "f", Name: "clustered", PartitionKey: []storage.Column{{Name: "p", Type: storage.TypeText}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "c", Type: storage.TypeBigInt, Order: storage.Desc}},
		Columns:       []storage.Column{{Name: "v", Type: storage.TypeBlob}}}
)

// TestFollowerMatchesLeader: a follower built only by applying a leader's
// log records as they become durable holds, at every point where the
// leader's commits are all durable, the same schemas, rows and durable
// epoch as the leader; and the leader, closed and recovered from its files
// (recovery applies the same records with the same state machine), holds
// the same state again. Writers run concurrently over two loggers, with
// catalog changes, deletes, multi-row transactions, checkpoints and the
// log's truncation between rounds.
func TestFollowerMatchesLeader(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { followSeed(t, seed) })
	}
}

func followSeed(t *testing.T, seed uint64) {
	ctx := context.Background()
	fs := vfs.NewMem()
	follower, err := Open(Config{Dir: "/follower", FS: fs, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	tee := &teeSink{follower: follower}
	cfg := Config{Dir: "/leader", FS: fs, Loggers: 2, Workers: 8, EpochInterval: time.Millisecond, CheckpointInterval: -1,
		LogBufferSize: 4 << 10, LogSegmentSize: 64 << 10,
		OpenSink: func(fs vfs.FS, dir string) (LogSink, error) {
			s, err := openWALSink(fs, dir, 64<<10, 4)
			tee.LogSink = s
			return tee, err
		}}
	leader, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{leader.CreateNamespace(ctx, "f"), leader.CreateTable(ctx, followFlat), leader.CreateTable(ctx, followClustered)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := follower.CreateNamespace(ctx, "x"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a catalog change on the follower: %v, want ErrNotLeader", err)
	}
	for round := range 6 {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		switch round {
		case 2: // a table comes and goes
			extra := followFlat.Clone()
			extra.Name = "extra"
			if err := leader.CreateTable(ctx, extra); err != nil {
				t.Fatal(err)
			}
			if err := leader.Put(ctx, &storage.Put{Namespace: "f", Table: "extra", Partition: storage.Values{"k": storage.BigInt(1)},
				Values: storage.Values{"v": storage.Text("x")}}); err != nil {
				t.Fatal(err)
			}
		case 4:
			if err := leader.DropTable(ctx, "f", "extra"); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, uint64(round*16+w)))
				for i := range 80 {
					if err := followWrite(ctx, leader, r, round*1000+w*100+i); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if rng.IntN(2) == 0 {
			if _, err := leader.Checkpoint(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := tee.failure(); err != nil {
			t.Fatalf("round %d: the follower refused a record: %v", round, err)
		}
		// Every commit was acknowledged, so durable; the follower applied
		// each record before the leader learned it was durable.
		if f, l := follower.DurableEpoch(), leader.DurableEpoch(); f < l {
			t.Fatalf("round %d: the follower's durable epoch %d is behind the leader's %d", round, f, l)
		}
		sameState(t, fmt.Sprint("round ", round), leader, follower)
		if err := follower.Put(ctx, &storage.Put{Namespace: "f", Table: "flat", Partition: storage.Values{"k": storage.BigInt(1)},
			Values: storage.Values{"v": storage.Text("x")}}); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a write on the follower: %v, want ErrNotLeader", err)
		}
	}
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.OpenSink = nil
	recovered, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer recovered.Close()
	sameState(t, "recovered", recovered, follower)
}

// followWrite commits one random transaction on the leader: puts and
// deletes over the two tables, one to three rows.
func followWrite(ctx context.Context, db *DB, r *rand.Rand, n int) error {
	return storage.Update(ctx, db, func(tx storage.Txn) error {
		for range 1 + r.IntN(3) {
			var err error
			if r.IntN(2) == 0 {
				k := storage.Values{"k": storage.BigInt(int64(r.IntN(100)))}
				if r.IntN(4) == 0 {
					err = tx.Delete(ctx, &storage.Delete{Namespace: "f", Table: "flat", Partition: k})
				} else {
					err = tx.Put(ctx, &storage.Put{Namespace: "f", Table: "flat", Partition: k,
						Values: storage.Values{"v": storage.Text(fmt.Sprint(n, strings.Repeat("v", r.IntN(300))))}})
				}
			} else {
				p := storage.Values{"p": storage.Text(fmt.Sprint("p", r.IntN(8)))}
				c := storage.Values{"c": storage.BigInt(int64(r.IntN(20)))}
				if r.IntN(4) == 0 {
					err = tx.Delete(ctx, &storage.Delete{Namespace: "f", Table: "clustered", Partition: p, Clustering: c})
				} else {
					err = tx.Put(ctx, &storage.Put{Namespace: "f", Table: "clustered", Partition: p, Clustering: c,
						Values: storage.Values{"v": storage.Blob([]byte(fmt.Sprint(n)))}})
				}
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}
