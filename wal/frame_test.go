package wal

import (
	"bytes"
	"errors"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf []byte
	payloads := [][]byte{{}, []byte("a"), bytes.Repeat([]byte{0}, 100), bytes.Repeat([]byte{0xff}, 4096)}
	for i, p := range payloads {
		buf = appendFrame(buf, uint64(i+7), p)
	}
	off := 0
	for i, p := range payloads {
		idx, got, n, err := decodeFrame(buf[off:])
		if err != nil || idx != uint64(i+7) || !bytes.Equal(got, p) || n != frameSize(len(p)) {
			t.Fatalf("record %d: idx %d, %d bytes, n %d, err %v", i, idx, len(got), n, err)
		}
		off += n
	}
	if _, _, _, err := decodeFrame(buf[off:]); !errors.Is(err, errZero) {
		t.Fatalf("past the end: %v", err)
	}
}

func TestFrameRejects(t *testing.T) {
	good := appendFrame(nil, 3, []byte("payload"))
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
		{"bad type", mut(func(b []byte) []byte { b[8] = 2; return b }), errBadType},
		{"zero type", mut(func(b []byte) []byte { b[8] = 0; return b }), errBadType},
		{"flipped payload bit", mut(func(b []byte) []byte { b[20] ^= 1; return b }), errChecksum},
		{"flipped index bit", mut(func(b []byte) []byte { b[9] ^= 0x80; return b }), errChecksum},
		{"flipped crc bit", mut(func(b []byte) []byte { b[0] ^= 1; return b }), errChecksum},
		{"length past the data", mut(func(b []byte) []byte { b[7] = 0x01; return b }), errShort},
	}
	for _, c := range cases {
		if _, _, _, err := decodeFrame(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzDecodeFrame: the decoder meets arbitrary bytes (a corrupt or torn
// segment) and must never panic, never read past what it is given, and must
// accept only frames that re-encode to exactly the bytes it consumed.
// Seed corpus: testdata/fuzz/FuzzDecodeFrame.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendFrame(nil, 1, []byte("hello")))
	f.Add(appendFrame(appendFrame(nil, 1, nil), 2, []byte{0, 1, 2}))
	f.Add(make([]byte, headerSize))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, payload, n, err := decodeFrame(b)
		if err != nil {
			return
		}
		if n > len(b) || n != frameSize(len(payload)) {
			t.Fatalf("consumed %d of %d bytes for a %d-byte payload", n, len(b), len(payload))
		}
		if re := appendFrame(nil, idx, payload); !bytes.Equal(re, b[:n]) {
			t.Fatalf("accepted a frame that does not re-encode to itself")
		}
	})
}
