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

	// A holder whose lease was taken over (it stalled past LeaseTTL) must
	// not persist.
	h, hctx, err = v1.acquireLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := json.Marshal(lease{Holder: "successor", Until: time.Now().Add(LeaseTTL).UnixMicro()})
	if err := db.Put(ctx, &storage.Put{Namespace: v1.ns, Table: tMeta, Partition: v1.leaseKey(),
		Values: storage.Values{"value": storage.Text(string(other))}}); err != nil {
		t.Fatal(err)
	}
	if err := h.check(hctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("check after a takeover: %v, want ErrLeaseLost", err)
	}
	if err := h.release(hctx); err != nil {
		t.Fatal(err)
	}
	if l, ok := leaseValue(); !ok || l.Holder != "successor" {
		t.Fatalf("releasing a lost lease touched the successor's: %+v, %v", l, ok)
	}
}
