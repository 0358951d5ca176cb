package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/kiroku-db/kiroku/storage"
)

// TestCatalogRenamedButNotSynced: a DDL whose new catalog was renamed into
// place but whose directory sync failed may be on disk already (the next
// directory sync makes it durable). Undoing it in memory would let the
// engine acknowledge commits to a dropped table that recovery then skips;
// the engine fails instead, and acknowledges nothing more.
func TestCatalogRenamedButNotSynced(t *testing.T) {
	var armed atomic.Bool
	errDirSync := errors.New("injected directory sync failure")
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind == errorfs.OpFileSync && op.Path == "/db" {
			return errDirSync
		}
		return nil
	}))
	db, err := Open(Config{Dir: "/db", FS: fs, EpochInterval: time.Millisecond, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	createKV(t, db, "t", storage.TypeBigInt)
	createKV(t, db, "other", storage.TypeBigInt) // untouched by the drop
	put := func(ns string, k int64) error {
		return db.Put(ctx, &storage.Put{Namespace: ns, Table: "t", Partition: storage.Values{"k": storage.BigInt(k)},
			Values: storage.Values{"v": storage.BigInt(k)}})
	}
	if err := put("t", 1); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if err := db.DropTable(ctx, "t", "t"); !errors.Is(err, errDirSync) {
		t.Fatalf("drop with a failing directory sync: %v", err)
	}
	armed.Store(false)
	// The engine has failed: no commit is acknowledged, even to a table
	// the drop did not touch (the dropped one is gone either way).
	if err := put("other", 2); !errors.Is(err, ErrFailed) {
		t.Fatalf("a commit after a catalog that may be durable was not synced: %v, want ErrFailed", err)
	}
}
