package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
	b := appendWrite([]byte{0xAA}, 1<<20, pk, ck, newRow(cols))
	if len(b) > 1+3*10+len(pk)+len(ck)+1+encodedSize(cols) {
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
	r := d.row(schema)
	if d.err != nil || len(d.b) != 0 {
		t.Fatalf("decode: %v, %d bytes left", d.err, len(d.b))
	}
	got := r.values(newTable(1, schema))
	want := append([]storage.Value(nil), cols...)
	want[7] = storage.NullOf(storage.TypeText)
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("column %s: got %v, want %v", schema.Columns[i].Name, got[i], want[i])
		}
	}
	if del := appendWrite(nil, 2, "p", "", nil); string(del) != "\x02\x01p\x00\x01" {
		t.Fatalf("delete encodes as %q", del)
	}
}

// TestWriteStringLengths round-trips keys and values of every length
// around the 8-to-16-byte word copy, with a clustering key of the same
// length, none (the common shape, encoded without a call) and one too
// long for a one-byte length, checking the bytes land in place and
// nothing beyond the bound is written.
func TestWriteStringLengths(t *testing.T) {
	cols := []storage.Column{{Name: "s", Type: storage.TypeText}, {Name: "x", Type: storage.TypeBlob}}
	clustered := &storage.Table{Namespace: "n", Name: "t", Columns: cols,
		ClusteringKey: []storage.ClusteringColumn{{Name: "c", Type: storage.TypeBlob}}}
	unclustered := &storage.Table{Namespace: "n", Name: "u", Columns: cols}
	src := "0123456789abcdefghijklmnopqrstuvwxyz"
	for n := range 25 {
		pk := src[:max(n, 1)] // keys are never empty
		r := newRow([]storage.Value{storage.Text(src[1 : 1+n]), storage.Blob([]byte(src[2 : 2+n]))})
		for _, ck := range []string{src[len(src)-max(n, 1):], "", strings.Repeat("c", 200)} {
			buf := make([]byte, 3, 3+writeBound(pk, ck, r)+8)
			copy(buf, "pre")
			b := appendWrite(buf, 7, pk, ck, r)
			if string(b[:3]) != "pre" || len(b) > 3+writeBound(pk, ck, r) {
				t.Fatalf("length %d, ck %d: prefix %q, %d bytes for a bound of %d", n, len(ck), b[:3], len(b)-3, writeBound(pk, ck, r))
			}
			d := decoder{b: b[3:]}
			tb := newTable(7, clustered)
			if ck == "" {
				tb = newTable(7, unclustered)
			}
			w, _, ok := d.write(func(uint64) *table { return tb })
			if !ok || len(d.b) != 0 {
				t.Fatalf("length %d, ck %d: decode ok=%v err=%v, %d bytes left", n, len(ck), ok, d.err, len(d.b))
			}
			if cols := w.row.values(tb); w.pk != pk || w.ck != ck || cols[0].AsText() != src[1:1+n] || string(cols[1].AsBlob()) != src[2:2+n] {
				t.Fatalf("length %d, ck %d: decoded pk %q ck %q cols %v", n, len(ck), w.pk, w.ck, cols)
			}
		}
	}
}

// TestPackedWrites encodes random entries of writes packed against the
// write before them (tables alternating or not, keys sharing from none to
// more than maxShared of their first bytes, keys of the word path's
// lengths and around them, clustering keys, deletes, rows from empty to
// past a word) and decodes them back; each write stays within its bound,
// writing nothing past it.
func TestPackedWrites(t *testing.T) {
	cols := []storage.Column{{Name: "x", Type: storage.TypeBlob}}
	tables := map[uint64]*table{
		3:   newTable(3, &storage.Table{Namespace: "n", Name: "u", Columns: cols}),
		200: newTable(200, &storage.Table{Namespace: "n", Name: "c", Columns: cols, ClusteringKey: []storage.ClusteringColumn{{Name: "c", Type: storage.TypeBlob}}}),
	}
	byID := func(id uint64) *table { return tables[id] }
	rng := rand.New(rand.NewPCG(3, 4))
	base := strings.Repeat("\x00\xffab", 12)
	for range 2000 {
		ws := make([]writeEntry, 1+rng.IntN(8))
		for i := range ws {
			id := uint64(3)
			if rng.IntN(3) == 0 {
				id = 200
			}
			shared := rng.IntN(len(base))
			pk := base[:shared] + string(rune('A'+rng.IntN(26))) + strings.Repeat("z", rng.IntN(20))
			if rng.IntN(4) == 0 {
				pk = pk[:1+rng.IntN(len(pk))]
			}
			ws[i] = writeEntry{wkey: wkey{t: tables[id], pk: pk}}
			if id == 200 {
				ws[i].ck = strings.Repeat("c", 1+rng.IntN(200))
			}
			if rng.IntN(5) > 0 {
				ws[i].out = newRow([]storage.Value{storage.Blob(bytes.Repeat([]byte{byte(i)}, rng.IntN(30)))})
			}
		}
		var buf []byte
		for i := range ws {
			var prev *writeEntry
			if i > 0 {
				prev = &ws[i-1]
			}
			// Sentinels after the bound catch a write past it.
			bound := writeBound(ws[i].pk, ws[i].ck, ws[i].out)
			room := slices.Grow(buf, bound+8)[:len(buf)+bound+8]
			for j := len(buf) + bound; j < len(room); j++ {
				room[j] = 0xEE
			}
			n := len(buf)
			buf = appendPackedWrite(room[:n], &ws[i], prev)
			if len(buf)-n > bound || !bytes.Equal(room[n+bound:n+bound+8], bytes.Repeat([]byte{0xEE}, 8)) {
				t.Fatalf("write %d: %d bytes for a bound of %d, or past it", i, len(buf)-n, bound)
			}
		}
		d := decoder{b: buf}
		var prev *logWrite
		for i := range ws {
			w, tb, ok := d.packedWrite(prev, byID)
			if !ok {
				t.Fatalf("write %d of %d: %v", i, len(ws), d.err)
			}
			prev = &w
			want := &ws[i]
			if tb != want.t || w.table != want.t.id || w.pk != want.pk || w.ck != want.ck || w.del != (want.out == nil) ||
				(want.out != nil && w.row.enc() != want.out.enc()) {
				t.Fatalf("write %d: decoded table %d pk %q ck %q del %v, want table %d pk %q ck %q del %v",
					i, w.table, w.pk, w.ck, w.del, want.t.id, want.pk, want.ck, want.out == nil)
			}
		}
		if len(d.b) != 0 {
			t.Fatalf("%d bytes left", len(d.b))
		}
	}
}

