package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/kiroku-db/kiroku/storage"
)

// createKV creates namespace ns holding table t: partition key k BIGINT,
// one value column v of type vt.
func createKV(t *testing.T, db *DB, ns string, vt storage.DataType) {
	t.Helper()
	ctx := t.Context()
	if err := db.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTable(ctx, &storage.Table{Namespace: ns, Name: "t", PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		Columns: []storage.Column{{Name: "v", Type: vt}}}); err != nil {
		t.Fatal(err)
	}
}

func textTable() *table {
	return newTable(1, &storage.Table{Namespace: "n", Name: "t",
		PartitionKey: []storage.Column{{Name: "k", Type: storage.TypeText}}})
}

// TestPartitionHashCollisions: partitions whose keys hash alike take
// successive slots and are told apart by key, also across a growth; a
// scan over the table sees each once.
func TestPartitionHashCollisions(t *testing.T) {
	tb := textTable()
	sh := &tb.parts[7]
	const h = 42 // one hash for all the keys
	var keys []string
	for i := range 40 { // 16 slots grow twice
		keys = append(keys, fmt.Sprint("k", i))
		sh.insertLocked(h, &partition{t: tb, pk: keys[i]})
		sh.insertLocked(uint64(i)<<8|h+1, &partition{t: tb, pk: fmt.Sprint("other", i)})
	}
	for _, k := range keys {
		if p := sh.find(h, k); p == nil || p.pk != k {
			t.Fatalf("find %q among colliding keys: %+v", k, p)
		}
	}
	if p := sh.find(h, "absent"); p != nil {
		t.Fatalf("find of an absent key with a colliding hash: %+v", p)
	}
	if p := sh.find(h+1, "k1"); p != nil {
		t.Fatalf("find under another hash: %+v", p)
	}
	seen := map[string]int{}
	tb.rangeParts(func(p *partition) bool { seen[p.pk]++; return true })
	if len(seen) != 80 {
		t.Fatalf("rangeParts saw %d partitions, want 80", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("rangeParts saw %q %d times", k, n)
		}
	}
}

// TestPartitionMapReadersDuringGrowth: lookups run without a lock while
// inserts grow the shards' tables; a partition whose insert returned is
// always found, and a lookup never returns another key's partition. Run
// it under the race detector.
func TestPartitionMapReadersDuringGrowth(t *testing.T) {
	tb := textTable()
	const n = 20000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	var done atomic.Int64 // keys[:done] are inserted
	var wg sync.WaitGroup
	var failed atomic.Value
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r; done.Load() < n; i++ {
				d := int(done.Load())
				k := keys[i%n]
				p, _, _ := tb.partition(tb.hash(k), k)
				switch {
				case p != nil && p.pk != k:
					failed.Store(fmt.Sprintf("load %q returned %q", k, p.pk))
					return
				case p == nil && i%n < d:
					failed.Store(fmt.Sprintf("load %q: missing after its insert", k))
					return
				}
			}
		}()
	}
	for i, k := range keys {
		if _, created, _ := tb.makePartition(tb.hash(k), k); !created {
			t.Fatalf("makePartition %q: not created", k)
		}
		done.Store(int64(i + 1))
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		t.Fatal(f)
	}
	for _, k := range keys {
		if p, created, _ := tb.makePartition(tb.hash(k), k); created || p.pk != k {
			t.Fatalf("second makePartition %q created %v", k, created)
		}
	}
}

// TestPartitionLayout: a partition fills a 128-byte size class, so it
// starts on a cache line, and a lookup's and a commit's fields sit in that
// first line.
func TestPartitionLayout(t *testing.T) {
	var p partition
	if n := unsafe.Sizeof(p); n <= 112 || n > 128 {
		t.Fatalf("partition is %d bytes, want 113..128 (the 128-byte size class)", n)
	}
	if end := unsafe.Offsetof(p.one) + unsafe.Offsetof(p.one.row) + unsafe.Sizeof(p.one.row); end > 64 {
		t.Fatalf("the record's row pointer ends at byte %d, past the first cache line", end)
	}
	tb := textTable()
	for _, k := range []string{"short", "a key longer than sixteen bytes"} {
		q := newPartition(tb, k)
		inline := unsafe.StringData(q.pk) == &q.inl[0]
		if q.pk != k || inline != (len(k) <= len(q.inl)) {
			t.Fatalf("partition key %q stored as %q, inline %v", k, q.pk, inline)
		}
	}
}

