package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fuzzSegment lays out a segment of size bytes holding n records from
// index first on, as the log writes them: each frame's synced field is the
// index before it (every append of its own round, as under the batch
// policy), payloads of lengths drawn from lens.
func fuzzSegment(first uint64, n int, lens []byte, size int) ([]byte, []int) {
	buf := make([]byte, 0, size)
	var offs []int
	for i := range n {
		l := 1
		if len(lens) > 0 {
			l = int(lens[i%len(lens)]) + 1
		}
		if len(buf)+frameSize(l) > size {
			break
		}
		offs = append(offs, len(buf))
		idx := first + uint64(i)
		buf = appendFrame(buf, idx, idx-1, bytes.Repeat([]byte{byte(idx)}, l))
	}
	return buf[:size], offs
}

// FuzzScanSegment feeds arbitrary bytes to the scan that decides, at Open,
// where a segment's records end and whether what follows is a torn tail or
// corruption. It must never panic, and what it reports must hold: the
// records it accepts decode in order and end where it says, a clean end is
// followed by zeros only, and a tail it would cut holds no intact frame
// vouching for the record where it stopped.
func FuzzScanSegment(f *testing.F) {
	seg, _ := fuzzSegment(1, 20, []byte{3, 200, 17}, 4096)
	f.Add(seg, uint64(1))
	f.Add(make([]byte, 512), uint64(7))
	f.Add(append(oldFrame(4, []byte("old")), make([]byte, 100)...), uint64(4))
	f.Add([]byte{1, 2, 3}, uint64(1))
	f.Fuzz(func(t *testing.T, buf []byte, first uint64) {
		if first == 0 || first > 1<<62 {
			return
		}
		r := scanSegment(buf, first)
		if r.end > int64(len(buf)) || r.last+1 < first {
			t.Fatalf("scan %+v of %d bytes from %d", r, len(buf), first)
		}
		end, err := walkFrames(buf, "seg", first, r.last, nil)
		if err != nil || int64(end) != r.end {
			t.Fatalf("accepted records %d..%d do not walk to %d: %d, %v", first, r.last, r.end, end, err)
		}
		if r.badErr == nil && !allZero(buf[r.end:]) {
			t.Fatalf("clean end at %d before non-zero bytes", r.end)
		}
		if r.badErr != nil && !r.corrupt {
			if at, _ := findSynced(buf, int(r.end), r.last+1); at >= 0 {
				t.Fatalf("a tail vouched for at offset %d was taken for a tear", at)
			}
		}
	})
}

// FuzzScanDamage damages a segment of records written as the log writes
// them — bytes zeroed, overwritten or cut from some offset — and checks
// the promise recovery makes: a record that a later intact frame vouches
// for as synced is never dropped as a torn tail; the scan either keeps it
// or calls the damage corruption.
func FuzzScanDamage(f *testing.F) {
	f.Add([]byte{3, 200, 17}, uint16(0), uint16(4096), byte(0))
	f.Add([]byte{40}, uint16(700), uint16(30), byte(1))
	f.Add([]byte{9, 9}, uint16(2000), uint16(1), byte(2))
	f.Fuzz(func(t *testing.T, lens []byte, at, n uint16, kind byte) {
		const size = 8192
		buf, offs := fuzzSegment(1, 200, lens, size)
		from := int(at) % size
		to := min(size, from+int(n))
		switch kind % 3 {
		case 0:
			clear(buf[from:to])
		case 1:
			for i := from; i < to; i++ {
				buf[i] ^= 0x5a
			}
		case 2:
			buf = buf[:from] // cut
		}
		r := scanSegment(buf, 1)
		if r.badErr == nil || r.corrupt {
			return
		}
		// The scan stopped at record r.last+1 and would drop the rest as a
		// tear: no intact frame after it may vouch for it.
		stopped := r.last + 1
		for i, off := range offs {
			idx := uint64(i + 1)
			if idx <= stopped || off+headerSize > len(buf) || off < int(r.end) {
				continue
			}
			if fr, err := decodeFrame(buf[off:]); err == nil && fr.index == idx && fr.synced >= stopped {
				t.Fatalf("record %d, synced before record %d at offset %d was written, is dropped as a tear (%v)", stopped, idx, off, r.badErr)
			}
		}
	})
}

// FuzzTruncateMark reads arbitrary bytes as the suffix truncation marker:
// an error that is a *CorruptionError, or an index whose checksum holds.
func FuzzTruncateMark(f *testing.F) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/wal", 0o755); err != nil {
		f.Fatal(err)
	}
	l := &Log{cfg: Config{Dir: "/wal"}, fs: fs}
	if err := l.writeTruncateMark(42); err != nil {
		f.Fatal(err)
	}
	good, _ := readSegment(fs, "/wal/"+truncateName)
	f.Add(good)
	f.Add([]byte{})
	f.Add(make([]byte, truncMarkSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		mk, err := fs.Create("/wal/"+truncateName, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		mk.Write(bytes.Clone(b)) // a race build's MemFS mangles what it was given to write
		mk.Close()
		idx, ok, err := l.readTruncateMark()
		var ce *CorruptionError
		switch {
		case err != nil && !errors.As(err, &ce):
			t.Fatalf("untyped error %v", err)
		case err == nil && (!ok || len(b) < truncMarkSize || binary.LittleEndian.Uint64(b) != idx ||
			crc32.Checksum(b[:8], castagnoli) != binary.LittleEndian.Uint32(b[8:12])):
			t.Fatalf("accepted %x as marker %d (%v)", b, idx, ok)
		}
	})
}
