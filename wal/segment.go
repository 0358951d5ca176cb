package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
)

// A segment file is named after the index of its first record,
// "%020d.wal", and is zero-filled to Config.SegmentSize before the first
// record goes in (FORMAT.md).
const segSuffix = ".wal"

func segName(first uint64) string { return fmt.Sprintf("%020d%s", first, segSuffix) }

func parseSegName(name string) (uint64, bool) {
	if len(name) != 20+len(segSuffix) || !strings.HasSuffix(name, segSuffix) {
		return 0, false
	}
	n, err := strconv.ParseUint(name[:20], 10, 64)
	return n, err == nil && n > 0
}

// segment is what the log knows of one segment file.
type segment struct {
	first uint64 // index of the first record
	last  uint64 // index of the last record written; first-1 if none
}

// CorruptionError reports a record that fails its checks before the tail of
// the log: in a sealed segment, or followed by intact records. Recovery never
// skips such a record; the log does not open.
type CorruptionError struct {
	Segment string // file name
	Offset  int64  // byte offset of the bad record in the segment
	Index   uint64 // the index the record should have had
	Reason  string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("wal: corrupt record %d in segment %s at offset %d: %s", e.Index, e.Segment, e.Offset, e.Reason)
}

// TornTail describes a partial write at the end of the log that recovery
// truncated: records that were being written when the process or machine
// stopped, never acknowledged under any policy but Periodic.
type TornTail struct {
	Segment string
	Offset  int64 // where the valid log ended
	Bytes   int64 // how many bytes past Offset were zeroed
	Reason  string
}

// listSegments returns the first indexes of the segments in dir, sorted.
// With clean, it also removes leftover temporary files: only at Open, when
// no preparer is running.
func listSegments(fs vfs.FS, dir string, clean bool) ([]uint64, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	var firsts []uint64
	for _, name := range names {
		if first, ok := parseSegName(name); ok {
			firsts = append(firsts, first)
		} else if clean && strings.HasSuffix(name, tmpSuffix) {
			if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				return nil, err
			}
		}
	}
	sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
	return firsts, nil
}

// readSegment reads a whole segment file.
func readSegment(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, st.Size())
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf, nil
}

// scanResult is what scanSegment found.
type scanResult struct {
	last    uint64 // index of the last valid record; first-1 if none
	end     int64  // offset just past it
	dirty   int64  // offset just past the last non-zero byte after end (0 if clean)
	badErr  error  // why scanning stopped before clean free space, if it did
	corrupt bool   // the stop is corruption, not a tear: badErr says why
}

// scanSegment decodes the records of a segment whose first index is first.
// It stops at the first frame that does not decode or does not carry the
// next index. If everything after that point is zero, the segment simply
// ends there. Otherwise the bytes past it are either a torn tail (records
// being written when the machine stopped, never acknowledged) or damage to
// records that were durable, which recovery must not drop:
//
//   - An intact later frame whose synced field reaches the index expected
//     here was encoded after an fsync had covered this record: the record
//     was durable, and whatever happened to it since is corruption
//     (zeroed, overwritten or cut), however much it looks like a tear.
//   - Otherwise, segments are zero-filled before use, so a write that never
//     reached the disk leaves zeros: a tear shows a zero header, a whole
//     zero sector (512 aligned bytes), or zeros up to a sector boundary,
//     before the next intact record; or no intact next record at all. A
//     bad record followed by an intact record of the next index, with no
//     such lost sector in between, is corruption: the tail is written in
//     order.
//
// A length is judged against the segment itself, never
// Config.MaxRecordSize: that bounds new appends and may have been larger
// when the records were written.
func scanSegment(buf []byte, first uint64) scanResult {
	r := scanResult{last: first - 1}
	off := 0
	want := first
	for {
		f, err := decodeFrame(buf[off:])
		if err == nil && f.index != want {
			err = fmt.Errorf("record carries index %d", f.index)
		}
		if err != nil {
			r.end = int64(off)
			rest := buf[off:]
			if errors.Is(err, errZero) && allZero(rest) {
				return r
			}
			r.badErr = err
			for i := len(rest) - 1; i >= 0; i-- {
				if rest[i] != 0 {
					r.dirty = int64(off + i + 1)
					break
				}
			}
			if at, later := findSynced(buf, off, want); at >= 0 {
				r.corrupt = true
				r.badErr = fmt.Errorf("record %d at offset %d, written after an fsync had covered this one, is intact: this record was durable, and is damaged (%v)",
					later.index, at, err)
				return r
			}
			if next := findFrame(buf, off+1, want+1); next >= 0 {
				r.corrupt = !errors.Is(err, errZero) && !lostWrite(buf, off, next)
			}
			return r
		}
		r.last = want
		want++
		off += f.n
	}
}

const sectorSize = 512

// lostWrite reports whether buf[from:to], the bytes between a bad frame and
// the next intact one, show a write that never reached the disk. A lost
// block keeps its last synced contents, and beyond the synced end that is
// the zero-fill: so either a whole aligned sector of zeros lies in the
// range, or zeros run from the bad frame to the next sector boundary (a
// header that straddled the boundary of a lost block).
func lostWrite(buf []byte, from, to int) bool {
	if b := (from + sectorSize - 1) / sectorSize * sectorSize; b > from && b <= to && allZero(buf[from:b]) {
		return true
	}
	for s := (from + sectorSize - 1) / sectorSize * sectorSize; s+sectorSize <= to; s += sectorSize {
		if allZero(buf[s : s+sectorSize]) {
			return true
		}
	}
	return false
}

