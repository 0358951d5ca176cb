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

// TestCatalogChangeLogFailure: a DDL is logged and made durable before
// it takes effect. If the log's fsync fails under it, the change may or
// may not be durable: the DDL reports ErrCommitUnknown, the engine fails
// (an fsync error is never retried), and nothing more is acknowledged.
func TestCatalogChangeLogFailure(t *testing.T) {
	var armed atomic.Bool
	errSync := errors.New("injected fdatasync failure")
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind == errorfs.OpFileSyncData {
			return errSync
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
	if err := db.DropTable(ctx, "t", "t"); !errors.Is(err, storage.ErrCommitUnknown) || !errors.Is(err, errSync) {
		t.Fatalf("drop with a failing log: %v, want ErrCommitUnknown from the fsync", err)
	}
	armed.Store(false)
	if err := put("other", 2); !errors.Is(err, ErrFailed) {
		t.Fatalf("a commit after the log failed: %v, want ErrFailed", err)
	}
	if _, err := db.DescribeTable(ctx, "t", "t"); err != nil {
		t.Fatalf("the table whose drop is unknown is gone from memory: %v", err)
	}
}
