package testenv

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DiskDir returns a temporary directory on a disk, whose pages the kernel
// can drop and whose files take direct I/O: t.TempDir, or, when that is on
// tmpfs, one beside the test's sources (skipping the test if that is on
// tmpfs too).
func DiskDir(t testing.TB) string {
	t.Helper()
	onTmpfs := func(dir string) bool {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Type == unix.TMPFS_MAGIC
	}
	dir := t.TempDir()
	if !onTmpfs(dir) {
		return dir
	}
	dir, err := os.MkdirTemp(".", "disk-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if onTmpfs(dir) {
		t.Skipf("no directory off tmpfs to test in (tmpfs pages cannot be dropped)")
	}
	return dir
}

// Resident counts the pages of the file at path that are in the page
// cache.
func Resident(t testing.TB, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() == 0 {
		return 0
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
