// Package vfsutil holds the file-replacement steps the engine and the WAL
// both need, on a pebble vfs.FS so that tests can crash and fail them, a
// wrapper that hooks every fsync (slow-device emulation, fsync gates), and
// the alignment of buffers for direct I/O.
package vfsutil

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// WriteFileAtomic replaces dir/name with data: it writes dir/name.tmp,
// fsyncs it, renames it over dir/name and fsyncs the directory, so a crash
// leaves the old file or the new one, whole. dirHandle, if not nil, is an
// open handle on dir to sync; otherwise dir is opened for it.
func WriteFileAtomic(fs vfs.FS, dir, name string, data []byte, dirHandle vfs.File) error {
	tmp := fs.PathJoin(dir, name+".tmp")
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, fs.PathJoin(dir, name)); err != nil {
		return err
	}
	if dirHandle != nil {
		err = dirHandle.Sync()
	} else {
		err = SyncDir(fs, dir)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRenamed, err)
	}
	return nil
}

// ErrRenamed marks a WriteFileAtomic failure after the rename: the new
// file is in place and becomes durable with the directory's next sync, so
// the caller cannot act as if the write had not happened.
var ErrRenamed = errors.New("file renamed into place, directory not synced")

// SyncDir fsyncs directory dir, making the creations, renames and removals
// in it durable.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}

// SyncHookFS wraps fs so that hook runs before every fsync of a file
// created or opened for writing through it: data reports SyncData (true) or
// Sync (false). Slow-device emulation and tests that hold or count fsyncs
// build on it.
func SyncHookFS(fs vfs.FS, hook func(data bool)) vfs.FS { return &hookFS{FS: fs, hook: hook} }

type hookFS struct {
	vfs.FS
	hook func(data bool)
}

func (fs *hookFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &hookFile{File: f, hook: fs.hook}, nil
}

func (fs *hookFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.Create(name, c))
}

func (fs *hookFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return fs.wrap(fs.FS.OpenReadWrite(name, c, opts...))
}

type hookFile struct {
	vfs.File
	hook func(data bool)
}

func (f *hookFile) Sync() error     { f.hook(false); return f.File.Sync() }
func (f *hookFile) SyncData() error { f.hook(true); return f.File.SyncData() }

// Align returns n bytes of b starting at its first address that is a
// multiple of align (a power of two), as direct I/O needs of its buffers;
// b must have align-1 bytes to spare. Go never moves heap objects, so the
// alignment holds.
func Align(b []byte, align, n int) []byte {
	skip := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b))) & uintptr(align-1))
	return b[skip : skip+n : skip+n]
}

// Aligned returns n zero bytes whose array starts at a multiple of align
// (a power of two).
func Aligned(n, align int) []byte { return Align(make([]byte, n+align), align, n) }
