package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf []byte
	payloads := [][]byte{{}, []byte("a"), bytes.Repeat([]byte{0}, 100), bytes.Repeat([]byte{0xff}, 4096)}
	for i, p := range payloads {
		buf = appendFrame(buf, uint64(i+7), uint64(i), p)
	}
	off := 0
	for i, p := range payloads {
		f, err := decodeFrame(buf[off:])
		if err != nil || f.index != uint64(i+7) || f.synced != uint64(i) || !bytes.Equal(f.payload, p) || f.n != frameSize(len(p)) {
			t.Fatalf("record %d: %+v, err %v", i, f, err)
		}
		off += f.n
	}
	if _, err := decodeFrame(buf[off:]); !errors.Is(err, errZero) {
		t.Fatalf("past the end: %v", err)
	}
}

func TestFrameRejects(t *testing.T) {
	good := appendFrame(nil, 3, 2, []byte("payload"))
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"zeros", make([]byte, 40), errZero},
		{"short zeros", make([]byte, 5), errZero},
		{"short header", good[:10], errShort},
		{"cut payload", good[:len(good)-1], errShort},
		{"bad type", mut(func(b []byte) []byte { b[8] = 3; return b }), errBadType},
		{"old type", mut(func(b []byte) []byte { b[8] = recordFull; return b }), errChecksum},
		{"synced not before the index", appendFrame(nil, 3, 3, nil), errSynced},
		{"zero type", mut(func(b []byte) []byte { b[8] = 0; return b }), errBadType},
		{"flipped payload bit", mut(func(b []byte) []byte { b[20] ^= 1; return b }), errChecksum},
		{"flipped index bit", mut(func(b []byte) []byte { b[9] ^= 0x80; return b }), errChecksum},
		{"flipped crc bit", mut(func(b []byte) []byte { b[0] ^= 1; return b }), errChecksum},
		{"length past the data", mut(func(b []byte) []byte { b[7] = 0x01; return b }), errShort},
	}
	for _, c := range cases {
		if _, err := decodeFrame(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzDecodeFrame: the decoder meets arbitrary bytes (a corrupt or torn
// segment) and must never panic, never read past what it is given, and must
// accept only frames that re-encode to exactly the bytes it consumed.
// Seed corpus: testdata/fuzz/FuzzDecodeFrame.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendFrame(nil, 1, 0, []byte("hello")))
	f.Add(appendFrame(appendFrame(nil, 1, 0, nil), 2, 1, []byte{0, 1, 2}))
	f.Add(oldFrame(5, []byte("old")))
	f.Add(make([]byte, headerSize))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := decodeFrame(b)
		if err != nil {
			return
		}
		re := appendFrame(nil, fr.index, fr.synced, fr.payload)
		if b[8] == recordFull {
			re = oldFrame(fr.index, fr.payload)
		}
		if fr.n > len(b) || fr.n != len(re) || fr.synced >= fr.index && b[8] == recordSynced {
			t.Fatalf("consumed %d of %d bytes for a %d-byte payload, synced %d of index %d", fr.n, len(b), len(fr.payload), fr.synced, fr.index)
		}
		if !bytes.Equal(re, b[:fr.n]) {
			t.Fatalf("accepted a frame that does not re-encode to itself")
		}
	})
}

// oldFrame encodes a frame of type recordFull, as logs written before
// frames carried their synced index hold.
func oldFrame(index uint64, payload []byte) []byte {
	b := make([]byte, oldHeader, oldHeader+len(payload))
	binary.LittleEndian.PutUint32(b[4:8], uint32(len(payload)))
	b[8] = recordFull
	binary.LittleEndian.PutUint64(b[9:17], index)
	b = append(b, payload...)
	binary.LittleEndian.PutUint32(b[0:4], crc32.Checksum(b[4:], castagnoli))
	return b
}

// TestOldFrames: a log of frames without their synced index, as older
// versions wrote, is read whole, and new records follow them.
func TestOldFrames(t *testing.T) {
	var buf []byte
	for i := uint64(1); i <= 3; i++ {
		buf = append(buf, oldFrame(i, []byte{byte(i)})...)
	}
	seg := make([]byte, 4096)
	copy(seg, buf)
	if r := scanSegment(seg, 1); r.badErr != nil || r.last != 3 || r.end != int64(len(buf)) {
		t.Fatalf("scan of old frames: %+v", r)
	}
}
