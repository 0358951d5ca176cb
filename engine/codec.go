package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/kiroku-db/kiroku/storage"
)

// Checkpoints encode rows and writes as below; log entries encode rows the
// same way and pack their writes (see pwrite).
//
//	write  = uvarint(table id) uvarint(len pk) pk uvarint(len ck) ck kind [row]
//	kind   = 0 (put, a row follows) | 1 (delete)
//	row    = uvarint(n) value*n            (the value columns in schema order)
//	value  = 0 (NULL) | type payload
//	payload: BOOLEAN 1 byte (0|1); BIGINT, TIMESTAMP 8 bytes LE;
//	         DOUBLE 8 bytes LE IEEE-754 bits; TEXT, BLOB uvarint(len) bytes
//
// Every decoder treats its input as untrusted: a malformed input returns
// errMalformed (wrapped with what was wrong) and never panics.

var errMalformed = errors.New("malformed record")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// putUvarint is binary.PutUvarint with the one-byte case inline.
func putUvarint(d []byte, v uint64) int {
	if v < 0x80 {
		d[0] = byte(v)
		return 1
	}
	return binary.PutUvarint(d, v)
}

// decoder reads the encoding above from an untrusted buffer.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = malformed(format, args...)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint for %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s of %d bytes, %d left", what, n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) byte1(what string) byte {
	b := d.bytes(1, what)
	if b == nil {
		return 0
	}
	return b[0]
}

