package engine

import (
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kiroku-db/kiroku/storage"
)

// fuzzDB is an engine without a log holding two tables, one clustered,
// for feeding decoders.
func fuzzDB(t testing.TB) *DB {
	db, err := Open(Config{Dir: "/f", FS: vfs.NewMem(), Log: LogNone, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := t.Context()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(db.CreateNamespace(ctx, "f"))
	must(db.CreateTable(ctx, &storage.Table{Namespace: "f", Name: "a", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeText}, {Name: "d", Type: storage.TypeDouble}}}))
	must(db.CreateTable(ctx, &storage.Table{Namespace: "f", Name: "b", PartitionKey: []storage.Column{{Name: "p", Type: storage.TypeText}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "c", Type: storage.TypeBlob, Order: storage.Desc}, {Name: "e", Type: storage.TypeBoolean}},
		Columns:       []storage.Column{{Name: "x", Type: storage.TypeBlob}}}))
	return db
}

// validWrites are writes to both tables of fuzzDB: two to table a whose
// encoded keys share their first bytes, one to table b with a clustering
// key, and a delete.
func validWrites(db *DB) []writeEntry {
	a, _ := db.cat.lookup("", "f", "a")
	b, _ := db.cat.lookup("", "f", "b")
	return []writeEntry{
		{wkey: wkey{t: a, pk: a.encodePartition(storage.Values{"k": storage.BigInt(-7)})},
			out: newRow([]storage.Value{storage.Text("héllo"), storage.Double(1.5)})},
		{wkey: wkey{t: a, pk: a.encodePartition(storage.Values{"k": storage.BigInt(-9)})},
			out: newRow([]storage.Value{storage.Text("x"), storage.NullOf(storage.TypeDouble)})},
		{wkey: wkey{t: b, pk: b.encodePartition(storage.Values{"p": storage.Text("p\x01")}),
			ck: b.encodeClustering(storage.Values{"c": storage.Blob([]byte{0, 1, 0xFF}), "e": storage.Bool(true)})},
			out: newRow([]storage.Value{storage.NullOf(storage.TypeBlob)})},
		{wkey: wkey{t: a, pk: a.encodePartition(storage.Values{"k": storage.BigInt(9)})}},
	}
}

// validBuffer is a well-formed log buffer of epoch 3 holding validWrites
// in one entry, packed as the engine logs them: the seed of the fuzzers.
func validBuffer(db *DB) []byte {
	ws := validWrites(db)
	return oneEntryBuffer(recBuffer, len(ws), func(buf []byte, i int) []byte {
		var prev *writeEntry
		if i > 0 {
			prev = &ws[i-1]
		}
		return appendPackedWrite(buf, &ws[i], prev)
	})
}

// plainBuffer is the same buffer as logs written before writes were
// packed hold it.
func plainBuffer(db *DB) []byte {
	ws := validWrites(db)
	return oneEntryBuffer(recPlainBuffer, len(ws), func(buf []byte, i int) []byte {
		return appendWrite(buf, ws[i].t.id, ws[i].pk, ws[i].ck, ws[i].out)
	})
}

// oneEntryBuffer is a buffer record of kind and epoch 3 holding one entry
// of n writes, each appended by add.
func oneEntryBuffer(kind byte, n int, add func(buf []byte, i int) []byte) []byte {
	buf := binary.AppendUvarint([]byte{kind}, 3)
	buf = binary.LittleEndian.AppendUint64(buf, makeTID(3, 1))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(n))
	for i := range n {
		buf = add(buf, i)
	}
	return buf
}

// TestValidBufferApplies applies both layouts of the same buffer and
// reads back every write.
func TestValidBufferApplies(t *testing.T) {
	for name, enc := range map[string]func(*DB) []byte{"packed": validBuffer, "plain": plainBuffer} {
		db := fuzzDB(t)
		if err := db.applyBuffer(enc(db)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		get := func(tb string, part, cl storage.Values) (storage.Row, bool) {
			row, ok, err := db.Get(t.Context(), &storage.Get{Namespace: "f", Table: tb, Partition: part, Clustering: cl})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return row, ok
		}
		if row, ok := get("b", storage.Values{"p": storage.Text("p\x01")},
			storage.Values{"c": storage.Blob([]byte{0, 1, 0xFF}), "e": storage.Bool(true)}); !ok || !row["x"].IsNull() {
			t.Fatalf("%s: table b holds %v %v", name, row, ok)
		}
		if row, ok := get("a", storage.Values{"k": storage.BigInt(-7)}, nil); !ok || row["v"].AsText() != "héllo" || row["d"].AsDouble() != 1.5 {
			t.Fatalf("%s: key -7 holds %v %v", name, row, ok)
		}
		if row, ok := get("a", storage.Values{"k": storage.BigInt(-9)}, nil); !ok || row["v"].AsText() != "x" || !row["d"].IsNull() {
			t.Fatalf("%s: key -9 holds %v %v", name, row, ok)
		}
		if _, ok := get("a", storage.Values{"k": storage.BigInt(9)}, nil); ok {
			t.Fatalf("%s: deleted key 9 is present", name)
		}
	}
}

// FuzzApplyBuffer feeds arbitrary bytes to the log-record decoder used by
// recovery, in both layouts: it must return an error or apply, never
// panic.
func FuzzApplyBuffer(f *testing.F) {
	db := fuzzDB(f)
	f.Add(validBuffer(db))
	f.Add(plainBuffer(db))
	f.Add(markRecord(0, 5))
	f.Add([]byte{recBuffer})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil || r.kind != recBuffer && r.kind != recPlainBuffer {
			return
		}
		_ = db.applyBuffer(b)
	})
}

