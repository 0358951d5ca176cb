package engine

import (
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

// TestRowRoundTrip encodes a row of every type, NULLs and multi-byte
// lengths included, behind a write header and decodes it back.
func TestRowRoundTrip(t *testing.T) {
	schema := &storage.Table{Namespace: "n", Name: "t", Columns: []storage.Column{
		{Name: "b", Type: storage.TypeBoolean}, {Name: "f", Type: storage.TypeBoolean}, {Name: "i", Type: storage.TypeBigInt},
		{Name: "d", Type: storage.TypeDouble}, {Name: "s", Type: storage.TypeText}, {Name: "x", Type: storage.TypeBlob},
		{Name: "ts", Type: storage.TypeTimestamp}, {Name: "n", Type: storage.TypeText}, {Name: "e", Type: storage.TypeBlob}}}
	cols := []storage.Value{storage.Bool(true), storage.Bool(false), storage.BigInt(-1 << 40), storage.Double(-2.25),
		storage.Text(strings.Repeat("é", 200)), storage.Blob([]byte{0, 0xff}), storage.TimestampMicros(-5), storage.Null(), storage.Blob(nil)}
	pk, ck := strings.Repeat("k", 300), "c"
	b := appendWrite([]byte{0xAA}, 1<<20, pk, ck, cols, false)
	if len(b) > 1+3*10+len(pk)+len(ck)+1+colsSize(cols) {
		t.Fatalf("encoded %d bytes, more than the bound", len(b))
	}
	d := decoder{b: b[1:]}
	if id := d.uvarint("table"); id != 1<<20 {
		t.Fatalf("table id %d", id)
	}
	if got := string(d.bytes(d.uvarint("pk length"), "pk")); got != pk {
		t.Fatalf("pk %q", got)
	}
	if got := string(d.bytes(d.uvarint("ck length"), "ck")); got != ck {
		t.Fatalf("ck %q", got)
	}
	if kind := d.byte1("kind"); kind != 0 {
		t.Fatalf("kind %d", kind)
	}
	got := d.row(schema)
	if d.err != nil || len(d.b) != 0 {
		t.Fatalf("decode: %v, %d bytes left", d.err, len(d.b))
	}
	want := append([]storage.Value(nil), cols...)
	want[7] = storage.NullOf(storage.TypeText)
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("column %s: got %v, want %v", schema.Columns[i].Name, got[i], want[i])
		}
	}
	if del := appendWrite(nil, 2, "p", "", nil, true); string(del) != "\x02\x01p\x00\x01" {
		t.Fatalf("delete encodes as %q", del)
	}
}
