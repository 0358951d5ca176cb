//go:build !linux

package bench

import "os"

const oDirect = 0

func datasync(f *os.File) error { return f.Sync() }
