package validator

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// TestValidationLease: a second validation of the same Validator database
// is refused while the first holds the lease, whichever Validator starts
// it; an expired lease is taken over; a lease taken over is noticed before
// persisting; Validate leaves no lease behind.
func TestValidationLease(t *testing.T) {
	ctx := context.Background()
	srv := startLedger(t)
	c := dialLedger(t, srv.Addr(), "alice")
	db := openEngineDB(t)
	v1 := openValidator(t, db, "", c, ClockConfig{})
	v2 := openValidator(t, db, "", c, ClockConfig{}) // another process, sharing the database
	if _, err := v1.Execute(ctx, "builtin.bulk_load", []byte(`{"prefix":"k","first":0,"count":2,"payload":"x"}`)); err != nil {
		t.Fatal(err)
	}
	leaseValue := func() (lease, bool) {
		t.Helper()
		row, ok, err := db.Get(ctx, &storage.Get{Namespace: v1.ns, Table: tMeta, Partition: v1.leaseKey()})
		if err != nil {
			t.Fatal(err)
		}
		var l lease
		if ok {
			if err := json.Unmarshal([]byte(row["value"].AsText()), &l); err != nil {
				t.Fatal(err)
			}
		}
		return l, ok
	}

	h, hctx, err := v1.acquireLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Validate(ctx, Scope{}); !errors.Is(err, ErrValidationRunning) {
		t.Fatalf("Validate while another holds the lease: %v, want ErrValidationRunning", err)
	}
	if _, err := v1.Validate(ctx, Scope{}); !errors.Is(err, ErrValidationRunning) {
		t.Fatalf("a second Validate of the same Validator: %v, want ErrValidationRunning", err)
	}
	if err := h.release(hctx); err != nil {
		t.Fatal(err)
	}
	if l, ok := leaseValue(); ok {
		t.Fatalf("a released lease is still there: %+v", l)
	}
	if rep := validate(t, v2, Scope{}); rep.Validated != 1 {
		t.Fatalf("validated %d transactions after the release, want the 1 logged", rep.Validated)
	}
	if l, ok := leaseValue(); ok {
		t.Fatalf("Validate left its lease behind: %+v", l)
	}

	// A lease whose holder died is taken over once it has expired.
	stale, _ := json.Marshal(lease{Holder: "dead", Until: time.Now().Add(-time.Second).UnixMicro()})
	if err := db.Put(ctx, &storage.Put{Namespace: v1.ns, Table: tMeta, Partition: v1.leaseKey(),
		Values: storage.Values{"value": storage.Text(string(stale))}}); err != nil {
		t.Fatal(err)
	}
	validate(t, v1, Scope{})

	// A holder whose lease was taken over (it stalled past its TTL) must
	// not persist.
	h, hctx, err = v1.acquireLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := json.Marshal(lease{Holder: "successor", Until: time.Now().Add(DefaultLeaseTTL).UnixMicro()})
	if err := db.Put(ctx, &storage.Put{Namespace: v1.ns, Table: tMeta, Partition: v1.leaseKey(),
		Values: storage.Values{"value": storage.Text(string(other))}}); err != nil {
		t.Fatal(err)
	}
	if err := storage.Update(hctx, db, func(tx storage.Txn) error { return h.fence(hctx, tx) }); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the fence after a takeover: %v, want ErrLeaseLost", err)
	}
	if err := h.release(hctx); err != nil {
		t.Fatal(err)
	}
	if l, ok := leaseValue(); !ok || l.Holder != "successor" {
		t.Fatalf("releasing a lost lease touched the successor's: %+v, %v", l, ok)
	}
}

// TestLeaseRenewalAndFence: a running validation keeps its lease alive past
// the TTL by renewing it, so another process stays out; and once the lease
// is taken over, the holder's persisting transactions commit nothing, even
// when they start after its last check.
func TestLeaseRenewalAndFence(t *testing.T) {
	ctx := context.Background()
	srv := startLedger(t)
	c := dialLedger(t, srv.Addr(), "alice")
	db := openEngineDB(t)
	const ttl = 200 * time.Millisecond
	open := func() *Validator {
		v, err := Open(ctx, Config{DB: db, Client: c, LeaseTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v1, v2 := open(), open()
	h, hctx, err := v1.acquireLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	first := h.value
	h.mu.Unlock()
	time.Sleep(3 * ttl) // expired three times over, unless renewed
	if _, err := v2.Validate(ctx, Scope{}); !errors.Is(err, ErrValidationRunning) {
		t.Fatalf("Validate past the TTL of a renewed lease: %v, want ErrValidationRunning", err)
	}
	h.mu.Lock()
	renewed := h.value != first
	h.mu.Unlock()
	if !renewed || context.Cause(hctx) != nil {
		t.Fatalf("the lease was not renewed (renewed %v, cause %v)", renewed, context.Cause(hctx))
	}

	probe := func(name string) error {
		b := &batcher{ctx: hctx, db: db, fence: h.fence}
		b.put(&storage.Put{Namespace: v1.ns, Table: tMeta, Partition: storage.Values{"name": storage.Text(name)},
			Values: storage.Values{"value": storage.Text("written")}})
		return b.flush()
	}
	exists := func(name string) bool {
		_, ok, err := db.Get(ctx, &storage.Get{Namespace: v1.ns, Table: tMeta, Partition: storage.Values{"name": storage.Text(name)}})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if err := probe("probe_held"); err != nil || !exists("probe_held") {
		t.Fatalf("a batch under a held lease: %v", err)
	}
	// Stop renewing (the holder stalls), then another takes the lease over.
	close(h.stop)
	<-h.done
	h.stop = make(chan struct{})
	h.done = make(chan struct{})
	close(h.done)
	other, _ := json.Marshal(lease{Holder: "successor", Until: time.Now().Add(DefaultLeaseTTL).UnixMicro()})
	if err := db.Put(ctx, &storage.Put{Namespace: v1.ns, Table: tMeta, Partition: v1.leaseKey(),
		Values: storage.Values{"value": storage.Text(string(other))}}); err != nil {
		t.Fatal(err)
	}
	if err := probe("probe_lost"); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a batch after a takeover: %v, want ErrLeaseLost", err)
	}
	if exists("probe_lost") {
		t.Fatal("a batch committed after its lease was taken over")
	}
	if err := h.release(hctx); err != nil {
		t.Fatal(err)
	}
}
