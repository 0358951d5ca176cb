package wal

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

var policies = []Policy{BatchPolicy(), GroupPolicy(2e6), CountPolicy(8, 3e6), PeriodicPolicy(5e6)}

func testConfig(fs vfs.FS, p Policy) Config {
	return Config{Dir: "/wal", FS: fs, Policy: p, SegmentSize: 8 << 10, MaxRecordSize: 2 << 10, Logf: func(string, ...any) {}}
}

func mustOpen(t testing.TB, cfg Config) *Log {
	t.Helper()
	l, err := Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return l
}

// payload is a self-describing record: writer, sequence, and filler whose
// length and bytes depend on both, so a record cannot pass for another.
func payload(writer, seq int) []byte { return payloadUpTo(writer, seq, 300) }

func payloadUpTo(writer, seq, fill int) []byte {
	head := fmt.Sprintf("w%d/s%d/", writer, seq)
	n := (writer*31 + seq*17) % fill
	return append([]byte(head), bytes.Repeat([]byte{byte(writer + seq)}, n)...)
}

func readAll(t testing.TB, l *Log) map[uint64][]byte {
	t.Helper()
	out := map[uint64][]byte{}
	if err := l.Scan(l.FirstIndex(), func(i uint64, p []byte) error {
		out[i] = append([]byte(nil), p...)
		return nil
	}); err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}

// gateFS holds every SyncData call of segment files until the test lets it
// through, and counts them: a disk whose fsync the test controls.
type gateFS struct {
	vfs.FS
	hold    atomic.Bool
	waiting chan chan struct{} // a held fsync sends its release channel here
	started atomic.Int64
}

func newGateFS(fs vfs.FS) *gateFS {
	g := &gateFS{waiting: make(chan chan struct{}, 100)}
	g.FS = vfsutil.SyncHookFS(fs, g.sync)
	return g
}

func (g *gateFS) sync(data bool) {
	if !data {
		return // a new segment's Sync, not a log round
	}
	g.started.Add(1)
	if g.hold.Load() {
		release := make(chan struct{})
		g.waiting <- release
		<-release
	}
}

// appendAsync starts an Append and returns a channel with its result.
func appendAsync(l *Log, p []byte) chan error {
	c := make(chan error, 1)
	go func() {
		_, err := l.Append(context.Background(), p)
		c <- err
	}()
	return c
}
