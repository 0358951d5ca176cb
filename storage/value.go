package storage

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// DataType is the type of a column.
type DataType uint8

// The column types. The zero DataType is invalid.
const (
	TypeBoolean   DataType = iota + 1 // true or false
	TypeBigInt                        // signed 64-bit integer
	TypeDouble                        // IEEE-754 binary64, NaN and ±Inf included
	TypeText                          // valid UTF-8 without NUL (U+0000)
	TypeBlob                          // arbitrary bytes
	TypeTimestamp                     // an instant, microsecond precision, years 0001–9999 UTC
)

var typeNames = [...]string{"", "BOOLEAN", "BIGINT", "DOUBLE", "TEXT", "BLOB", "TIMESTAMP"}

func (t DataType) String() string {
	if t > 0 && int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("DataType(%d)", uint8(t))
}

// Valid reports whether t is one of the declared types.
func (t DataType) Valid() bool { return t >= TypeBoolean && t <= TypeTimestamp }

// MarshalText encodes the type by name, so schemas stored as JSON are readable.
func (t DataType) MarshalText() ([]byte, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("storage: cannot encode %v", t)
	}
	return []byte(t.String()), nil
}

// UnmarshalText is the inverse of MarshalText.
func (t *DataType) UnmarshalText(b []byte) error {
	for i := TypeBoolean; i <= TypeTimestamp; i++ {
		if strings.EqualFold(string(b), typeNames[i]) {
			*t = i
			return nil
		}
	}
	return fmt.Errorf("storage: unknown data type %q", b)
}

// Timestamp bounds: the range every backend can store exactly.
var (
	MinTimestamp = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTimestamp = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
)

// Value is one typed cell, or NULL. The zero Value is an untyped NULL.
// Values are immutable: Blob copies its argument and Bytes returns a copy.
type Value struct {
	typ  DataType
	null bool
	// i is BIGINT; TIMESTAMP as microseconds since the Unix epoch; BOOLEAN
	// as 0/1; DOUBLE as its IEEE-754 bits (one word for both keeps a Value
	// at 32 bytes, which rows and maps of values hold by the million).
	i int64
	s string // TEXT and BLOB
}

// Bool, BigInt, Double, Text, Blob and Timestamp make non-NULL values.
func Bool(b bool) Value {
	v := Value{typ: TypeBoolean}
	if b {
		v.i = 1
	}
	return v
}

func BigInt(i int64) Value   { return Value{typ: TypeBigInt, i: i} }
func Double(f float64) Value { return Value{typ: TypeDouble, i: int64(math.Float64bits(f))} }
func Text(s string) Value    { return Value{typ: TypeText, s: s} }
func Blob(b []byte) Value    { return Value{typ: TypeBlob, s: string(b)} }

// BlobString makes a BLOB value of the bytes of s, without copying them.
func BlobString(s string) Value { return Value{typ: TypeBlob, s: s} }

// Timestamp makes a TIMESTAMP value. It truncates t to microseconds, the
// precision every backend stores; times outside [MinTimestamp, MaxTimestamp]
// are rejected with ErrInvalidValue when the value is written.
func Timestamp(t time.Time) Value {
	// UnixMicro wraps around far outside the range; clamp first so such a
	// time stays out of range (and is rejected) instead of becoming 1969.
	switch {
	case t.Before(MinTimestamp):
		return Value{typ: TypeTimestamp, i: math.MinInt64}
	case t.After(MaxTimestamp):
		return Value{typ: TypeTimestamp, i: math.MaxInt64}
	}
	return Value{typ: TypeTimestamp, i: t.Truncate(time.Microsecond).UnixMicro()}
}

// TimestampMicros makes a TIMESTAMP from microseconds since the Unix epoch.
func TimestampMicros(us int64) Value { return Value{typ: TypeTimestamp, i: us} }

// Null is an untyped NULL, accepted for any value column.
func Null() Value { return Value{null: true} }

// NullOf is a NULL of type t, as reads return it.
func NullOf(t DataType) Value { return Value{typ: t, null: true} }

// Payload returns v's parts for an encoder that reads values in place
// (a copy of a Value costs more than the encoding of a small one): its
// type, whether it is NULL, and its content, as bits for BOOLEAN (0 or 1),
// BIGINT, TIMESTAMP (microseconds) and DOUBLE (IEEE-754), or as s for TEXT
// and BLOB.
func (v *Value) Payload() (t DataType, null bool, bits uint64, s string) {
	return v.typ, v.null, uint64(v.i), v.s
}

// Type is the value's type; 0 for an untyped NULL.
func (v Value) Type() DataType { return v.typ }

// IsNull reports whether v is NULL (typed or not). The zero Value is NULL.
func (v Value) IsNull() bool { return v.null || v.typ == 0 }