func (d *decoder) u64(what string) uint64 {
	b := d.bytes(8, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// row checks an encoded row against the table's value columns and
// returns a copy of its bytes as a stored row (nil if it does not check).
// The values it checks are built on the input bytes and dropped: the row
// is decoded again only when read.
func (d *decoder) row(schema *storage.Table) *row {
	start := d.b
	n := d.uvarint("column count")
	if d.err != nil {
		return nil
	}
	if n != uint64(len(schema.Columns)) {
		d.fail("row of %d columns, table %s.%s has %d", n, schema.Namespace, schema.Name, len(schema.Columns))
		return nil
	}
	for _, c := range schema.Columns {
		tag := d.byte1("value type")
		if d.err != nil {
			return nil
		}
		if tag == 0 {
			continue
		}
		if storage.DataType(tag) != c.Type {
			d.fail("column %s holds %v, schema says %v", c.Name, storage.DataType(tag), c.Type)
			return nil
		}
		var v storage.Value
		switch c.Type {
		case storage.TypeBoolean:
			if x := d.byte1("boolean"); x > 1 {
				d.fail("boolean byte %d", x)
			}
		case storage.TypeBigInt, storage.TypeDouble:
			d.u64("number")
		case storage.TypeTimestamp:
			v = storage.TimestampMicros(int64(d.u64("timestamp")))
		case storage.TypeText:
			b := d.bytes(d.uvarint("text length"), "text")
			v = storage.Text(unsafe.String(unsafe.SliceData(b), len(b)))
		case storage.TypeBlob:
			d.bytes(d.uvarint("blob length"), "blob")
		}
		if d.err != nil {
			return nil
		}
		if msg := v.CheckContent(); msg != "" {
			d.fail("column %s: %s", c.Name, msg)
			return nil
		}
	}
	size := len(start) - len(d.b)
	if size == 1 {
		return noColumns // the only one-byte row: a count of zero
	}
	r, b := allocRow(size)
	copy(b, start)
	return r
}

// logWrite is one decoded write of a log record or checkpoint.
type logWrite struct {
	table  uint64
	pk, ck string
	del    bool
	row    *row // checked, and copied from the input (nil for a delete)
}

// appendWrite appends a write of row r (nil for a delete); see putWrite.
func appendWrite(b []byte, tableID uint64, pk, ck string, r *row) []byte {
	bound := writeBound(pk, ck, r)
	if cap(b)-len(b) < bound {
		b = slices.Grow(b, bound)
	}
	n := len(b)
	return b[:n+putWrite(b[n:n+bound], tableID, pk, ck, r)]
}

// putWrite encodes a write of row r (nil for a delete) into d, which holds
// at least its writeBound, and returns its length. It writes by index into
// room reserved once: growing per field, and a call per short copy, cost
// more than the bytes. The row is copied as it is stored, encoded. The
// common shape (a small table id, keys of 8 to 16 bytes, no clustering
// key, a row of 8 to 16 bytes) takes no call to memmove. Checkpoints, and
// logs written before writes were packed, use this encoding.
func putWrite(d []byte, tableID uint64, pk, ck string, r *row) int {
	var k int
	if tableID < 0x80 && len(pk) < 0x80 && len(ck) < 0x80 {
		d[0], d[1] = byte(tableID), byte(len(pk))
		k = 2 + putString(d, 2, pk)
		d[k] = byte(len(ck))
		k++
	} else {
		k = putUvarint(d, tableID)
		k += putUvarint(d[k:], uint64(len(pk)))
		k += putString(d, k, pk)
		k += putUvarint(d[k:], uint64(len(ck)))
	}
	if len(ck) > 0 {
		k += putString(d, k, ck)
	}
	if r == nil {
		d[k] = 1
		return k + 1
	}
	d[k] = 0
	k++
	return k + putString(d, k, r.enc())
}

// A log entry's writes are packed: each is encoded against the write
// before it in the same entry, whose table it may share and whose
// partition key's first bytes it may repeat (keys of one transaction often
// share a prefix: an integer key's high zero bytes, a text key's common
// start). Checkpoints keep the plain encoding above.
//
//	pwrite = head [uvarint(table id)] uvarint(len pk − shared) pk[shared:]
//	         [uvarint(len ck) ck] [row]
//	head   = shared<<3 | hasCK<<2 | sameTable<<1 | delete
//
// shared (0–31) counts the bytes of the previous write's partition key
// that begin this one's; the first write of an entry has shared 0 and
// sameTable 0. The table id follows unless sameTable is set, the
// clustering key (never empty) only if hasCK is set, and the row only for
// a put. A ycsb-wo transaction's entry shrinks from 312 bytes to about
// 206: its keys, big-endian integers below 10⁶, are 15 bytes encoded, of
// which about 10 repeat. Packing costs the encoder about 20 ns a
// transaction (BenchmarkLogEncode, 74 ns before, 93 after); bench
// engine's throughput with the log did not move, and its log is a third
// smaller.
const (
	packedDelete    = 1
	packedSameTable = 2
	packedHasCK     = 4
	packedShift     = 3
	maxShared       = 0xFF >> packedShift
)

// noTable is the previous table of an entry's first write: it matches no
// table id, so the first write always carries its own.
const noTable = ^uint64(0)

// putPackedWrite encodes a write of row r (nil for a delete) into d, which
// holds at least its writeBound, after a write to prevTable with partition
// key prevPK in the same entry (noTable and "" for the first), and returns
// its length.
func putPackedWrite(d []byte, tableID uint64, pk, ck string, r *row, prevTable uint64, prevPK string) int {
	shared := sharedPrefix(pk, prevPK)
	tail := len(pk) - shared
	if tableID == prevTable && tail < 8 && len(pk) >= 8 && len(ck) == 0 && r != nil {
		// The common shape after an entry's first write: a one-byte head
		// and length, and the key's tail in one word.
		d[0] = byte(shared<<packedShift | packedSameTable)
		d[1] = byte(tail)
		putWordTail(d, 2, pk, tail)
		k := 2 + tail
		return k + putString(d, k, r.enc())
	}
	head := byte(shared << packedShift)
	k := 1
	if tableID == prevTable {
		head |= packedSameTable
	} else {
		k += putUvarint(d[1:], tableID)
	}
	k += putUvarint(d[k:], uint64(tail))
	k += putTail(d, k, pk, tail)
	if len(ck) > 0 {
		head |= packedHasCK
		k += putUvarint(d[k:], uint64(len(ck)))
		k += putString(d, k, ck)
	}
	if r == nil {
		d[0] = head | packedDelete
		return k
	}
	d[0] = head
	return k + putString(d, k, r.enc())
}

// sharedPrefix is the length of the longest common prefix of a and b, at
// most maxShared, compared a word at a time: the last word overlaps the
// one before it rather than ending in a loop over bytes, whose exit at an
// unpredictable byte cost more than the compare.
func sharedPrefix(a, b string) int {
	n := min(len(a), len(b), maxShared)
	if n < 8 {
		i := 0
		for i < n && a[i] == b[i] {
			i++
		}
		return i
	}
	for i := 0; i+8 < n; i += 8 {
		if x := load64(a, i) ^ load64(b, i); x != 0 {
			return i + bits.TrailingZeros64(x)/8
		}
	}
	// The bytes before n-8 are equal: the first that differs is the
	// lowest set byte.
	if x := load64(a, n-8) ^ load64(b, n-8); x != 0 {
		return n - 8 + bits.TrailingZeros64(x)/8
	}
	return n
}

// load64 reads s[i:i+8] as a little-endian word; the caller checks bounds.
func load64(s string, i int) uint64 {
	return *(*uint64)(unsafe.Add(unsafe.Pointer(unsafe.StringData(s)), i))
}

// putTail copies the last n bytes of s to d[k:] and returns n. A tail of
// 1 to 7 bytes of a string of at least 8 is moved as one word, the last 8
// bytes of s shifted down, without a call to memmove; that word's zero
// bytes beyond the tail land in room the bound reserves, and the fields
// after overwrite them.
func putTail(d []byte, k int, s string, n int) int {
	if n == 0 || n >= 8 || len(s) < 8 {
		return putString(d, k, s[len(s)-n:])
	}
	putWordTail(d, k, s, n)
	return n
}

// putWordTail stores the last n (0 to 7) bytes of s, which holds at least
// 8, at d[k:] as one word, followed by 8−n zero bytes that d must have
// room for.
func putWordTail(d []byte, k int, s string, n int) {
	binary.LittleEndian.PutUint64(d[k:], load64(s, len(s)-8)>>(64-8*n))
}

// packedWrite decodes one packed write of a log entry after prev, the
// write before it in the entry (nil for the first); see write for tables
// and ok.
func (d *decoder) packedWrite(prev *logWrite, tables func(uint64) *table) (w logWrite, t *table, ok bool) {
	head := d.byte1("write head")
	shared := int(head >> packedShift)
	switch {
	case d.err != nil:
		return w, nil, false
	case prev == nil && (shared > 0 || head&packedSameTable != 0):
		d.fail("first write of an entry refers to a write before it (head %#x)", head)
		return w, nil, false
	case prev != nil && shared > len(prev.pk):
		d.fail("%d bytes shared with a partition key of %d", shared, len(prev.pk))
		return w, nil, false
	}
	if head&packedSameTable != 0 {
		w.table = prev.table
	} else {
		w.table = d.uvarint("table id")
	}
	tail := d.bytes(d.uvarint("partition key length"), "partition key")
	if shared > 0 {
		w.pk = prev.pk[:shared] + string(tail)
	} else {
		w.pk = string(tail)
	}
	if head&packedHasCK != 0 {
		n := d.uvarint("clustering key length")
		if n == 0 && d.err == nil {
			d.fail("empty clustering key flagged")
		}
		w.ck = string(d.bytes(n, "clustering key"))
	}
	w.del = head&packedDelete != 0
	return d.writeBody(w, tables)
}

// encodedSize is the exact size of cols encoded as a row.
func encodedSize(cols []storage.Value) int {
	n := uvarintLen(uint64(len(cols)))
	for i := range cols {
		n += valueSize(&cols[i])
	}
	return n
}

// valueSize is the exact size of v encoded as a row's column.
func valueSize(v *storage.Value) int {
	t, null, _, s := v.Payload()
	switch {
	case null || t == 0:
		return 1
	case t == storage.TypeText || t == storage.TypeBlob:
		return 1 + uvarintLen(uint64(len(s))) + len(s)
	case t == storage.TypeBoolean:
		return 2
	default:
		return 9
	}
}

// valueEnd returns where the column encoded at enc[k:] ends. enc was
// encoded by putValues, or checked when it was read (see row.values).
func valueEnd(enc string, k int) int {
	switch storage.DataType(enc[k]) {
	case 0:
		return k + 1
	case storage.TypeText, storage.TypeBlob:
		l, m := stringUvarint(enc[k+1:])
		return k + 1 + m + int(l)
	case storage.TypeBoolean:
		return k + 2
	default:
		return k + 9
	}
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// putValues encodes cols into d, which holds at least encodedSize's
// bytes for them, and returns the bytes written.
func putValues(d []byte, cols []storage.Value) int {
	k := 0
	for i := range cols {
		k += putValue(d[k:], &cols[i])
	}
	return k
}

// putValue encodes v into d, which holds at least valueSize's bytes for
// it, and returns the bytes written.
func putValue(d []byte, v *storage.Value) int {
	t, null, bits, s := v.Payload()
	switch {
	case null || t == 0:
		d[0] = 0
		return 1
	case t == storage.TypeText || t == storage.TypeBlob:
		d[0] = byte(t)
		k := 1 + putUvarint(d[1:], uint64(len(s)))
		return k + putString(d, k, s)
	case t == storage.TypeBoolean:
		d[0], d[1] = byte(t), byte(bits)
		return 2
	default: // BIGINT, TIMESTAMP, DOUBLE
		d[0] = byte(t)
		binary.LittleEndian.PutUint64(d[1:], bits)
		return 9
	}
}

// writeBound bounds a write's encoding, plain or packed: varints of at
// most 10 bytes for the table id and 5 for each length (a key or row is
// under 64 MiB), the kind or head, the row, and the word a packed key's
// short tail is stored with (putTail).
func writeBound(pk, ck string, r *row) int {
	n := len(pk) + len(ck) + 32
	if r != nil {
		n += int(r.n)
	}
	return n
}

// putString copies s to d[k:] and returns its length. A string of 8 to 16
// bytes, most keys and many values, is moved as two overlapping 8-byte
// words instead of through a call to memmove; both loads lie within s.
func putString(d []byte, k int, s string) int {
	n := len(s)
	if n < 8 || n > 16 {
		return copy(d[k:], s)
	}
	p := unsafe.Pointer(unsafe.StringData(s))
	binary.LittleEndian.PutUint64(d[k:], *(*uint64)(p))
	binary.LittleEndian.PutUint64(d[k+n-8:], *(*uint64)(unsafe.Add(p, n-8)))
	return n
}

// write decodes one write. tables resolves table ids; a write to a table
// it does not know (dropped since) is decoded and skipped: ok is false.
func (d *decoder) write(tables func(uint64) *table) (w logWrite, t *table, ok bool) {
	w.table = d.uvarint("table id")
	w.pk = string(d.bytes(d.uvarint("partition key length"), "partition key"))
	w.ck = string(d.bytes(d.uvarint("clustering key length"), "clustering key"))
	switch kind := d.byte1("write kind"); {
	case d.err != nil:
		return w, nil, false
	case kind == 1:
		w.del = true
	case kind != 0:
		d.fail("write kind %d", kind)
		return w, nil, false
	}
	return d.writeBody(w, tables)
}

// writeBody decodes the row of a write whose keys and kind are decoded,
// and checks the keys against the table.
func (d *decoder) writeBody(w logWrite, tables func(uint64) *table) (_ logWrite, t *table, ok bool) {
	if d.err != nil {
		return w, nil, false
	}
	t = tables(w.table)
	if !w.del {
		if t == nil {
			d.skipRow()
		} else {
			w.row = d.row(t.schema)
		}
	}
	if d.err != nil || t == nil {
		return w, nil, false
	}
	if len(w.pk) == 0 {
		d.fail("empty partition key")
		return w, nil, false
	}
	if (len(w.ck) == 0) == t.clustered() {
		d.fail("clustering key of %d bytes for table %s.%s", len(w.ck), t.schema.Namespace, t.schema.Name)
		return w, nil, false
	}
	return w, t, true
}

// skipRow steps over a row whose schema is unknown.
func (d *decoder) skipRow() {
	n := d.uvarint("column count")
	if n > uint64(len(d.b)) {
		d.fail("row of %d columns in %d bytes", n, len(d.b))
		return
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		switch tag := storage.DataType(d.byte1("value type")); tag {
		case 0:
		case storage.TypeBoolean:
			d.bytes(1, "boolean")
		case storage.TypeBigInt, storage.TypeTimestamp, storage.TypeDouble:
			d.bytes(8, "number")
		case storage.TypeText, storage.TypeBlob:
			d.bytes(d.uvarint("length"), "bytes")
		default:
			d.fail("value type %d", tag)
		}
	}
}
