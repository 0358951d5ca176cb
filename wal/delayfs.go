package wal

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

// DelaySyncFS wraps fs so that every fsync of a file (Sync and SyncData)
// takes d longer, emulating a slow device (seed 003's 200-IOPS volumes take
// about 5 ms per sync). It is for benchmarks and tests, never a default.
func DelaySyncFS(fs vfs.FS, d time.Duration) vfs.FS {
	return vfsutil.SyncHookFS(fs, func(bool) { time.Sleep(d) })
}
