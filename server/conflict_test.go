package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wire"
)

// TestConflictHasItsKind: a transaction that conflicted on every attempt
// (on PostgreSQL, serialization failures past the retry policy) reaches the
// client as ABORTED with the kind "conflict", which says nothing was
// committed and the same nonce may be sent again; a bare ABORTED said
// neither.
func TestConflictHasItsKind(t *testing.T) {
	db, err := engine.Open(engine.Config{Dir: t.TempDir(), EpochInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	exhausted := storage.UpdateWith(ctx, db, storage.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Microsecond}, func(storage.Txn) error {
		return &storage.Error{Kind: storage.ErrConflict, Op: "put", Detail: "a serialization failure"}
	})
	if !errors.Is(exhausted, storage.ErrRetriesExhausted) {
		t.Fatalf("setup: %v", exhausted)
	}
	for _, err := range []error{exhausted, &storage.Error{Kind: storage.ErrConflict, Op: "commit"}} {
		if code, kind := errorCode(err); code != codes.Aborted || kind != wire.KindConflict {
			t.Errorf("%v: code %v kind %q; want ABORTED, %q", err, code, kind, wire.KindConflict)
		}
	}
	if st := status.Convert(toStatus(ctx, exhausted)); st.Code() != codes.Aborted {
		t.Errorf("status %v", st)
	}
}
