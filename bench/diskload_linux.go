package bench

import (
	"os"
	"syscall"
)

const oDirect = syscall.O_DIRECT

func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
