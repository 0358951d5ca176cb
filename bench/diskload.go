package bench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

// DiskLoad is the disk writes of a run with the log, made again without
// it: the part of the logging cost that writing those bytes takes from
// the rest of the workload. On this project's virtual machines that is
// more than the system calls: a load of 643 MB/s over a 1.2 GiB file took
// 10.5% of ycsb-wo's throughput without a log, over a 69 MiB file 7.0%,
// and half the rate over the large file 6.6% (one run each, 2026-11-23).
// That the file's size matters points at the host, which copies the
// writes through a cache it shares with the guest; the index lookups,
// which miss the processor's caches, slowed most.
type DiskLoad struct {
	// Rate is the bytes a second to write: the wal run's (DiskWriteRate).
	Rate float64 `json:"bytes_per_s"`
	// Span is the size of the file written round and round: the wal
	// run's log footprint (LogSpan), its segments and the truncated ones
	// kept for reuse.
	Span int64 `json:"span_bytes"`
}

// loadWrite is the size of one write of the load: the log's largest (a
// zero-fill write, and about a round's under ycsb-wo).
const loadWrite = 4 << 20

// loadFile is a DiskLoad's file, written in full and ready to load.
type loadFile struct {
	f    *os.File
	buf  []byte
	span int64
	rate float64
}

// openDiskLoad creates the load's file in dir and writes it in full, as
// the log's segments are zero-filled, so that the load overwrites
// allocated blocks.
func openDiskLoad(dir string, dl DiskLoad) (*loadFile, error) {
	f, err := os.OpenFile(filepath.Join(dir, "disk-load"), os.O_RDWR|os.O_CREATE|oDirect, 0o644)
	if err != nil {
		return nil, err
	}
	l := &loadFile{f: f, buf: vfsutil.Align(make([]byte, loadWrite+4096), 4096, loadWrite),
		span: max(dl.Span, 16*loadWrite) &^ (loadWrite - 1), rate: dl.Rate}
	for off := int64(0); off < l.span && err == nil; off += loadWrite {
		_, err = f.WriteAt(l.buf, off)
	}
	if err == nil {
		err = datasync(f)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < len(l.buf); i += 8 {
		binary.LittleEndian.PutUint64(l.buf[i:], r.Uint64())
	}
	return l, nil
}

// run writes the load's rate into the file, round and round, until stop
// is closed, and returns the bytes written. Like the log, it writes with
// direct I/O from a buffer it reuses (the log's chunk buffers and its
// zero buffer), and fdatasyncs after every second write (a round's write
// and fdatasync, plus a zero-fill write).
func (l *loadFile) run(stop <-chan struct{}) (int64, error) {
	start := time.Now()
	var wrote, off int64
	for n := 0; ; n++ {
		select {
		case <-stop:
			return wrote, nil
		default:
		}
		if ahead := time.Duration(float64(wrote)/l.rate*1e9) - time.Since(start); ahead > 0 {
			select {
			case <-stop:
				return wrote, nil
			case <-time.After(ahead):
			}
		}
		if _, err := l.f.WriteAt(l.buf, off); err != nil {
			return wrote, err
		}
		wrote += loadWrite
		off = (off + loadWrite) % l.span
		if n%2 == 1 {
			if err := datasync(l.f); err != nil {
				return wrote, err
			}
		}
	}
}

// close closes and removes the file.
func (l *loadFile) close() {
	l.f.Close()
	os.Remove(l.f.Name())
}

// diskWriteBytes is the bytes this process has caused to be written to
// storage (write_bytes of /proc/self/io, which counts direct I/O), or -1
// where that is not known.
func diskWriteBytes() int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := bytes.CutPrefix(s.Bytes(), []byte("write_bytes: ")); ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

func (dl DiskLoad) String() string {
	return fmt.Sprintf("%.0f MB/s over %.0f MiB", dl.Rate/1e6, float64(dl.Span)/(1<<20))
}
