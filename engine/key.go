package engine

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kiroku-db/kiroku/storage"
)

// Keys are stored in an order-preserving byte encoding, so that the index
// compares plain strings and a scan's bounds are byte ranges:
//
//   - BOOLEAN: one byte, 0 or 1.
//   - BIGINT and TIMESTAMP: 8 bytes big-endian with the sign bit flipped.
//   - TEXT and BLOB: the bytes with each 0x00 escaped as 0x00 0xFF, then
//     the terminator 0x00 0x01. The terminator sorts below every escaped or
//     ordinary byte, so a string sorts before its extensions, and every
//     column's encoding is self-delimiting.
//   - A DESC column's encoding has every byte inverted, which reverses its
//     order and keeps it self-delimiting.
//
// A key is the concatenation of its columns' encodings. Because each
// column is self-delimiting, the rows whose key begins with some leading
// columns are exactly the keys that begin with those columns' bytes.

// errKeyEncoding is the cause of a stored key that does not decode.
var errKeyEncoding = errors.New("malformed key encoding")

func appendKeyValue(b []byte, v storage.Value, desc bool) []byte {
	start := len(b)
	switch v.Type() {
	case storage.TypeBoolean:
		if v.AsBool() {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	case storage.TypeBigInt:
		b = binary.BigEndian.AppendUint64(b, uint64(v.AsBigInt())^1<<63)
	case storage.TypeTimestamp:
		b = binary.BigEndian.AppendUint64(b, uint64(v.AsMicros())^1<<63)
	case storage.TypeText, storage.TypeBlob:
		s := v.Content()
		for i := 0; i < len(s); i++ {
			if s[i] == 0 {
				b = append(b, 0, 0xFF)
			} else {
				b = append(b, s[i])
			}
		}
		b = append(b, 0, 1)
	default:
		panic(fmt.Sprintf("engine: %v in a key", v.Type()))
	}
	if desc {
		for i := start; i < len(b); i++ {
			b[i] = ^b[i]
		}
	}
	return b
}

// decodeKeyValue decodes one column of type typ from the front of b and
// returns the rest.
func decodeKeyValue(b []byte, typ storage.DataType, desc bool) (storage.Value, []byte, error) {
	var inv byte
	if desc {
		inv = 0xFF
	}
	fixed := func(n int) ([]byte, error) {
		if len(b) < n {
			return nil, errKeyEncoding
		}
		out := make([]byte, n)
		for i := range out {
			out[i] = b[i] ^ inv
		}
		return out, nil
	}
	switch typ {
	case storage.TypeBoolean:
		x, err := fixed(1)
		if err != nil || x[0] > 1 {
			return storage.Value{}, nil, errKeyEncoding
		}
		return storage.Bool(x[0] == 1), b[1:], nil
	case storage.TypeBigInt, storage.TypeTimestamp:
		x, err := fixed(8)
		if err != nil {
			return storage.Value{}, nil, err
		}
		i := int64(binary.BigEndian.Uint64(x) ^ 1<<63)
		if typ == storage.TypeBigInt {
			return storage.BigInt(i), b[8:], nil
		}
		return storage.TimestampMicros(i), b[8:], nil
	case storage.TypeText, storage.TypeBlob:
		var out []byte
		for i := 0; ; i++ {
			if i >= len(b) {
				return storage.Value{}, nil, errKeyEncoding
			}
			c := b[i] ^ inv
			if c != 0 {
				out = append(out, c)
				continue
			}
			if i+1 >= len(b) {
				return storage.Value{}, nil, errKeyEncoding
			}
			switch b[i+1] ^ inv {
			case 0xFF:
				out = append(out, 0)
				i++
			case 1:
				rest := b[i+2:]
				if typ == storage.TypeText {
					return storage.Text(string(out)), rest, nil
				}
				return storage.Blob(out), rest, nil
			default:
				return storage.Value{}, nil, errKeyEncoding
			}
		}
	}
	return storage.Value{}, nil, errKeyEncoding
}

// prefixEnd returns the smallest string greater than every string that
// begins with p, or "" if there is none (p is all 0xFF).
func prefixEnd(p []byte) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] != 0xFF {
			out := append([]byte(nil), p[:i+1]...)
			out[i]++
			return string(out)
		}
	}
	return ""
}
