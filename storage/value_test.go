package storage

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
	"time"
)

func TestCompareOrder(t *testing.T) {
	// Each list is strictly ascending.
	lists := [][]Value{
		{Bool(false), Bool(true)},
		{BigInt(math.MinInt64), BigInt(-1), BigInt(0), BigInt(math.MaxInt64)},
		{Double(math.Inf(-1)), Double(-math.MaxFloat64), Double(-1), Double(0), Double(math.SmallestNonzeroFloat64),
			Double(math.MaxFloat64), Double(math.Inf(1)), Double(math.NaN())},
		{Text(""), Text("A"), Text("a"), Text("é"), Text("😀")},
		{Blob(nil), Blob([]byte{0}), Blob([]byte{0x7f}), Blob([]byte{0x80}), Blob([]byte{0xff})},
		{Timestamp(MinTimestamp), TimestampMicros(0), Timestamp(MaxTimestamp)},
	}
	for _, l := range lists {
		for i := range l {
			for j := range l {
				want := 0
				if i < j {
					want = -1
				} else if i > j {
					want = 1
				}
				if got := Compare(l[i], l[j]); got != want {
					t.Errorf("Compare(%v, %v) = %d, want %d", l[i], l[j], got, want)
				}
			}
		}
	}
	if Compare(Double(math.NaN()), Double(math.NaN())) != 0 || !Double(math.NaN()).Equal(Double(math.NaN())) {
		t.Error("NaN must equal NaN")
	}
	if !Double(math.Copysign(0, -1)).Equal(Double(0)) {
		t.Error("-0 must equal +0")
	}
}

func TestValueBasics(t *testing.T) {
	if !(Value{}).IsNull() || !Null().IsNull() || !NullOf(TypeText).IsNull() || Text("").IsNull() || Blob(nil).IsNull() {
		t.Fatal("NULL-ness is wrong")
	}
	if !Null().Equal(NullOf(TypeBigInt)) || NullOf(TypeText).Equal(NullOf(TypeBigInt)) || Text("").Equal(Blob(nil)) {
		t.Fatal("Equal across NULL and types is wrong")
	}
	ts := time.Date(2020, 1, 2, 3, 4, 5, 6789, time.FixedZone("x", 3600))
	if got := Timestamp(ts).AsTime(); !got.Equal(ts.Truncate(time.Microsecond)) || got.Location() != time.UTC {
		t.Fatalf("Timestamp round trip: %v", got)
	}
	b := []byte{1, 2}
	v := Blob(b)
	b[0] = 9
	if v.AsBlob()[0] != 1 {
		t.Fatal("Blob must copy its argument")
	}
	for _, c := range []struct {
		v    Value
		size int
	}{{Text("héllo"), 6}, {Blob(make([]byte, 10)), 10}, {BigInt(1), 8}, {Bool(true), 1}, {Null(), 0}, {TimestampMicros(1), 8}} {
		if c.v.Size() != c.size {
			t.Errorf("Size(%v) = %d, want %d", c.v, c.v.Size(), c.size)
		}
	}
	for _, c := range []struct {
		v   Value
		bad bool
	}{{Text("ok"), false}, {Text("\xff"), true}, {Text("a\x00"), true}, {Blob([]byte{0xff, 0}), false},
		{TimestampMicros(MaxTimestamp.UnixMicro() + 1), true}, {TimestampMicros(MinTimestamp.UnixMicro() - 1), true},
		{Timestamp(time.Date(586524, 1, 1, 0, 0, 0, 0, time.UTC)), true}, {Timestamp(time.Date(-300000, 1, 1, 0, 0, 0, 0, time.UTC)), true},
		{Timestamp(MaxTimestamp), false}, {Timestamp(MinTimestamp), false}} {
		if (c.v.checkContent() != "") != c.bad {
			t.Errorf("checkContent(%v) = %q, want bad=%v", c.v, c.v.checkContent(), c.bad)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("reading a BIGINT as TEXT must panic")
		}
	}()
	_ = BigInt(1).AsText()
}

func TestValuePayload(t *testing.T) {
	type parts struct {
		t    DataType
		null bool
		bits uint64
		s    string
	}
	for _, c := range []struct {
		v    Value
		want parts
	}{
		{Null(), parts{0, true, 0, ""}},
		{NullOf(TypeText), parts{TypeText, true, 0, ""}},
		{Bool(true), parts{TypeBoolean, false, 1, ""}},
		{Bool(false), parts{TypeBoolean, false, 0, ""}},
		{BigInt(-2), parts{TypeBigInt, false, math.MaxUint64 - 1, ""}},
		{TimestampMicros(7), parts{TypeTimestamp, false, 7, ""}},
		{Double(-0.5), parts{TypeDouble, false, math.Float64bits(-0.5), ""}},
		{Text("héllo"), parts{TypeText, false, 0, "héllo"}},
		{Blob([]byte{0, 0xff}), parts{TypeBlob, false, 0, "\x00\xff"}},
	} {
		var got parts
		got.t, got.null, got.bits, got.s = c.v.Payload()
		if got != c.want {
			t.Errorf("Payload(%v) = %+v, want %+v", c.v, got, c.want)
		}
	}
}

func TestTableJSONRoundTrip(t *testing.T) {
	tb := &Table{Namespace: "ns", Name: "t",
		PartitionKey:  []Column{{"p", TypeText}},
		ClusteringKey: []ClusteringColumn{{"c", TypeTimestamp, Desc}, {"d", TypeBlob, Asc}},
		Columns:       []Column{{"a", TypeBoolean}, {"b", TypeDouble}, {"n", TypeBigInt}}}
	if err := tb.Validate(); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(tb)
	if err != nil {
		t.Fatal(err)
	}
	var back Table
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(tb) {
		t.Fatalf("round trip: %s gave %+v", data, back)
	}
	if got := tb.ColumnNames(); !slices.Equal(got, []string{"p", "c", "d", "a", "b", "n"}) {
		t.Fatalf("ColumnNames = %v", got)
	}
}

// FuzzTableJSON feeds arbitrary bytes to the schema decoder, as a corrupt
// metadata row would: it must never panic, and whatever Validate accepts
// must survive a round trip.
func FuzzTableJSON(f *testing.F) {
	f.Add([]byte(`{"namespace":"ns","name":"t","partition_key":[{"name":"k","type":"BIGINT"}]}`))
	f.Add([]byte(`{"namespace":"ns","name":"t","partition_key":[{"name":"k","type":"TEXT"}],"clustering_key":[{"name":"c","type":"BLOB","order":"DESC"}],"columns":[{"name":"v","type":"DOUBLE"}]}`))
	f.Add([]byte(`{"partition_key":[{"type":"NOPE"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var tb Table
		if json.Unmarshal(data, &tb) != nil || tb.Validate() != nil {
			return
		}
		again, err := json.Marshal(&tb)
		if err != nil {
			t.Fatalf("valid table does not encode: %v", err)
		}
		var back Table
		if err := json.Unmarshal(again, &back); err != nil || !back.Equal(&tb) {
			t.Fatalf("round trip failed: %v", err)
		}
	})
}