// TestSharedPrefix checks the word-wise compare against a byte loop, for
// strings differing at every position up to past maxShared.
func TestSharedPrefix(t *testing.T) {
	a := strings.Repeat("0123456789", 5)
	for la := range len(a) + 1 {
		for diff := 0; diff <= la; diff++ {
			b := []byte(a[:la])
			if diff < la {
				b[diff] ^= 0x40
			}
			for _, lb := range []int{la, diff, min(la, diff+1), la / 2} {
				want := 0
				for want < min(la, lb, maxShared) && a[want] == b[want] {
					want++
				}
				if got := sharedPrefix(a[:la], string(b[:lb])); got != want {
					t.Fatalf("sharedPrefix(%d bytes, %d bytes differing at %d) = %d, want %d", la, lb, diff, got, want)
				}
			}
		}
	}
}

// TestPackedWriteRefusals: packed writes that refer to a write that is not
// there, or flag a clustering key and give none, are malformed.
func TestPackedWriteRefusals(t *testing.T) {
	tb := newTable(3, &storage.Table{Namespace: "n", Name: "u", Columns: []storage.Column{{Name: "x", Type: storage.TypeBlob}}})
	byID := func(uint64) *table { return tb }
	prev := &logWrite{table: 3, pk: "abc"}
	for _, c := range []struct {
		name string
		prev *logWrite
		b    []byte
	}{
		{"first write shares a key", nil, []byte{1 << packedShift, 3, 1, 'x', packedDelete}},
		{"first write shares a table", nil, []byte{packedSameTable | packedDelete, 1, 'x'}},
		{"shares more than the key before", prev, []byte{4<<packedShift | packedSameTable | packedDelete, 0}},
		{"empty clustering key flagged", prev, []byte{packedHasCK | packedSameTable | packedDelete, 1, 'x', 0}},
		{"truncated key", prev, []byte{packedSameTable | packedDelete, 5, 'x'}},
	} {
		d := decoder{b: c.b}
		if _, _, ok := d.packedWrite(c.prev, byID); ok || !errors.Is(d.err, errMalformed) {
			t.Errorf("%s: ok=%v err=%v", c.name, ok, d.err)
		}
	}
	// The same bytes, well-formed, decode.
	d := decoder{b: []byte{3<<packedShift | packedSameTable | packedDelete, 1, 'x'}}
	if w, _, ok := d.packedWrite(prev, byID); !ok || w.pk != "abcx" || !w.del {
		t.Fatalf("well-formed: %+v ok=%v err=%v", w, ok, d.err)
	}
}

// TestRawRowOwnsItsColumns changes the columns a RawRow was built from and
// checks the row, and its encoding within its computed bound, keep the
// values it was built with.
func TestRawRowOwnsItsColumns(t *testing.T) {
	cols := []storage.Value{storage.Blob([]byte("short"))}
	rr := NewRawRow(cols)
	cols[0] = storage.Blob(make([]byte, 1000))
	b := appendWrite(nil, 1, "pk", "", rr.r)
	tb := newTable(1, &storage.Table{Namespace: "n", Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeBlob}}})
	if got := rr.r.values(tb); len(b) > writeBound("pk", "", rr.r) || got[0].Size() != 5 {
		t.Fatalf("row holds %v, encoded in %d bytes for a bound of %d", got[0], len(b), writeBound("pk", "", rr.r))
	}
}

