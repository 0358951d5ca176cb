package vfsutil

import (
	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// SetDirect switches f's writes to direct I/O (O_DIRECT) or back, and
// reports whether f now writes directly. Direct writes go from the
// caller's memory to the device, bypassing the page cache; each must start
// and end on a multiple of the device's block size, from memory aligned
// to it (Align). A file without a descriptor (an in-memory filesystem), or
// on a filesystem that refuses the flag, stays buffered, and the same
// writes suit it.
func SetDirect(f vfs.File, on bool) bool {
	fd := f.Fd()
	if fd == vfs.InvalidFd {
		return false
	}
	flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil {
		return false
	}
	want := flags &^ unix.O_DIRECT
	if on {
		want |= unix.O_DIRECT
	}
	if want != flags {
		if _, err := unix.FcntlInt(fd, unix.F_SETFL, want); err != nil {
			return false
		}
	}
	return on
}
