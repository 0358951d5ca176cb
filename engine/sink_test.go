package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
)

// markSink is an in-memory LogSink that checks the loggers' invariants as
// records arrive: once a mark says every record of epochs ≤ X is in the
// log, no buffer of such an epoch may follow, and no lower mark.
type markSink struct {
	mu        sync.Mutex
	recs      [][]byte
	mark      uint64
	marked    bool
	violation string
}

func (s *markSink) MaxRecordSize() int { return 1 << 20 }

func (s *markSink) Recovered() engine.SinkRecovery { return engine.SinkRecovery{} }

func (s *markSink) Propose(recs [][]byte, done func(uint64, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		d := r[1:]
		v, n := binary.Uvarint(d)
		switch r[0] {
		case 3: // a buffer of epoch v
			if s.marked && v <= s.mark && s.violation == "" {
				s.violation = fmt.Sprintf("buffer of epoch %d after the mark %d", v, s.mark)
			}
		case 4: // logger v's mark
			x, _ := binary.Uvarint(d[n:])
			if s.marked && x < s.mark && s.violation == "" {
				s.violation = fmt.Sprintf("mark %d after the mark %d", x, s.mark)
			}
			s.mark, s.marked = x, true
		}
		s.recs = append(s.recs, append([]byte(nil), r...))
	}
	time.Sleep(50 * time.Microsecond) // an fsync's worth of time for commits to race with
	done(uint64(len(s.recs)), nil)
	return nil
}

func (s *markSink) Replay(from uint64, fn func(uint64, []byte) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := max(from, 1); i <= uint64(len(s.recs)); i++ {
		if err := fn(i, s.recs[i-1]); err != nil {
			return err
		}
	}
	return nil
}

func (s *markSink) TruncateFront(uint64) error { return nil }
func (s *markSink) Close() error               { return nil }

// TestMarksCoverTheirEpochs commits from many goroutines with short epochs
// and many workers, so buffers change hands while the logger collects,
// and checks that no buffer is logged after a mark that claimed its epoch
// durable. Then it recovers from the sink and finds every commit.
func TestMarksCoverTheirEpochs(t *testing.T) {
	sink := &markSink{}
	fs := vfs.NewMem()
	db := openKV(t, engine.Config{Dir: "/db", FS: fs, Workers: 256, EpochInterval: 200 * time.Microsecond, LogBufferSize: 4 << 10,
		CheckpointInterval: -1, OpenSink: func(vfs.FS, string) (engine.LogSink, error) { return sink, nil }})
	ctx := context.Background()
	h, err := db.Table("u", "kv")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	const clients = 64
	var commits [clients]int64
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := db.BeginRaw()
			for i := int64(0); time.Now().Before(stop); i, commits[g] = i+1, i+1 {
				x.Reset()
				x.Write(h, h.PartitionKey(storage.BigInt(int64(g)<<32|i)), []storage.Value{storage.BigInt(i)})
				if _, err := x.CommitAsync(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if sink.violation != "" {
		t.Fatal(sink.violation)
	}
	db, err = engine.Open(engine.Config{Dir: "/db", FS: fs, Workers: 256, CheckpointInterval: -1,
		OpenSink: func(vfs.FS, string) (engine.LogSink, error) { return sink, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for g, n := range commits {
		for i, want := range map[int64]bool{0: n > 0, n - 1: n > 0, n: false} {
			_, ok, err := db.Get(ctx, &storage.Get{Namespace: "u", Table: "kv", Partition: storage.Values{"k": storage.BigInt(int64(g)<<32 | i)}})
			if err != nil || ok != want {
				t.Fatalf("client %d row %d after recovery: found %v, want %v (%v)", g, i, ok, want, err)
			}
		}
	}
	t.Logf("%d records, last mark %d", len(sink.recs), sink.mark)
}