// AsBool, AsBigInt, ... return the content; they panic if the type differs,
// like a failed type assertion, because that is a bug in the caller.
func (v Value) AsBool() bool      { v.must(TypeBoolean); return v.i != 0 }
func (v Value) AsBigInt() int64   { v.must(TypeBigInt); return v.i }
func (v Value) AsDouble() float64 { v.must(TypeDouble); return v.double() }
func (v Value) AsText() string    { v.must(TypeText); return v.s }
func (v Value) AsBlob() []byte    { v.must(TypeBlob); return []byte(v.s) }
func (v Value) AsTime() time.Time { v.must(TypeTimestamp); return time.UnixMicro(v.i).UTC() }
func (v Value) AsMicros() int64   { v.must(TypeTimestamp); return v.i }
func (v Value) must(t DataType) {
	if v.typ != t || v.null {
		panic(fmt.Sprintf("storage: %v read as %v", v, t))
	}
}

// Size is the number of bytes the value counts against the size limits:
// the length of TEXT and BLOB, 8 for BIGINT, DOUBLE and TIMESTAMP, 1 for
// BOOLEAN, 0 for NULL.
func (v Value) Size() int {
	switch {
	case v.IsNull():
		return 0
	case v.typ == TypeText || v.typ == TypeBlob:
		return len(v.s)
	case v.typ == TypeBoolean:
		return 1
	default:
		return 8
	}
}

// Equal reports whether a and b are the same value: same type and content,
// with DOUBLE compared as Compare does (NaN equals NaN, -0 equals +0).
// Two NULLs of the same type are equal.
func (a Value) Equal(b Value) bool {
	if a.IsNull() || b.IsNull() {
		return a.IsNull() && b.IsNull() && (a.typ == b.typ || a.typ == 0 || b.typ == 0)
	}
	return a.typ == b.typ && Compare(a, b) == 0
}

// Compare orders two non-NULL values of the same type, the order scans and
// conditions use on every backend: false < true; integers and timestamps
// numerically; DOUBLE numerically with -Inf < finite < +Inf < NaN, NaN equal
// to NaN and -0 equal to +0 (PostgreSQL's order); TEXT and BLOB bytewise
// (for TEXT that is Unicode code point order). It panics on NULL or mixed
// types, which validation rules out before any comparison.
func Compare(a, b Value) int {
	if a.IsNull() || b.IsNull() || a.typ != b.typ {
		panic(fmt.Sprintf("storage: Compare(%v, %v)", a, b))
	}
	switch a.typ {
	case TypeDouble:
		af, bf := a.double(), b.double()
		an, bn := math.IsNaN(af), math.IsNaN(bf)
		switch {
		case an && bn:
			return 0
		case an:
			return 1
		case bn:
			return -1
		}
		return cmp.Compare(af, bf)
	case TypeText, TypeBlob:
		return strings.Compare(a.s, b.s)
	default:
		return cmp.Compare(a.i, b.i)
	}
}

// double is a DOUBLE's number, from its bits.
func (v Value) double() float64 { return math.Float64frombits(uint64(v.i)) }

// String formats the value for messages and debugging.
func (v Value) String() string {
	if v.IsNull() {
		return "NULL"
	}
	switch v.typ {
	case TypeBoolean:
		return fmt.Sprint(v.i != 0)
	case TypeBigInt:
		return fmt.Sprint(v.i)
	case TypeDouble:
		return fmt.Sprint(v.double())
	case TypeText:
		return fmt.Sprintf("%q", v.s)
	case TypeBlob:
		if len(v.s) > 32 {
			return fmt.Sprintf("0x%x…(%d bytes)", v.s[:32], len(v.s))
		}
		return fmt.Sprintf("0x%x", v.s)
	case TypeTimestamp:
		return v.AsTime().Format(time.RFC3339Nano)
	}
	return "invalid"
}

// Content returns the bytes of a TEXT or BLOB value as a string, without
// copying; "" for other types and NULL.
func (v Value) Content() string { return v.s }

// CheckContent says why no backend could store v faithfully (TEXT that is
// not UTF-8 or holds NUL, a TIMESTAMP out of range), or "" if it can.
// Decoders of stored bytes use it to reject values the API never accepts.
func (v Value) CheckContent() string { return v.checkContent() }

// checkContent rejects values no backend can store faithfully.
func (v Value) checkContent() string {
	if v.IsNull() {
		return ""
	}
	switch v.typ {
	case TypeText:
		if !utf8.ValidString(v.s) {
			return "TEXT must be valid UTF-8 (use BLOB for arbitrary bytes)"
		}
		if strings.IndexByte(v.s, 0) >= 0 {
			return "TEXT must not contain NUL (U+0000)"
		}
	case TypeTimestamp:
		if v.i < MinTimestamp.UnixMicro() || v.i > MaxTimestamp.UnixMicro() {
			return "TIMESTAMP outside years 0001-9999 UTC"
		}
	}
	return ""
}