// findFrame returns the offset of the first intact frame with the given
// index at or after from, or -1.
func findFrame(buf []byte, from int, index uint64) int {
	var key [8]byte
	binary.LittleEndian.PutUint64(key[:], index)
	for p := from; p+oldHeader <= len(buf); p++ {
		if t := buf[p+8]; t != recordFull && t != recordSynced || string(buf[p+9:p+17]) != string(key[:]) {
			continue
		}
		if f, err := decodeFrame(buf[p:]); err == nil && f.index == index {
			return p
		}
	}
	return -1
}

// findSynced returns the offset of the first intact frame after from that
// was encoded once an fsync had covered record want (its synced field is
// at least want), and the frame; -1 if there is none. Only an index that
// could follow want in what is left of the segment is considered, so
// random bytes are rarely checksummed.
func findSynced(buf []byte, from int, want uint64) (int, frame) {
	most := want + uint64(len(buf)-from)/headerSize + 1
	for p := from + 1; p+headerSize <= len(buf); p++ {
		if buf[p+8] != recordSynced {
			continue
		}
		idx := binary.LittleEndian.Uint64(buf[p+9:])
		synced := binary.LittleEndian.Uint64(buf[p+17:])
		if idx <= want || idx > most || synced < want || synced >= idx {
			continue
		}
		if f, err := decodeFrame(buf[p:]); err == nil {
			return p, f
		}
	}
	return -1, frame{}
}

// zeroFill writes size zero bytes to a new file at path and syncs it,
// with direct I/O if direct (see Config.BufferedIO).
func zeroFill(fs vfs.FS, path string, size int64, direct bool) error {
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if direct {
		vfsutil.SetDirect(f, true)
	}
	return zeroSyncClose(f, size, f.Sync)
}

// overwriteZeros overwrites a kept segment file of size bytes with zeros
// and syncs it, with direct I/O if direct. Its size does not change, so
// its data alone needs syncing.
func overwriteZeros(fs vfs.FS, path string, size int64, direct bool) error {
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if direct {
		vfsutil.SetDirect(f, true)
	}
	return zeroSyncClose(f, size, f.SyncData)
}

// zeroSyncClose writes zeros over the first size bytes of f, syncs it with
// sync and closes it.
func zeroSyncClose(f vfs.File, size int64, sync func() error) error {
	err := writeZeros(f, 0, size)
	if err == nil {
		err = sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// zeros returns the source of every zero-fill and of the padding of
// writes, never written: one allocated per segment would be megabytes of
// fresh heap each time. It is block-aligned, for direct I/O, and on Linux
// it lies in 2 MiB pages, read-only (newZeros). It is made on first use,
// not at start-up: a process that opens no log (the CLI's client
// commands) neither maps nor faults in its 4 MiB.
//
// Its size is the largest write a typical virtual disk takes in one
// request (max_sectors_kb 4096). The block layer splits a direct write at
// max_segments runs of physically contiguous memory (often 254), and every
// request costs a notification of the virtual disk and an interrupt. From
// a heap buffer in 4 KiB pages, each 1 MiB zero-fill write became three
// requests; from 2 MiB pages a 4 MiB write is one. Under a write-heavy
// load the preparer zero-fills as many bytes as the loggers write, so this
// roughly halves the disk's requests (docs/benchmarks.md).
var zeros = sync.OnceValue(func() []byte { return newZeros(zeroSize) })

const zeroSize = 4 << 20

// blockSize is the unit of the log's writes to a segment: each starts and
// ends on a multiple of it (writeChunks), from memory aligned to it, as
// direct I/O requires. It is the page size, and the physical sector size
// of current disks: a buffered write of part of a block makes the kernel
// write the whole page too, so a write repeating the start of the block
// (the log's tail, already durable) risks exactly what page writeback
// does, and no more.
const blockSize = 4096

// alignedBlocks returns n zero bytes whose array starts on a block
// boundary.
func alignedBlocks(n int) []byte {
	return vfsutil.Aligned(n, blockSize)
}

// growBlocks returns b, holding the start of a chunk, with room for n more
// bytes and the padding to the next block, in a block-aligned array. A
// new array is at least a quarter larger than the old one (as append
// grows large slices), so repeated growth stays linear.
func growBlocks(b []byte, n int) []byte {
	need := len(b) + n + blockSize
	if cap(b) >= need {
		return b
	}
	nb := alignedBlocks(max(need, cap(b)+cap(b)/4))
	return nb[:copy(nb, b)]
}

// writeZeros writes zero bytes over [from, to) of f.
func writeZeros(f vfs.File, from, to int64) error {
	z := zeros()
	for off := from; off < to; off += int64(len(z)) {
		n := min(int64(len(z)), to-off)
		if _, err := f.WriteAt(z[:n], off); err != nil {
			return err
		}
	}
	return nil
}

// walkFrames decodes the records first..last of a segment already verified
// by recovery, calling fn with each one's index, payload and offset, and
// returns the offset just past the last. A frame that no longer decodes, or
// carries another index, is a *CorruptionError.
func walkFrames(buf []byte, name string, first, last uint64, fn func(index uint64, payload []byte, off int) error) (int, error) {
	off := 0
	for idx := first; idx <= last; idx++ {
		f, err := decodeFrame(buf[off:])
		if err == nil && f.index != idx {
			err = fmt.Errorf("record carries index %d", f.index)
		}
		if err != nil {
			return off, &CorruptionError{Segment: name, Offset: int64(off), Index: idx, Reason: err.Error()}
		}
		if fn != nil {
			if err := fn(idx, f.payload, off); err != nil {
				return off, err
			}
		}
		off += f.n
	}
	return off, nil
}
