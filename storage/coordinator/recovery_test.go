package coordinator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/coordinator"
)

// faultyStore fails the puts fail says to fail, as a process that dies
// between them would leave the store.
type faultyStore struct {
	storage.Store
	fail func(p *storage.Put) bool
}

func (f faultyStore) Put(ctx context.Context, p *storage.Put) error {
	if f.fail != nil && f.fail(p) {
		return &storage.Error{Kind: storage.ErrUnavailable, Op: "put", Detail: "injected"}
	}
	return f.Store.Put(ctx, p)
}

// TestRecovery: a transaction that stopped after preparing its rows is
// left alone until it expires, then rolled back by a reader; one that
// stopped after its decision is rolled forward by a reader.
func TestRecovery(t *testing.T) {
	ctx := context.Background()
	db, err := engine.Open(engine.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	cfg := coordinator.Config{Expiry: time.Second, Now: now}
	healthy, err := coordinator.Open(ctx, storeOnly{db}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := healthy.CreateNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := healthy.CreateTable(ctx, &storage.Table{Namespace: "app", Name: "kv",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}); err != nil {
		t.Fatal(err)
	}
	key := func(k string) storage.Values { return storage.Values{"k": storage.Text(k)} }
	put := func(c *coordinator.DB, v int64) error {
		return storage.Update(ctx, c, func(tx storage.Txn) error {
			for _, k := range []string{"a", "b"} {
				if err := tx.Put(ctx, &storage.Put{Namespace: "app", Table: "kv", Partition: key(k), Values: storage.Values{"v": storage.BigInt(v)}}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	read := func(c *coordinator.DB) (int64, int64, error) {
		var a, b int64
		err := storage.UpdateWith(ctx, c, storage.RetryPolicy{MaxAttempts: 1}, func(tx storage.Txn) error {
			ra, _, err := tx.Get(ctx, &storage.Get{Namespace: "app", Table: "kv", Partition: key("a")})
			if err != nil {
				return err
			}
			rb, _, err := tx.Get(ctx, &storage.Get{Namespace: "app", Table: "kv", Partition: key("b")})
			if err != nil {
				return err
			}
			a, b = ra["v"].AsBigInt(), rb["v"].AsBigInt()
			return nil
		})
		return a, b, err
	}
	if err := put(healthy, 1); err != nil {
		t.Fatal(err)
	}

	// Dies before its decision: the decision's put fails.
	undecided, err := coordinator.Open(ctx, faultyStore{Store: db, fail: func(p *storage.Put) bool { return p.Table == "state" }}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = put(undecided, 2)
	if !errors.Is(err, storage.ErrCommitUnknown) {
		t.Fatalf("a commit whose decision could not be written: %v, want ErrCommitUnknown", err)
	}
	if _, _, err := read(healthy); !errors.Is(err, storage.ErrConflict) {
		t.Fatalf("reading rows prepared by an undecided, unexpired transaction: %v, want a conflict", err)
	}
	clock.Add(2 * time.Second.Microseconds())
	if a, b, err := read(healthy); err != nil || a != 1 || b != 1 {
		t.Fatalf("after the undecided transaction expired: a=%d b=%d %v, want its writes rolled back (1, 1)", a, b, err)
	}

	// Dies after its decision: every put after the decision fails.
	var decided atomic.Bool
	committer, err := coordinator.Open(ctx, faultyStore{Store: db, fail: func(p *storage.Put) bool {
		if p.Table == "state" {
			decided.Store(true)
			return false
		}
		return decided.Load()
	}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(committer, 3); err != nil {
		t.Fatalf("a commit whose rows could not be finished: %v (it is committed once decided)", err)
	}
	if a, b, err := read(healthy); err != nil || a != 3 || b != 3 {
		t.Fatalf("after a decided transaction stopped: a=%d b=%d %v, want its writes rolled forward (3, 3)", a, b, err)
	}
}

// TestOnePhase: a transaction that reads and writes one row commits with
// one conditional write and no decision; one that writes two rows
// prepares both and decides once.
func TestOnePhase(t *testing.T) {
	ctx := context.Background()
	db, err := engine.Open(engine.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var puts, decisions atomic.Int64
	c, err := coordinator.Open(ctx, faultyStore{Store: db, fail: func(p *storage.Put) bool {
		if p.Table == "state" {
			decisions.Add(1)
		} else {
			puts.Add(1)
		}
		return false
	}}, coordinator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTable(ctx, &storage.Table{Namespace: "app", Name: "kv",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}); err != nil {
		t.Fatal(err)
	}
	puts.Store(0)
	decisions.Store(0)
	for v := range int64(3) {
		if err := c.Put(ctx, &storage.Put{Namespace: "app", Table: "kv", Partition: storage.Values{"k": storage.Text("a")},
			Values: storage.Values{"v": storage.BigInt(v)}}); err != nil {
			t.Fatal(err)
		}
	}
	if p, d := puts.Load(), decisions.Load(); p != 3 || d != 0 {
		t.Fatalf("three single-row puts made %d row writes and %d decisions, want 3 and 0", p, d)
	}
	row, ok, err := c.Get(ctx, &storage.Get{Namespace: "app", Table: "kv", Partition: storage.Values{"k": storage.Text("a")}})
	if err != nil || !ok || row["v"].AsBigInt() != 2 {
		t.Fatalf("after one-phase puts: %v %v %v", row, ok, err)
	}
	puts.Store(0)
	if err := storage.Update(ctx, c, func(tx storage.Txn) error {
		for _, k := range []string{"a", "b"} {
			if err := tx.Put(ctx, &storage.Put{Namespace: "app", Table: "kv", Partition: storage.Values{"k": storage.Text(k)},
				Values: storage.Values{"v": storage.BigInt(9)}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if p, d := puts.Load(), decisions.Load(); p != 2 || d != 1 {
		t.Fatalf("a two-row transaction made %d row writes and %d decisions, want 2 (a prepare each) and 1", p, d)
	}
}