// TestSortByRecord: the write set is put in record-address order, the
// global lock order, on both sides of the insertion-sort cutoff.
func TestSortByRecord(t *testing.T) {
	recs := make([]record, 64)
	for _, n := range []int{0, 1, 2, 10, 24, 25, 64} {
		ws := make([]*writeEntry, n)
		for i := range ws {
			ws[i] = &writeEntry{r: &recs[(i*37+11)%64]}
		}
		sortByRecord(ws)
		for i := 1; i < n; i++ {
			if uintptr(unsafe.Pointer(ws[i-1].r)) >= uintptr(unsafe.Pointer(ws[i].r)) {
				t.Fatalf("%d writes: position %d out of order", n, i)
			}
		}
	}
}

// TestItemOrder: a clustering tree's entries order as their keys do,
// whether the keys differ in the 16 bytes copied beside the record, past
// them, or only in length, with zero bytes anywhere; and a tree built
// from them walks in key order and finds each key.
func TestItemOrder(t *testing.T) {
	keys := []string{"", "\x00", "\x00\x00", "\x01", "a", "a\x00", "a\x00\x00", "a\x01", "ab", "b",
		"0123456789abcdef", "0123456789abcdef\x00", "0123456789abcdef\x01", "0123456789abcdeg",
		"0123456789abcde", "0123456789abcde\x00", "0123456789abcdef0", "0123456789abcdef1",
		"\xff\xff\xff\xff\xff\xff\xff\xff", "\xff\xff\xff\xff\xff\xff\xff\xff\x00", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			b[i] = "\x00\x01ab\xff"[rng.IntN(5)]
		}
		keys = append(keys, string(b))
	}
	for _, x := range keys {
		for _, y := range keys {
			if got, want := itemLess(probe(x), probe(y)), x < y; got != want {
				t.Fatalf("itemLess(%q, %q) = %v, want %v", x, y, got, want)
			}
		}
	}
	p := newPartition(newTable(1, &storage.Table{Namespace: "n", Name: "t",
		PartitionKey:  []storage.Column{{Name: "k", Type: storage.TypeBigInt}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "c", Type: storage.TypeBlob}}}), "p")
	for _, k := range keys {
		p.makeRecord(k)
	}
	want := slices.Compact(slices.Sorted(slices.Values(keys)))
	var got []string
	recs, _ := p.rangeRecords("", "", false, 0, nil)
	for _, r := range recs {
		got = append(got, r.ck)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the tree walks %q, want %q", got, want)
	}
	for _, k := range want {
		if r, _ := p.lookup(k); r == nil || r.ck != k {
			t.Fatalf("lookup(%q) = %v", k, r)
		}
	}
}

// TestRecordKeyInline: a record keeps a clustering key of up to 56 bytes
// in its own allocation, a copy that outlives the caller's bytes, and a
// longer one as given; the two inline sizes fill their size classes.
func TestRecordKeyInline(t *testing.T) {
	if a, b := unsafe.Sizeof(inlineRecord{}), unsafe.Sizeof(longInlineRecord{}); a != 56 || b != 96 {
		t.Fatalf("inline records of %d and %d bytes, want 56 (the 64-byte class) and 96", a, b)
	}
	p := newPartition(textTable(), "p")
	for _, n := range []int{1, 9, 16, 17, 47, 56, 57, 100} {
		buf := []byte(strings.Repeat("k", n))
		ck := unsafe.String(unsafe.SliceData(buf), n)
		r := newRecord(p, ck)
		if r.p != p || r.tid.Load() != tidLatest|tidAbsent {
			t.Fatalf("key of %d bytes: record of partition %p, TID %#x", n, r.p, r.tid.Load())
		}
		var inl *byte
		switch {
		case n <= 16:
			inl = &(*inlineRecord)(unsafe.Pointer(r)).inl[0]
		case n <= 56:
			inl = &(*longInlineRecord)(unsafe.Pointer(r)).inl[0]
		default:
			if unsafe.StringData(r.ck) != unsafe.StringData(ck) {
				t.Fatalf("key of %d bytes copied", n)
			}
			continue
		}
		if unsafe.StringData(r.ck) != inl {
			t.Fatalf("key of %d bytes not inline", n)
		}
		clear(buf) // the caller's bytes change; an inline key must not
		if r.ck != strings.Repeat("k", n) {
			t.Fatalf("key of %d bytes stored as %q", n, r.ck)
		}
	}
}
