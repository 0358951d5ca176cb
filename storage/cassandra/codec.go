package cassandra

import (
	"encoding/binary"
	"fmt"
	"math"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/kiroku-db/kiroku/storage"
)

// This file is the bytes of a value as Cassandra stores it (the CQL
// native protocol's encoding of each column's type), written and read here
// rather than by the driver's reflection so that NULL and an empty TEXT or
// BLOB stay apart on the way in and out, and so that the bytes a server
// returns are checked as strictly as a request:
//
//	kiroku type  CQL type  bytes
//	BOOLEAN      boolean   1 byte, 0 or 1
//	BIGINT       bigint    8 bytes, big-endian two's complement
//	DOUBLE       double    8 bytes, big-endian IEEE-754 (NaN, ±Inf and -0 as they are)
//	TEXT         text      the UTF-8 bytes (none for the empty string)
//	BLOB         blob      the bytes (none for the empty blob)
//	TIMESTAMP    bigint    microseconds since the Unix epoch, as BIGINT
//
// NULL is the protocol's null (length -1), never zero bytes. A TEXT or BLOB
// partition-key column is a CQL blob holding one 0x00 byte and then the
// value's bytes: Cassandra refuses an empty partition key ("Key may not be
// empty"), which kiroku allows.

// pkPrefix leads every TEXT and BLOB partition-key value.
const pkPrefix = 0x00

// cqlType is the CQL type of a column of kiroku type t; pk says whether it
// is a partition-key column.
func cqlType(t storage.DataType, pk bool) string {
	switch t {
	case storage.TypeBoolean:
		return "boolean"
	case storage.TypeBigInt, storage.TypeTimestamp:
		return "bigint"
	case storage.TypeDouble:
		return "double"
	case storage.TypeText:
		if pk {
			return "blob"
		}
		return "text"
	case storage.TypeBlob:
		return "blob"
	}
	panic(fmt.Sprintf("cassandra: no CQL type for %v", t))
}

// encode returns the CQL bytes of v, a value of a column of v's type (a
// checked request has no other); nil for NULL.
func encode(v storage.Value, pk bool) []byte {
	typ, null, bits, s := v.Payload()
	if null || typ == 0 {
		return nil
	}
	switch typ {
	case storage.TypeBoolean:
		return []byte{byte(bits)}
	case storage.TypeBigInt, storage.TypeTimestamp, storage.TypeDouble:
		return binary.BigEndian.AppendUint64(make([]byte, 0, 8), bits)
	case storage.TypeText, storage.TypeBlob:
		if pk {
			b := make([]byte, 0, 1+len(s))
			return append(append(b, pkPrefix), s...)
		}
		return append(make([]byte, 0, len(s)), s...) // never nil: empty is not NULL
	}
	panic(fmt.Sprintf("cassandra: cannot encode %v", v))
}

// decode is the inverse of encode: the value of type t in data, which is
// nil for NULL. It rejects bytes encode never writes (a wrong length, a
// boolean other than 0 or 1, a partition-key value without its prefix) and
// values the storage API never accepts (TEXT that is not UTF-8 or holds
// NUL, a TIMESTAMP out of range), which another writer of the table could
// have stored.
func decode(t storage.DataType, pk bool, data []byte) (storage.Value, error) {
	if data == nil {
		return storage.NullOf(t), nil
	}
	var v storage.Value
	switch t {
	case storage.TypeBoolean:
		if len(data) != 1 || data[0] > 1 {
			return v, fmt.Errorf("cassandra: BOOLEAN of %d bytes %x", len(data), data)
		}
		v = storage.Bool(data[0] == 1)
	case storage.TypeBigInt, storage.TypeTimestamp, storage.TypeDouble:
		if len(data) != 8 {
			return v, fmt.Errorf("cassandra: %v of %d bytes, want 8", t, len(data))
		}
		u := binary.BigEndian.Uint64(data)
		switch t {
		case storage.TypeBigInt:
			v = storage.BigInt(int64(u))
		case storage.TypeTimestamp:
			v = storage.TimestampMicros(int64(u))
		default:
			v = storage.Double(math.Float64frombits(u))
		}
	case storage.TypeText, storage.TypeBlob:
		if pk {
			if len(data) == 0 || data[0] != pkPrefix {
				return v, fmt.Errorf("cassandra: partition-key %v without its 0x%02x prefix", t, pkPrefix)
			}
			data = data[1:]
		}
		if t == storage.TypeText {
			v = storage.Text(string(data))
		} else {
			v = storage.Blob(data)
		}
	default:
		return v, fmt.Errorf("cassandra: cannot decode type %v", t)
	}
	if msg := v.CheckContent(); msg != "" {
		return storage.Value{}, fmt.Errorf("cassandra: stored %v: %s", t, msg)
	}
	return v, nil
}

// arg binds a value to a statement: the driver calls MarshalCQL.
type arg struct {
	v  storage.Value
	pk bool
}

func (a arg) MarshalCQL(gocql.TypeInfo) ([]byte, error) { return encode(a.v, a.pk), nil }

// cell receives one column of a result row: the driver calls UnmarshalCQL
// with the column's bytes (nil for NULL), which do not outlive the call.
type cell struct {
	typ storage.DataType
	pk  bool
	v   storage.Value
}

func (c *cell) UnmarshalCQL(_ gocql.TypeInfo, data []byte) error {
	v, err := decode(c.typ, c.pk, data)
	c.v = v
	return err
}
