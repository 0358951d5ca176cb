package storagetest

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

func testTypes(t *testing.T, open StoreOpener) {
	e := newStoreEnv(t, open)
	tb := itemTable(e)
	p, c := V{"id": i64(1)}, V{"seq": i64(1)}
	roundTrip := func(name string, v storage.Value) {
		t.Helper()
		e.put(tb, p, c, V{name: v})
		row, _ := e.get(tb, p, c, name)
		got := row[name]
		if !got.Equal(v) || got.IsNull() != v.IsNull() {
			t.Fatalf("%s: stored %v, read %v", name, v, got)
		}
		if !v.IsNull() && got.Type() != v.Type() {
			t.Fatalf("%s: stored %v, read type %v", name, v.Type(), got.Type())
		}
	}
	// Empty is not NULL.
	roundTrip("s", txt(""))
	roundTrip("s", storage.Null())
	roundTrip("b", storage.Blob([]byte{}))
	roundTrip("b", storage.Null())
	e.put(tb, p, c, V{"s": txt(""), "b": storage.Blob(nil)})
	row, ok := e.get(tb, p, c, "s", "b")
	if !ok || row["s"].IsNull() || row["b"].IsNull() || row["s"].AsText() != "" || len(row["b"].AsBlob()) != 0 {
		t.Fatalf("empty TEXT/BLOB read back as %v", row)
	}
	// Integer extremes.
	for _, v := range []int64{math.MinInt64, math.MaxInt64, 0, -1} {
		roundTrip("i", i64(v))
	}
	// Doubles: NaN, infinities, extremes, negative zero.
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64, -math.MaxFloat64,
		math.SmallestNonzeroFloat64, 0.1, math.Copysign(0, -1)} {
		roundTrip("d", storage.Double(v))
	}
	// Equal treats -0 as +0; the sign itself must survive too.
	e.put(tb, p, c, V{"d": storage.Double(math.Copysign(0, -1))})
	if row, _ := e.get(tb, p, c, "d"); !math.Signbit(row["d"].AsDouble()) {
		t.Fatalf("-0 read back as %v", row["d"])
	}
	e.put(tb, p, c, V{"d": storage.Double(math.NaN())})
	if row, _ := e.get(tb, p, c, "d"); !math.IsNaN(row["d"].AsDouble()) {
		t.Fatalf("NaN read back as %v", row["d"])
	}
	// Booleans.
	roundTrip("f", storage.Bool(false))
	roundTrip("f", storage.Bool(true))
	// Text: multi-byte UTF-8 of every width.
	roundTrip("s", txt("ascii é ж 漢 😀 \u2028 tab\t nl\n"))
	// Blobs: a 1 MiB random blob, and bytes that are not UTF-8, NUL included.
	rnd := rand.New(rand.NewPCG(1, 2))
	mib := make([]byte, 1<<20)
	for i := range mib {
		mib[i] = byte(rnd.UintN(256))
	}
	roundTrip("b", storage.Blob(mib))
	roundTrip("b", storage.Blob([]byte{0xff, 0xfe, 0x00, 0xc3, 0x28, 0x80}))
	// Timestamps: microsecond precision and the range ends.
	now := time.Date(2026, 11, 21, 12, 34, 56, 123456789, time.UTC)
	e.put(tb, p, c, V{"ts": storage.Timestamp(now)})
	row, _ = e.get(tb, p, c, "ts")
	if got := row["ts"].AsTime(); !got.Equal(now.Truncate(time.Microsecond)) {
		t.Fatalf("timestamp %v read back as %v", now, got)
	}
	roundTrip("ts", storage.Timestamp(storage.MinTimestamp))
	roundTrip("ts", storage.Timestamp(storage.MaxTimestamp))
	roundTrip("ts", storage.TimestampMicros(-1))

	// Key types and their order: BIGINT extremes, TEXT in code point order,
	// BLOB bytewise (non-UTF-8 included), BOOLEAN, TIMESTAMP.
	orderCases := []struct {
		typ  storage.DataType
		vals []storage.Value // ascending
	}{
		{storage.TypeBigInt, []storage.Value{i64(math.MinInt64), i64(-1), i64(0), i64(1), i64(math.MaxInt64)}},
		{storage.TypeText, []storage.Value{txt(""), txt("A"), txt("Z"), txt("a"), txt("aa"), txt("é"), txt("漢"), txt("😀")}},
		{storage.TypeBlob, []storage.Value{storage.Blob([]byte{}), storage.Blob([]byte{0}), storage.Blob([]byte{0, 0}),
			storage.Blob([]byte{0x7f}), storage.Blob([]byte{0x80}), storage.Blob([]byte{0xff}), storage.Blob([]byte{0xff, 0})}},
		{storage.TypeBoolean, []storage.Value{storage.Bool(false), storage.Bool(true)}},
		{storage.TypeTimestamp, []storage.Value{storage.Timestamp(storage.MinTimestamp), storage.TimestampMicros(-1),
			storage.TimestampMicros(0), storage.TimestampMicros(1), storage.Timestamp(storage.MaxTimestamp)}},
	}
	for _, oc := range orderCases {
		name := "order_" + map[storage.DataType]string{storage.TypeBigInt: "int", storage.TypeText: "text",
			storage.TypeBlob: "blob", storage.TypeBoolean: "bool", storage.TypeTimestamp: "ts"}[oc.typ]
		ot := e.table(name, cols(col("p", oc.typ)), []storage.ClusteringColumn{ccol("c", oc.typ, storage.Asc)}, cols(col("n", storage.TypeBigInt)))
		pk := V{"p": oc.vals[len(oc.vals)-1]}
		for i := len(oc.vals) - 1; i >= 0; i-- { // insert in reverse
			e.put(ot, pk, V{"c": oc.vals[i]}, V{"n": i64(int64(i))})
		}
		rows := e.scan(&storage.Scan{Namespace: e.ns, Table: ot.Name, Partition: pk})
		if len(rows) != len(oc.vals) {
			t.Fatalf("%v keys: %d rows, want %d", oc.typ, len(rows), len(oc.vals))
		}
		for i, r := range rows {
			if !r["c"].Equal(oc.vals[i]) || !r["n"].Equal(i64(int64(i))) {
				t.Fatalf("%v keys out of order: row %d = %v, want key %v", oc.typ, i, r, oc.vals[i])
			}
		}
		// Every key can be read back exactly.
		for i, v := range oc.vals {
			row, ok := e.get(ot, pk, V{"c": v}, "n")
			if !ok || !row["n"].Equal(i64(int64(i))) {
				t.Fatalf("%v key %v: got %v %v", oc.typ, v, row, ok)
			}
		}
	}
	// A BLOB key with a NUL and invalid UTF-8 is its own key.
	bt := e.table("blobkey", cols(col("k", storage.TypeBlob)), nil, cols(col("v", storage.TypeText)))
	keys := [][]byte{{0xff, 0x00}, {0xff}, {0xff, 0x00, 0x00}}
	for i, k := range keys {
		e.put(bt, V{"k": storage.Blob(k)}, nil, V{"v": txt(string(rune('a' + i)))})
	}
	for i, k := range keys {
		row, ok := e.get(bt, V{"k": storage.Blob(k)}, nil)
		if !ok || !bytes.Equal(row["k"].AsBlob(), k) || row["v"].AsText() != string(rune('a'+i)) {
			t.Fatalf("blob key %x: %v %v", k, row, ok)
		}
	}
}
