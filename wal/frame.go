package wal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// The frame of one record (FORMAT.md):
//
//	offset size field
//	0      4    CRC-32C (Castagnoli) of bytes [4, 17+length), little-endian
//	4      4    length of the payload, little-endian
//	8      1    type: recordFull (1); 0 never appears in a frame
//	9      8    index, little-endian
//	17     n    payload
const (
	headerSize = 17
	recordFull = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frameSize is the size of a record's frame with a payload of n bytes.
func frameSize(n int) int { return headerSize + n }

// appendFrame appends the frame of (index, payload) to dst.
func appendFrame(dst []byte, index uint64, payload []byte) []byte {
	start := len(dst)
	var h [headerSize]byte
	binary.LittleEndian.PutUint32(h[4:8], uint32(len(payload)))
	h[8] = recordFull
	binary.LittleEndian.PutUint64(h[9:17], index)
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
)

// decodeFrame decodes the frame at the start of b. It returns the record's
// index, its payload (a sub-slice of b) and the frame's size. It never
// panics, whatever b holds.
func decodeFrame(b []byte) (index uint64, payload []byte, n int, err error) {
	if len(b) < headerSize {
		if allZero(b) {
			return 0, nil, 0, errZero
		}
		return 0, nil, 0, errShort
	}
	if allZero(b[:headerSize]) {
		return 0, nil, 0, errZero
	}
	length := binary.LittleEndian.Uint32(b[4:8])
	if b[8] != recordFull {
		return 0, nil, 0, errBadType
	}
	if uint64(length) > uint64(len(b)-headerSize) {
		return 0, nil, 0, errShort
	}
	n = headerSize + int(length)
	if crc32.Checksum(b[4:n], castagnoli) != binary.LittleEndian.Uint32(b[0:4]) {
		return 0, nil, 0, errChecksum
	}
	return binary.LittleEndian.Uint64(b[9:17]), b[headerSize:n], n, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