// TestRowValuesRoundTrip: a stored row decodes to the values it was built
// from, of every type, long strings (two-byte lengths) and NULLs (typed by
// the schema), and a row of no value columns decodes to none (all such
// rows share one).
func TestRowValuesRoundTrip(t *testing.T) {
	cols := []storage.Column{{Name: "b", Type: storage.TypeBoolean}, {Name: "i", Type: storage.TypeBigInt},
		{Name: "d", Type: storage.TypeDouble}, {Name: "s", Type: storage.TypeText}, {Name: "x", Type: storage.TypeBlob},
		{Name: "ts", Type: storage.TypeTimestamp}, {Name: "n", Type: storage.TypeText}, {Name: "e", Type: storage.TypeBlob}}
	tb := newTable(1, &storage.Table{Namespace: "n", Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}}, Columns: cols})
	in := []storage.Value{storage.Bool(true), storage.BigInt(-1 << 40), storage.Double(-2.25), storage.Text(strings.Repeat("é", 200)),
		storage.Blob([]byte{0, 0xff}), storage.TimestampMicros(-5), storage.Null(), storage.Blob(nil)}
	got := newRow(in).values(tb)
	want := slices.Clone(in)
	want[6] = storage.NullOf(storage.TypeText)
	if len(got) != len(want) {
		t.Fatalf("%d values, want %d", len(got), len(want))
	}
	for i := range want {
		if !got[i].Equal(want[i]) || got[i].Type() != want[i].Type() || got[i].IsNull() != want[i].IsNull() {
			t.Errorf("column %s: %v, want %v", cols[i].Name, got[i], want[i])
		}
	}
	keysOnly := newTable(2, &storage.Table{Namespace: "n", Name: "k", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}}})
	if got := newRow(nil).values(keysOnly); len(got) != 0 {
		t.Errorf("a row of no columns decodes to %v", got)
	}
	d := decoder{b: []byte{0}}
	if newRow(nil) != noColumns || d.row(keysOnly.schema) != noColumns || mergeRow(nil, nil, nil) != noColumns {
		t.Errorf("rows of no columns do not share one")
	}
}

// TestMergeRowMatchesDecodedMerge: merging at the encoded level gives, byte
// for byte, the row that decoding the base, overlaying the set columns and
// encoding again gives, for random rows of every type (NULLs and long
// strings included), every mask of set columns and no base at all.
func TestMergeRowMatchesDecodedMerge(t *testing.T) {
	types := []storage.DataType{storage.TypeBoolean, storage.TypeBigInt, storage.TypeDouble, storage.TypeText, storage.TypeBlob, storage.TypeTimestamp}
	r := rand.New(rand.NewPCG(1, 2))
	value := func(ty storage.DataType) storage.Value {
		if r.IntN(4) == 0 {
			return storage.NullOf(ty)
		}
		switch ty {
		case storage.TypeBoolean:
			return storage.Bool(r.IntN(2) == 0)
		case storage.TypeBigInt:
			return storage.BigInt(r.Int64() - r.Int64())
		case storage.TypeDouble:
			return storage.Double(r.NormFloat64())
		case storage.TypeText:
			return storage.Text(strings.Repeat("é", r.IntN(150)))
		case storage.TypeBlob:
			return storage.Blob(bytes.Repeat([]byte{0, 0xff}, r.IntN(150)))
		default:
			return storage.TimestampMicros(r.Int64N(1 << 50))
		}
	}
	for range 500 {
		n := r.IntN(7)
		cols := make([]storage.Column, n)
		for i := range cols {
			cols[i] = storage.Column{Name: fmt.Sprint("c", i), Type: types[r.IntN(len(types))]}
		}
		tb := newTable(1, &storage.Table{Namespace: "n", Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}}, Columns: cols})
		base, over := make([]storage.Value, n), make([]storage.Value, n)
		for i, c := range cols {
			base[i], over[i] = value(c.Type), value(c.Type)
		}
		for mask := range 1 << n {
			set := make([]bool, n)
			for i := range set {
				set[i] = mask&(1<<i) != 0
			}
			for _, b := range []*row{nil, newRow(base)} {
				want := newRow(merge(tb, b, over, set)).enc()
				if got := mergeRow(b, over, set).enc(); got != want {
					t.Fatalf("columns %v, base %v, mask %b: merged %q, want %q", cols, b != nil, mask, got, want)
				}
			}
		}
	}
}

// BenchmarkLogEncode logs ycsb-wo's transaction through a worker's stage
// (worker.log): ten writes of an 8-byte key (15 bytes encoded) and an
// 8-byte value. The buffers handed to the logger are dropped.
func BenchmarkLogEncode(b *testing.B) {
	w, writes, bound := stageWorker(func(i int) (string, []byte) {
		k := binary.BigEndian.AppendUint64(nil, uint64(i*7919))
		return string(appendKeyValue(nil, storage.Blob(k), false)), k
	})
	lg := w.lg
	tid := uint64(0)
	for b.Loop() {
		tid++
		w.log(writes, tid, 1, bound)
		if q := lg.mu.queue; len(q) > 0 {
			lg.mu.queue = nil
			lg.pending.Store(0)
			lg.putFree(q)
		}
	}
}
