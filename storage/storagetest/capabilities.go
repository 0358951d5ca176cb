package storagetest

import (
	"sync"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// testCapabilities checks the optional interfaces a store may implement
// (storage.Unsyncer, storage.Exclusive) against their promises. A store
// without one has nothing to check for it: the absence is logged, not
// skipped, since not offering a capability is correct.
func testCapabilities(t *testing.T, open StoreOpener) {
	probe := open(t)
	_, unsynced := probe.(storage.Unsyncer)
	_, exclusive := probe.(storage.Exclusive)
	if err := probe.Close(); err != nil {
		t.Fatal(err)
	}
	if unsynced {
		t.Run("Unsynced", func(t *testing.T) { testUnsynced(t, open) })
	} else {
		t.Logf("%T has no unsynced view: every call is durable when it returns", probe)
	}
	if exclusive {
		t.Run("Exclusive", func(t *testing.T) { testExclusive(t, open) })
	} else {
		t.Logf("%T is not exclusive: other processes may reach its data", probe)
	}
}

// testUnsynced: what a call through the unsynced view wrote is visible to
// every caller at once, and durable once a later durable call returned
// (the Prefix promise): a restart finds both.
func testUnsynced(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := e.table("u", cols(col("k", storage.TypeBigInt)), nil, cols(col("v", storage.TypeText)))
	view := storage.Unsynced(e.db)
	if view == storage.Ops(e.db) {
		t.Fatalf("%T implements Unsyncer but Unsynced returned the store itself", e.db)
	}
	key := func(k int64) V { return V{"k": i64(k)} }
	e.ok(view.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: key(1), Values: V{"v": txt("unsynced")}}))
	row, ok := e.get(tb, key(1), nil)
	if !ok || row["v"].AsText() != "unsynced" {
		t.Fatalf("a put through the unsynced view is not visible to the store: %v %v", row, ok)
	}
	row, ok, err := view.Get(e.ctx, &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: key(1)})
	if err != nil || !ok || row["v"].AsText() != "unsynced" {
		t.Fatalf("read back through the view: %v %v %v", row, ok, err)
	}
	// A conditional put through the view checks its condition like any.
	err = view.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: key(1), Values: V{"v": txt("x")},
		Condition: storage.IfNotExists()})
	e.is(err, storage.ErrConditionNotMet)
	e.put(tb, key(2), nil, V{"v": txt("durable")})
	e.reopen()
	for k, want := range map[int64]string{1: "unsynced", 2: "durable"} {
		row, ok := e.get(tb, key(k), nil)
		if !ok || row["v"].AsText() != want {
			t.Fatalf("after a restart, row %d = %v (found %v), want %q: an unsynced write before a durable one was lost", k, row, ok, want)
		}
	}
}

// testExclusive: Shared hands every caller of one open store the same
// value per key, distinct values for distinct keys, and a fresh one after
// a restart.
func testExclusive(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	type box struct{ n int }
	shared := func() storage.Exclusive { return e.db.(storage.Exclusive) }
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[*box]bool{}
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := shared().Shared("a", func() any { return &box{} }).(*box)
			mu.Lock()
			seen[v] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(seen) != 1 {
		t.Fatalf("concurrent callers of Shared got %d values for one key, want 1", len(seen))
	}
	a := shared().Shared("a", func() any { t.Error("mk called for a key that has a value"); return &box{} }).(*box)
	if !seen[a] {
		t.Fatal("Shared returned another value for the same key")
	}
	if b := shared().Shared("b", func() any { return &box{n: 2} }).(*box); b == a || b.n != 2 {
		t.Fatalf("Shared for another key returned %v", b)
	}
	e.reopen()
	if c := shared().Shared("a", func() any { return &box{n: 3} }).(*box); c == a || c.n != 3 {
		t.Fatal("after a restart Shared returned the value of the store closed before")
	}
}
