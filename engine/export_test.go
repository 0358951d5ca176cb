package engine

import "github.com/cockroachdb/pebble/v2/vfs"

// OpenWALSink opens the default sink, for tests of package engine_test
// that wrap it.
func OpenWALSink(fs vfs.FS, dir string, segSize int64) (LogSink, error) {
	return openWALSink(fs, dir, segSize, 4)
}

// Dump is dump (follow_test.go), for package engine_test.
var Dump = dump
