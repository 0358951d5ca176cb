package wal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// The frame of one record (FORMAT.md):
//
//	offset size field
//	0      4    CRC-32C (Castagnoli) of bytes [4, 25+length), little-endian
//	4      4    length of the payload, little-endian
//	8      1    type: recordSynced (2); 0 never appears in a frame
//	9      8    index, little-endian
//	17     8    synced: the last index an fsync had covered when this
//	            frame was encoded, little-endian
//	25     n    payload
//
// Logs written before frames carried synced hold type recordFull (1),
// whose header ends at offset 17; they are still read.
const (
	headerSize   = 25
	oldHeader    = 17
	recordFull   = 1
	recordSynced = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frameSize is the size of a record's frame with a payload of n bytes.
func frameSize(n int) int { return headerSize + n }

// appendFrame appends the frame of (index, synced, payload) to dst.
func appendFrame(dst []byte, index, synced uint64, payload []byte) []byte {
	start := len(dst)
	var h [headerSize]byte
	binary.LittleEndian.PutUint32(h[4:8], uint32(len(payload)))
	h[8] = recordSynced
	binary.LittleEndian.PutUint64(h[9:17], index)
	binary.LittleEndian.PutUint64(h[17:25], synced)
	dst = append(dst, h[:]...)
	dst = append(dst, payload...)
	crc := crc32.Checksum(dst[start+4:], castagnoli)
	binary.LittleEndian.PutUint32(dst[start:start+4], crc)
	return dst
}

// Errors of decodeFrame. They are internal: recovery turns them into a torn
// tail or a *CorruptionError.
var (
	errZero     = errors.New("zero header: free space")
	errShort    = errors.New("frame runs past the end of the data")
	errBadType  = errors.New("unknown record type")
	errChecksum = errors.New("checksum mismatch")
	errSynced   = errors.New("frame claims itself synced")
)

// frame is a decoded record.
type frame struct {
	index   uint64
	synced  uint64 // 0 in an old frame, which does not say
	payload []byte // a sub-slice of the decoded bytes
	n       int    // the frame's size
}

// decodeFrame decodes the frame at the start of b. It never panics,
// whatever b holds.
func decodeFrame(b []byte) (frame, error) {
	if len(b) < oldHeader || len(b) >= oldHeader && b[8] == recordSynced && len(b) < headerSize {
		if allZero(b) {
			return frame{}, errZero
		}
		return frame{}, errShort
	}
	if allZero(b[:oldHeader]) {
		return frame{}, errZero
	}
	hs := headerSize
	switch b[8] {
	case recordSynced:
	case recordFull:
		hs = oldHeader
	default:
		return frame{}, errBadType
	}
	length := binary.LittleEndian.Uint32(b[4:8])
	if uint64(length) > uint64(len(b)-hs) {
		return frame{}, errShort
	}
	n := hs + int(length)
	if crc32.Checksum(b[4:n], castagnoli) != binary.LittleEndian.Uint32(b[0:4]) {
		return frame{}, errChecksum
	}
	f := frame{index: binary.LittleEndian.Uint64(b[9:17]), payload: b[hs:n], n: n}
	if hs == headerSize {
		f.synced = binary.LittleEndian.Uint64(b[17:25])
		// An fsync covers only frames already written, never the frame
		// being encoded.
		if f.synced >= f.index {
			return frame{}, errSynced
		}
	}
	return f, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
