package cassandra

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// TestCodecRoundTrip: every edge value comes back as it went in: the same
// type, the same bits (NaN, -0 and ±Inf included), empty apart from NULL.
func TestCodecRoundTrip(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 34, 56, 123456789, time.UTC)
	vals := []storage.Value{
		storage.Bool(false), storage.Bool(true),
		storage.BigInt(math.MinInt64), storage.BigInt(-1), storage.BigInt(0), storage.BigInt(math.MaxInt64),
		storage.Double(math.NaN()), storage.Double(math.Inf(1)), storage.Double(math.Inf(-1)),
		storage.Double(math.Copysign(0, -1)), storage.Double(0), storage.Double(math.SmallestNonzeroFloat64),
		storage.Double(-math.MaxFloat64),
		storage.Text(""), storage.Text("é 漢 😀"), storage.Blob([]byte{}), storage.Blob([]byte{0, 0xff, 0}),
		storage.Timestamp(storage.MinTimestamp), storage.Timestamp(storage.MaxTimestamp), storage.TimestampMicros(-1),
		storage.Timestamp(now),
	}
	for _, v := range vals {
		for _, pk := range []bool{false, true} {
			enc := encode(v, pk)
			if enc == nil {
				t.Fatalf("%v: encoded as NULL", v)
			}
			got, err := decode(v.Type(), pk, enc)
			if err != nil {
				t.Fatalf("%v (pk %v): %v", v, pk, err)
			}
			_, _, wantBits, wantS := v.Payload()
			_, null, gotBits, gotS := got.Payload()
			if null || got.Type() != v.Type() || gotBits != wantBits || gotS != wantS {
				t.Fatalf("%v (pk %v): read back %v", v, pk, got)
			}
		}
	}
	if got := storage.Timestamp(now); got.AsTime() != now.Truncate(time.Microsecond) {
		t.Fatalf("timestamp %v kept as %v", now, got.AsTime())
	}
	// Microseconds, big-endian, as a CQL bigint.
	if enc := encode(storage.TimestampMicros(1), false); !bytes.Equal(enc, []byte{0, 0, 0, 0, 0, 0, 0, 1}) {
		t.Fatalf("TIMESTAMP 1µs encoded as %x", enc)
	}
}

// TestCodecNullAndEmpty: NULL is the protocol's null (nil), empty TEXT and
// BLOB are zero bytes (non-nil), and a partition key is never empty.
func TestCodecNullAndEmpty(t *testing.T) {
	for _, v := range []storage.Value{storage.Null(), storage.NullOf(storage.TypeText), storage.NullOf(storage.TypeDouble)} {
		if enc := encode(v, false); enc != nil {
			t.Fatalf("%v encoded as %x, want NULL", v, enc)
		}
	}
	for _, typ := range []storage.DataType{storage.TypeText, storage.TypeBlob, storage.TypeBigInt} {
		got, err := decode(typ, false, nil)
		if err != nil || !got.IsNull() || got.Type() != typ {
			t.Fatalf("decode(%v, nil) = %v, %v; want a NULL %v", typ, got, err, typ)
		}
	}
	if enc := encode(storage.Text(""), false); enc == nil || len(enc) != 0 {
		t.Fatalf("empty TEXT encoded as %#v", enc)
	}
	if enc := encode(storage.Blob(nil), false); enc == nil || len(enc) != 0 {
		t.Fatalf("empty BLOB encoded as %#v", enc)
	}
	got, err := decode(storage.TypeText, false, []byte{})
	if err != nil || got.IsNull() || got.AsText() != "" {
		t.Fatalf("decode of empty TEXT: %v, %v", got, err)
	}
	for _, v := range []storage.Value{storage.Text(""), storage.Blob(nil)} {
		if enc := encode(v, true); !bytes.Equal(enc, []byte{pkPrefix}) {
			t.Fatalf("empty partition key %v encoded as %x", v, enc)
		}
	}
}

// TestCodecRejects: bytes that encode never writes, and values the API
// never accepts, are errors, not values.
func TestCodecRejects(t *testing.T) {
	over := make([]byte, 8)
	us := storage.MaxTimestamp.UnixMicro() + 1
	for i := range over {
		over[i] = byte(us >> (56 - 8*i))
	}
	for _, c := range []struct {
		typ  storage.DataType
		pk   bool
		data []byte
		want string
	}{
		{storage.TypeBoolean, false, []byte{}, "BOOLEAN of 0 bytes"},
		{storage.TypeBoolean, false, []byte{2}, "BOOLEAN of 1 bytes"},
		{storage.TypeBigInt, false, []byte{1, 2, 3}, "want 8"},
		{storage.TypeDouble, false, make([]byte, 9), "want 8"},
		{storage.TypeText, false, []byte{0xff}, "UTF-8"},
		{storage.TypeText, false, []byte("a\x00b"), "NUL"},
		{storage.TypeText, true, []byte("abc"), "prefix"},
		{storage.TypeBlob, true, []byte{}, "prefix"},
		{storage.TypeTimestamp, false, over, "outside years"},
		{0, false, []byte{1}, "cannot decode"},
	} {
		_, err := decode(c.typ, c.pk, c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("decode(%v, pk %v, %x) = %v, want an error saying %q", c.typ, c.pk, c.data, err, c.want)
		}
	}
}

// FuzzDecode: decoding arbitrary stored bytes never panics, and what it
// accepts encodes back to the same bytes (one encoding per value).
func FuzzDecode(f *testing.F) {
	f.Add(uint8(storage.TypeText), true, []byte{0, 'a'})
	f.Add(uint8(storage.TypeBlob), false, []byte{})
	f.Add(uint8(storage.TypeDouble), false, []byte{0x7f, 0xf8, 0, 0, 0, 0, 0, 1})
	f.Add(uint8(storage.TypeBoolean), false, []byte{1})
	f.Add(uint8(storage.TypeTimestamp), false, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, typ uint8, pk bool, data []byte) {
		if data == nil {
			data = []byte{} // nil is NULL; the fuzzer means bytes
		}
		dt := storage.DataType(typ % 8)
		v, err := decode(dt, pk, data)
		if err != nil {
			return
		}
		if v.IsNull() || v.Type() != dt {
			t.Fatalf("decode(%v, %x) = %v", dt, data, v)
		}
		if enc := encode(v, pk && (dt == storage.TypeText || dt == storage.TypeBlob)); !bytes.Equal(enc, data) {
			t.Fatalf("decode(%v, pk %v, %x) = %v, which encodes as %x", dt, pk, data, v, enc)
		}
	})
}
