//go:build !linux

package wal

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jonboulle/clockwork"
)

func lockSyncerThread() {}

// sleeper elsewhere is the clock's Sleep: a nudge is seen when the sleep
// ends (at most pollChunk late).
type sleeper struct{ clock clockwork.Clock }

func newSleeper(clock clockwork.Clock) (*sleeper, error)  { return &sleeper{clock: clock}, nil }
func (s *sleeper) sleep(d time.Duration, _ chan struct{}) { s.clock.Sleep(d) }
func (*sleeper) interrupt()                               {}
func (*sleeper) close()                                   {}

func dropCache(vfs.File) {}

func newZeros(n int) []byte { return alignedBlocks(n) }
