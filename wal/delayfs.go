package wal

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// DelaySyncFS wraps fs so that every fsync of a file (Sync and SyncData)
// takes d longer, emulating a slow device (seed 003's 200-IOPS volumes take
// about 5 ms per sync). It is for benchmarks and tests, never a default.
func DelaySyncFS(fs vfs.FS, d time.Duration) vfs.FS {
	return &delayFS{FS: fs, d: d}
}

type delayFS struct {
	vfs.FS
	d time.Duration
}

func (fs *delayFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &delayFile{File: f, d: fs.d}, nil
}

func (fs *delayFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.Create(name, c))
}

func (fs *delayFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return fs.wrap(fs.FS.OpenReadWrite(name, c, opts...))
}

type delayFile struct {
	vfs.File
	d time.Duration
}

func (f *delayFile) Sync() error     { time.Sleep(f.d); return f.File.Sync() }
func (f *delayFile) SyncData() error { time.Sleep(f.d); return f.File.SyncData() }
