//go:build !linux

package wal

import "time"

func lockSyncerThread() {}

func preciseSleep(d time.Duration) { time.Sleep(d) }
