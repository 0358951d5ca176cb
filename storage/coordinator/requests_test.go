package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/coordinator"
)

// countingStore counts the store calls the coordinator makes, by kind
// ("get", "put", "mutate", ...) and, for the state table, "decide".
type countingStore struct {
	storage.Store
	mu sync.Mutex
	n  map[string]int
}

func (c *countingStore) count(kind string) {
	c.mu.Lock()
	c.n[kind]++
	c.mu.Unlock()
}

func (c *countingStore) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

func (c *countingStore) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	c.count("get")
	return c.Store.Get(ctx, g)
}

func (c *countingStore) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	c.count("scan")
	return c.Store.Scan(ctx, s)
}

func (c *countingStore) Put(ctx context.Context, p *storage.Put) error {
	if p.Table == "state" {
		c.count("decide")
	} else {
		c.count("put")
	}
	return c.Store.Put(ctx, p)
}

func (c *countingStore) Delete(ctx context.Context, d *storage.Delete) error {
	c.count("delete")
	return c.Store.Delete(ctx, d)
}

func (c *countingStore) Mutate(ctx context.Context, ms []storage.Mutation) error {
	c.count("mutate")
	return c.Store.Mutate(ctx, ms)
}

// TestRequests: what a transaction costs the store. A row read and then
// written is read once; a Deferred IfNotExists put is not read, and its
// condition is checked by the write that prepares or commits the row; a
// transaction on one partition commits with one Mutate and no decision;
// a lone read is not read again at commit.
func TestRequests(t *testing.T) {
	ctx := context.Background()
	db, err := engine.Open(engine.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cs := &countingStore{Store: db, n: map[string]int{}}
	c, err := coordinator.Open(ctx, cs, coordinator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kv", "log"} {
		if err := c.CreateTable(ctx, &storage.Table{Namespace: "app", Name: name,
			PartitionKey:  []storage.Column{{Name: "k", Type: storage.TypeText}},
			ClusteringKey: []storage.ClusteringColumn{{Name: "n", Type: storage.TypeBigInt}},
			Columns:       []storage.Column{{Name: "v", Type: storage.TypeBigInt}}}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(k string, n int64) (storage.Values, storage.Values) {
		return storage.Values{"k": storage.Text(k)}, storage.Values{"n": storage.BigInt(n)}
	}
	put := func(table, k string, n, v int64) *storage.Put {
		p, cl := key(k, n)
		return &storage.Put{Namespace: "app", Table: table, Partition: p, Clustering: cl, Values: storage.Values{"v": storage.BigInt(v)}}
	}
	insert := func(table, k string, n, v int64) *storage.Put {
		p := put(table, k, n, v)
		p.Condition, p.Deferred = storage.IfNotExists(), true
		return p
	}
	get := func(table, k string, n int64) *storage.Get {
		p, cl := key(k, n)
		return &storage.Get{Namespace: "app", Table: table, Partition: p, Clustering: cl}
	}
	want := func(what string, got map[string]int, w map[string]int) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s: store calls %v, want %v", what, got, w)
		}
	}
	if err := c.Put(ctx, put("kv", "a", 1, 1)); err != nil {
		t.Fatal(err)
	}
	want("an unconditional put", cs.take(), map[string]int{"get": 1, "put": 1})
	// A conditional put is one conditional write, unless the condition
	// does not hold.
	cas := put("kv", "a", 1, 1)
	cas.Condition = storage.If(storage.Eq("v", storage.BigInt(1)))
	if err := c.Put(ctx, cas); err != nil {
		t.Fatal(err)
	}
	want("a conditional put", cs.take(), map[string]int{"put": 1})
	if err := c.Put(ctx, cas); err != nil {
		t.Fatal(err)
	}
	cas.Condition = storage.If(storage.Eq("v", storage.BigInt(2)))
	if err := c.Put(ctx, cas); !errors.Is(err, storage.ErrConditionNotMet) {
		t.Fatalf("a conditional put whose condition does not hold: %v", err)
	}
	want("a conditional put whose condition does not hold", cs.take(), map[string]int{"get": 1, "put": 2})

	// Read, then write, the same row: one read, one conditional write.
	err = storage.Update(ctx, c, func(tx storage.Txn) error {
		row, _, err := tx.Get(ctx, get("kv", "a", 1))
		if err != nil {
			return err
		}
		return tx.Put(ctx, put("kv", "a", 1, row["v"].AsBigInt()+1))
	})
	if err != nil {
		t.Fatal(err)
	}
	want("read and write one row", cs.take(), map[string]int{"get": 1, "put": 1})

	// Several rows of one partition, one of them a deferred insert: one
	// Mutate, no decision, and the insert is not read.
	err = storage.Update(ctx, c, func(tx storage.Txn) error {
		if err := tx.Put(ctx, put("kv", "a", 1, 10)); err != nil {
			return err
		}
		return tx.Put(ctx, insert("kv", "a", 2, 20))
	})
	if err != nil {
		t.Fatal(err)
	}
	want("two rows of one partition", cs.take(), map[string]int{"get": 1, "mutate": 1})
	if row, ok, err := c.Get(ctx, get("kv", "a", 2)); err != nil || !ok || row["v"].AsBigInt() != 20 {
		t.Fatalf("the deferred insert: %v %v %v", row, ok, err)
	}
	want("a lone read", cs.take(), map[string]int{"get": 1})

	// The same insert again: its condition fails at commit, and nothing
	// of the transaction is written.
	err = storage.Update(ctx, c, func(tx storage.Txn) error {
		if err := tx.Put(ctx, put("kv", "a", 1, 99)); err != nil {
			return err
		}
		return tx.Put(ctx, insert("kv", "a", 2, 99))
	})
	if !errors.Is(err, storage.ErrConditionNotMet) {
		t.Fatalf("a deferred insert of a row that exists: %v, want ErrConditionNotMet", err)
	}
	if row, _, err := c.Get(ctx, get("kv", "a", 1)); err != nil || row["v"].AsBigInt() != 10 {
		t.Fatalf("after the failed transaction: %v %v, want 10", row, err)
	}
	cs.take()

	// Two tables, as a ledger execution writes them: the rows read are
	// read once, the deferred insert not at all; each row written is
	// prepared, there is one decision, and the rows are left prepared.
	err = storage.Update(ctx, c, func(tx storage.Txn) error {
		row, _, err := tx.Get(ctx, get("kv", "a", 1))
		if err != nil {
			return err
		}
		if err := tx.Put(ctx, put("kv", "a", 1, row["v"].AsBigInt()+1)); err != nil {
			return err
		}
		return tx.Put(ctx, insert("log", "a", 11, 1))
	})
	if err != nil {
		t.Fatal(err)
	}
	want("two tables", cs.take(), map[string]int{"decide": 1, "get": 1, "put": 2})
	// A reader takes them as committed, without writing: the decision is
	// remembered by the process that made it.
	err = storage.Update(ctx, c, func(tx storage.Txn) error {
		for _, g := range []*storage.Get{get("kv", "a", 1), get("log", "a", 11)} {
			if _, ok, err := tx.Get(ctx, g); err != nil || !ok {
				return fmt.Errorf("%v %v", ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want("reading two prepared rows of a committed transaction", cs.take(), map[string]int{"get": 4})
	// Another process reads the decision once, and rolls the row forward
	// for the readers after it.
	c2, err := coordinator.Open(ctx, cs, coordinator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cs.take()
	for range 2 {
		if row, ok, err := c2.Get(ctx, get("kv", "a", 1)); err != nil || !ok || row["v"].AsBigInt() != 11 {
			t.Fatalf("another process: %v %v %v", row, ok, err)
		}
	}
	want("another process reads a prepared row twice", cs.take(), map[string]int{"get": 3, "put": 1})
}
