//go:build !linux

package wal

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func lockSyncerThread() {}

// sleeper elsewhere is time.Sleep: a nudge is seen when the sleep ends
// (at most pollChunk late).
type sleeper struct{}

func newSleeper() (*sleeper, error)                     { return &sleeper{}, nil }
func (*sleeper) sleep(d time.Duration, _ chan struct{}) { time.Sleep(d) }
func (*sleeper) interrupt()                             {}
func (*sleeper) close()                                 {}

func dropCache(vfs.File) {}

func newZeros(n int) []byte { return alignedBlocks(n) }