// FuzzCheckpointEntries does the same for checkpoint chunks.
func FuzzCheckpointEntries(f *testing.F) {
	db := fuzzDB(f)
	a, _ := db.cat.lookup("", "f", "a")
	entry := binary.LittleEndian.AppendUint64(nil, makeTID(2, 5))
	entry = appendWrite(entry, a.id, a.encodePartition(storage.Values{"k": storage.BigInt(1)}), "",
		newRow([]storage.Value{storage.Text("x"), storage.NullOf(storage.TypeDouble)}))
	if n, err := db.applyEntries(entry, 0, true); n != 1 || err != nil {
		f.Fatalf("the seed entry does not apply: %d, %v", n, err)
	}
	f.Add(entry)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = db.applyEntries(b, 0, true)
	})
}

// FuzzRowDecode: a row the decoder accepts is stored and later decoded
// without checks (row.values), so whatever it accepts must decode to one
// value per column, of the column's type, that re-encode and decode to
// the same values.
func FuzzRowDecode(f *testing.F) {
	db := fuzzDB(f)
	a, _ := db.cat.lookup("", "f", "a")
	b, _ := db.cat.lookup("", "f", "b")
	f.Add(newRow([]storage.Value{storage.Text("héllo"), storage.Double(1.5)}).enc())
	f.Add(newRow([]storage.Value{storage.Blob([]byte{0, 1})}).enc())
	f.Fuzz(func(t *testing.T, enc string) {
		for _, tb := range []*table{a, b} {
			d := decoder{b: []byte(enc)}
			r := d.row(tb.schema)
			if d.err != nil {
				continue
			}
			vals := r.values(tb)
			if len(vals) != len(tb.schema.Columns) {
				t.Fatalf("%d values for %d columns", len(vals), len(tb.schema.Columns))
			}
			for i, v := range vals {
				if v.Type() != tb.schema.Columns[i].Type {
					t.Fatalf("column %d holds %v", i, v.Type())
				}
			}
			again := newRow(vals).values(tb)
			for i := range vals {
				if !again[i].Equal(vals[i]) || again[i].IsNull() != vals[i].IsNull() {
					t.Fatalf("column %d: %v, then %v", i, vals[i], again[i])
				}
			}
		}
	})
}

// FuzzKeyDecode checks that a stored key decodes without panicking and
// that whatever decodes re-encodes to the same bytes.
func FuzzKeyDecode(f *testing.F) {
	db := fuzzDB(f)
	b, _ := db.cat.lookup("", "f", "b")
	f.Add([]byte(b.encodeClustering(storage.Values{"c": storage.Blob([]byte{0, 1}), "e": storage.Bool(false)})))
	f.Fuzz(func(t *testing.T, key []byte) {
		vals, err := b.decodeClustering(string(key))
		if err != nil {
			return
		}
		again := b.encodeClustering(storage.Values{"c": vals[0], "e": vals[1]})
		if again != string(key) {
			t.Fatalf("%x decodes to %v, which encodes to %x", key, vals, again)
		}
	})
}

// TestApplyRefusesBadPartitionKey: a recovered write whose partition key
// does not decode is malformed and creates no partition; one that does
// is installed.
func TestApplyRefusesBadPartitionKey(t *testing.T) {
	db := fuzzDB(t)
	a, _ := db.cat.lookup("", "f", "a")
	write := func(pk string) []byte {
		e := binary.LittleEndian.AppendUint64(nil, makeTID(2, 5))
		return appendWrite(e, a.id, pk, "", newRow([]storage.Value{storage.Text("x"), storage.NullOf(storage.TypeDouble)}))
	}
	bad := "\x00\x01\x02" // a BIGINT key is 8 bytes
	if n, err := db.applyEntries(write(bad), 0, true); err == nil {
		t.Fatalf("a 3-byte BIGINT partition key applied (%d entries)", n)
	}
	if p := a.shardOf(a.hash(bad)).find(a.hash(bad), bad); p != nil {
		t.Fatal("the refused write created its partition")
	}
	good := a.encodePartition(storage.Values{"k": storage.BigInt(7)})
	if n, err := db.applyEntries(write(good), 0, true); n != 1 || err != nil {
		t.Fatalf("a well-formed write: %d, %v", n, err)
	}
	if p := a.shardOf(a.hash(good)).find(a.hash(good), good); p == nil {
		t.Fatal("the applied write has no partition")
	}
}
