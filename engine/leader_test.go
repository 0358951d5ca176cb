package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// recordSink keeps every record its log made durable, in log order.
type recordSink struct {
	LogSink
	mu   sync.Mutex
	recs [][]byte
	next uint64 // the index the next record must have
}

func (s *recordSink) Propose(recs [][]byte, done func(uint64, error)) error {
	copies := make([][]byte, len(recs))
	for i, r := range recs {
		copies[i] = slices.Clone(r)
	}
	return s.LogSink.Propose(recs, func(last uint64, err error) {
		if err == nil {
			s.mu.Lock()
			if first := last - uint64(len(copies)) + 1; first == s.next {
				s.recs = append(s.recs, copies...)
				s.next = last + 1
			} else {
				s.next = 0 // out of order: fails the test below
			}
			s.mu.Unlock()
		}
		done(last, err)
	})
}

// rowEpochs is, for every row of db's flat table, the epoch of its TID.
func rowEpochs(t *testing.T, db *DB) map[string]uint64 {
	t.Helper()
	_, rows := dump(db)
	out := map[string]uint64{}
	for k, v := range rows {
		hex, _, _ := strings.Cut(v, " ")
		ver, err := strconv.ParseUint(strings.TrimPrefix(hex, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("row %s: %q", k, v)
		}
		out[k] = tidEpoch(ver)
	}
	return out
}

// TestPromoteAtEveryCut: a leader's log, cut after any of its records,
// is what a follower has applied when its leader dies; promoted over a
// log holding just those records, the follower makes the undecided epochs
// void and serves: every row of an epoch the cut made durable is there,
// no row of a later epoch is, it takes writes, and reopened from its log
// it holds the same state.
func TestPromoteAtEveryCut(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	rec := &recordSink{next: 1}
	cfg := Config{Dir: "/leader", FS: fs, Loggers: 2, Workers: 8, EpochInterval: time.Millisecond, CheckpointInterval: -1,
		LogBufferSize: 4 << 10, OpenSink: func(fs vfs.FS, dir string) (LogSink, error) {
			s, err := openWALSink(fs, dir, 1<<20, 4)
			rec.LogSink = s
			return rec, err
		}}
	leader, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{leader.CreateNamespace(ctx, "f"), leader.CreateTable(ctx, followFlat)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Every key is written once, so a row's epoch says which commit made it.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 60 {
				k := int64(w*1000 + i)
				if err := leader.Put(ctx, &storage.Put{Namespace: "f", Table: "flat", Partition: storage.Values{"k": storage.BigInt(k)},
					Values: storage.Values{"v": storage.Text(fmt.Sprint(k))}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	written := rowEpochs(t, leader)
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	if rec.next == 0 || len(written) != 240 {
		t.Fatalf("the log came out of order, or %d rows of 240 were written", len(written))
	}
	log := rec.recs
	cuts := []int{1, 2, 3, len(log) - 1, len(log)}
	for c := 4; c < len(log)-1; c += max(1, len(log)/40) {
		cuts = append(cuts, c)
	}
	voided := 0
	for i, cut := range cuts {
		t.Run(fmt.Sprint("cut=", cut), func(t *testing.T) {
			dir := fmt.Sprint("/follower", i)
			f, err := Open(Config{Dir: dir, FS: fs, Follow: true, CheckpointInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for j, r := range log[:cut] {
				if err := f.Apply(uint64(j+1), r); err != nil {
					t.Fatal(err)
				}
			}
			d := f.DurableEpoch()
			// The new leader's log holds what it applied, at the same
			// indexes, as a Raft node's log would.
			sink, err := openWALSink(fs, dir, 1<<20, 4)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sink.(*walSink).l.AppendBatch(ctx, log[:cut]); err != nil {
				t.Fatal(err)
			}
			if err := f.Promote(sink); err != nil {
				t.Fatal(err)
			}
			if f.Recovery().VoidTo > d {
				voided++
			}
			got := rowEpochs(t, f)
			for k, e := range written {
				if _, ok := got[k]; e <= d && !ok {
					t.Fatalf("row %s of durable epoch %d (D %d) is missing", k, e, d)
				}
			}
			for k, e := range got {
				if e > d {
					t.Fatalf("row %s of epoch %d above D %d is visible", k, e, d)
				}
			}
			if f.Epoch() <= d {
				t.Fatalf("promoted at epoch %d, not above D %d", f.Epoch(), d)
			}
			// The log starts with its era, the namespace and the table:
			// a cut before them leaves them to the new leader.
			if cut < 2 {
				if err := f.CreateNamespace(ctx, "f"); err != nil {
					t.Fatal(err)
				}
			}
			if cut < 3 {
				if err := f.CreateTable(ctx, followFlat); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Put(ctx, &storage.Put{Namespace: "f", Table: "flat", Partition: storage.Values{"k": storage.BigInt(-1)},
				Values: storage.Values{"v": storage.Text("new")}}); err != nil {
				t.Fatalf("a write on the promoted follower: %v", err)
			}
			if err := f.Apply(uint64(cut+1), log[0]); err == nil {
				t.Fatal("a promoted follower applied a record")
			}
			schemas, rows := dump(f)
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			reopened, err := Open(Config{Dir: dir, FS: fs, CheckpointInterval: -1, LogSegmentSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer reopened.Close()
			s2, r2 := dump(reopened)
			if fmt.Sprint(schemas) != fmt.Sprint(s2) || len(rows) != len(r2) {
				t.Fatalf("reopened: %d schemas and %d rows, want %d and %d", len(s2), len(r2), len(schemas), len(rows))
			}
			for k, v := range rows {
				if r2[k] != v {
					t.Fatalf("reopened: row %s is %q, want %q", k, r2[k], v)
				}
			}
		})
	}
	if voided == 0 {
		t.Fatalf("none of %d cuts left an epoch undecided: the test did not exercise the void", len(cuts))
	}
}

// lossSink is a log whose leadership can be lost: then it fails every
// proposal, returned or through done, with the new term.
type lossSink struct {
	LogSink
	lost     atomic.Bool
	viaDone  bool
	proposes atomic.Int64
}

func (s *lossSink) Propose(recs [][]byte, done func(uint64, error)) error {
	s.proposes.Add(1)
	if s.lost.Load() {
		err := &LeadershipLostError{Term: 7}
		if s.viaDone {
			done(0, err)
			return nil
		}
		return err
	}
	return s.LogSink.Propose(recs, done)
}

// TestLeadershipLost: once the sink reports another leader, a commit in
// flight is of unknown outcome, and reads, writes and catalog changes
// after it are ErrNotLeader. DB.LeadershipLost does the same at once.
func TestLeadershipLost(t *testing.T) {
	ctx := context.Background()
	put := func(db *DB, k int64) error {
		return db.Put(ctx, &storage.Put{Namespace: "f", Table: "flat", Partition: storage.Values{"k": storage.BigInt(k)},
			Values: storage.Values{"v": storage.Text("x")}})
	}
	for _, how := range []string{"returned", "done", "told"} {
		t.Run(how, func(t *testing.T) {
			ls := &lossSink{viaDone: how == "done"}
			db, err := Open(Config{Dir: "/l", FS: vfs.NewMem(), CheckpointInterval: -1, OpenSink: func(fs vfs.FS, dir string) (LogSink, error) {
				s, err := openWALSink(fs, dir, 1<<20, 4)
				ls.LogSink = s
				return ls, err
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			for _, err := range []error{db.CreateNamespace(ctx, "f"), db.CreateTable(ctx, followFlat), put(db, 1)} {
				if err != nil {
					t.Fatal(err)
				}
			}
			if how == "told" {
				db.LeadershipLost(7)
			} else {
				ls.lost.Store(true)
				err := put(db, 2)
				var lost *LeadershipLostError
				if !errors.Is(err, storage.ErrCommitUnknown) || !errors.As(err, &lost) || lost.Term != 7 {
					t.Fatalf("a commit in flight: %v, want ErrCommitUnknown for term 7", err)
				}
			}
			if err := put(db, 3); !errors.Is(err, storage.ErrNotLeader) {
				t.Fatalf("a write after: %v, want ErrNotLeader", err)
			}
			if err := db.CreateNamespace(ctx, "g"); !errors.Is(err, storage.ErrNotLeader) {
				t.Fatalf("a catalog change after: %v, want ErrNotLeader", err)
			}
			// Its memory may hold commits the new leader voids: no reads.
			if _, _, err := db.Get(ctx, &storage.Get{Namespace: "f", Table: "flat", Partition: storage.Values{"k": storage.BigInt(1)}}); !errors.Is(err, storage.ErrNotLeader) {
				t.Fatalf("a read after: %v, want ErrNotLeader", err)
			}
		})
	}
}
