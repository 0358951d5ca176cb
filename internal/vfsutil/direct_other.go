//go:build !linux

package vfsutil

import "github.com/cockroachdb/pebble/v2/vfs"

// SetDirect elsewhere leaves f buffered and reports false.
func SetDirect(vfs.File, bool) bool { return false }
