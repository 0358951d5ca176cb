package engine

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/google/btree"

	"github.com/kiroku-db/kiroku/storage"
)

// record is one row's slot in the index. Its TID word guards row: a reader
// loads tid, row, tid and keeps the pair only if both loads of tid agree
// and were unlocked. row is immutable once stored; a committing writer
// stores a new one while holding the lock bit.
type record struct {
	tid atomic.Uint64
	row atomic.Pointer[row]
	ck  string // encoded clustering key ("" without one)
	p   *partition
}

// row holds the value columns of a row, in schema order, encoded as the
// log encodes them (codec.go: a count, then each value's tag and
// payload). A row is immutable once built.
//
// An encoded row takes less memory than values (no 32-byte value per
// column, no separate string per TEXT or BLOB): on a ledger of a million
// assets the live heap was a quarter to two fifths smaller. The log and
// checkpoints copy the encoding as it is; a read decodes it (values,
// decodeInto), its strings pointing into it.
//
// A row is one allocation without pointers: its length, then its bytes
// (allocRow), which the collector marks without scanning. A struct
// holding the encoding as a string was a second object per row, with a
// pointer to scan, on every collection for as long as the row lived.
type row struct {
	n uint32 // the encoding's length; its bytes follow
}

// allocRow returns a row of n bytes (at least one: a row's encoding
// starts with its column count) and those bytes, for the caller to fill
// before the row is shared. The allocation is of words, so that the row's
// length is aligned and the object holds no pointers.
func allocRow(n int) (*row, []byte) {
	words := make([]uint32, 1+(n+3)/4)
	words[0] = uint32(n)
	return (*row)(unsafe.Pointer(&words[0])), unsafe.Slice((*byte)(unsafe.Pointer(&words[1])), n)
}

// enc is the row's encoding; strings taken from it keep the row alive.
func (r *row) enc() string {
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(r), unsafe.Sizeof(*r))), r.n)
}

// noColumns is the row of a table whose columns are all in its key (the
// Validator's index of unvalidated transactions): rows are immutable, so
// all of them share this one instead of each being an object of its own.
var noColumns = func() *row {
	r, b := allocRow(1)
	b[0] = 0 // a count of zero
	return r
}()

// newRow encodes cols into a row.
func newRow(cols []storage.Value) *row {
	if len(cols) == 0 {
		return noColumns
	}
	r, b := allocRow(encodedSize(cols))
	k := putUvarint(b, uint64(len(cols)))
	putValues(b[k:], cols)
	return r
}

// mergeRow builds the row that overlays the set columns of cols on base
// (nil: a new row, all NULL), as newRow(merge(...)) would, but copies
// base's other columns as they are encoded. Decoding them into values and
// encoding them again cost a partial Put (the Validator's outcome stamps
// half the columns of a row of sixteen) two slices of values and the work
// of both, with the write's locks held.
func mergeRow(base *row, cols []storage.Value, set []bool) *row {
	if len(cols) == 0 {
		return noColumns
	}
	// A row has its table's columns, as cols does: the decoder checks the
	// count of every row it reads, and newRow encodes a whole schema's.
	var enc string
	start := 0
	if base != nil {
		enc = base.enc()
		_, start = stringUvarint(enc)
	}
	// A column's bytes in base run from k to colEnd(k); with no base, to k.
	colEnd := func(k int) int {
		if enc == "" {
			return k
		}
		return valueEnd(enc, k)
	}
	size, k := uvarintLen(uint64(len(cols))), start
	for i := range cols {
		end := colEnd(k)
		switch {
		case set[i]:
			size += valueSize(&cols[i])
		case enc != "":
			size += end - k
		default:
			size++ // NULL
		}
		k = end
	}
	r, b := allocRow(size)
	j := putUvarint(b, uint64(len(cols)))
	k = start
	for i := range cols {
		end := colEnd(k)
		switch {
		case set[i]:
			j += putValue(b[j:], &cols[i])
		case enc != "":
			j += copy(b[j:], enc[k:end])
		default:
			b[j] = 0 // NULL
			j++
		}
		k = end
	}
	return r
}

// values decodes the row's columns for table t. The row was encoded by
// newRow, or checked by the decoder when it was read from a log or a
// checkpoint, so it decodes without checks. TEXT and BLOB values share
// the row's bytes.
func (r *row) values(t *table) []storage.Value {
	n, _ := stringUvarint(r.enc())
	return r.decodeInto(t, make([]storage.Value, n))
}

// decodeInto decodes the row into out, which has room for its columns.
func (r *row) decodeInto(t *table, out []storage.Value) []storage.Value {
	s := r.enc()
	n, k := stringUvarint(s)
	out = out[:n]
	for i := range out {
		tag := storage.DataType(s[k])
		k++
		switch tag {
		case 0:
			out[i] = storage.NullOf(t.schema.Columns[i].Type)
		case storage.TypeText, storage.TypeBlob:
			l, m := stringUvarint(s[k:])
			k += m
			if tag == storage.TypeText {
				out[i] = storage.Text(s[k : k+int(l)])
			} else {
				out[i] = storage.BlobString(s[k : k+int(l)])
			}
			k += int(l)
		case storage.TypeBoolean:
			out[i] = storage.Bool(s[k] == 1)
			k++
		default:
			bits := binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[k:]), 8))
			switch tag {
			case storage.TypeBigInt:
				out[i] = storage.BigInt(int64(bits))
			case storage.TypeTimestamp:
				out[i] = storage.TimestampMicros(int64(bits))
			default:
				out[i] = storage.Double(math.Float64frombits(bits))
			}
			k += 8
		}
	}
	return out
}

// stringUvarint decodes a uvarint at the start of s (valid: see values).
func stringUvarint(s string) (uint64, int) {
	var v uint64
	for i := 0; ; i++ {
		c := s[i]
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1
		}
	}
}

// partition is the rows sharing a partition key. A table without a
// clustering key has exactly one record per partition, one; otherwise the
// records sit in cl's B-tree ordered by encoded clustering key. ver
// changes whenever a record is added to or unlinked from the tree: a scan
// or an absent read validates against it, the way Silo validates Masstree
// node versions.
//
// The layout is for a lookup's cache misses: the struct is padded to 128
// bytes, so the allocator gives it a 128-byte, line-aligned slot (in the
// 96-byte size class, two of every three would straddle lines), and its
// first line holds what a lookup and a commit of a table without
// clustering key touch: the key (header and, when it fits, bytes), cl's
// nil check and the record's TID word and row.
type partition struct {
	pk  string        // encoded partition key, in inl if it fits
	cl  *clustering   // nil for a table without clustering key
	inl [16]byte      // pk's bytes when they fit
	one record        // the record of a table without clustering key
	t   *table        //
	ver atomic.Uint64 // bumped by every insert into cl's tree
	_   [32]byte      // the 128-byte size class
}

// clustering is a partition's ordered records, for a table with a
// clustering key.
type clustering struct {
	mu   sync.RWMutex
	tree *btree.BTreeG[ckItem]
}

// ckItem is a clustering tree's entry: the record with the first 16 bytes
// of its clustering key copied beside it, big-endian and zero-padded. A
// search compares those words and reads the record's key only when they
// tie, so it does not chase a pointer to a record, and another to its
// key, at every step: an ordered probe of a cold tree spent most of its
// time in those misses (the ledger's version inserts, the Validator's
// marks). 16 bytes hold a BIGINT column and the start of the next. The
// padded words order keys as the keys do, or tie: where two padded
// prefixes first differ, either both keys have a byte there, or the
// shorter key ended and the longer one has a non-zero byte, so is
// greater.
type ckItem struct {
	hi, lo uint64
	r      *record
}

func itemOf(r *record) ckItem {
	var b [16]byte
	copy(b[:], r.ck)
	return ckItem{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:]), r: r}
}

// probe is the item to search a tree for ck with.
func probe(ck string) ckItem { return itemOf(&record{ck: ck}) }

func itemLess(a, b ckItem) bool {
	if a.hi != b.hi {
		return a.hi < b.hi
	}
	if a.lo != b.lo {
		return a.lo < b.lo
	}
	return a.r.ck < b.r.ck
}

// newPartition returns an empty partition of t for pk. It keeps a copy of
// pk, never the caller's string: a raw transaction's caller may reuse the
// bytes of its keys once the commit returns (RawTxn).
func newPartition(t *table, pk string) *partition {
	p := &partition{t: t}
	if len(pk) <= len(p.inl) {
		n := copy(p.inl[:], pk)
		pk = unsafe.String(&p.inl[0], n)
	} else {
		pk = strings.Clone(pk)
	}
	p.pk = pk
	if t.clustered() {
		p.cl = &clustering{tree: btree.NewG(16, itemLess)}
	} else {
		p.one.p = p
		p.one.tid.Store(tidLatest | tidAbsent)
	}
	return p
}

// bucketCount is the number of structure versions per table that guard the
// partition map against phantoms: creating or unlinking a partition bumps
// its bucket's version, which a read that found no partition recorded.
const bucketCount = 1024

// partShards is the number of shards of a table's partition map. Each
// shard is an open-addressing hash table (linear probing, at most half
// full) of (64-bit hash of the encoded partition key, partition) slots,
// read without a lock: partitions are never removed, a slot is written
// once, hash before partition, and a full table is copied into one twice
// its size that is then published whole. Inserts take the shard's mutex.
// A lookup therefore costs the slot's cache miss and the partition's, and
// no atomic write. Go maps cannot be read while written, and the map per
// shard under a read-write lock it replaces spent a third of a write-only
// transaction's time in the lock's shared counter and the map's groups.
// Hashing once serves shard (top bits), slot (low bits) and bucket.
const partShards = 256

type partSlot struct {
	h atomic.Uint64
	p atomic.Pointer[partition]
}

// partTable is one generation of a shard's slots; len(slots) is a power
// of two.
type partTable struct {
	mask  uint64
	slots []partSlot
}

type partShard struct {
	tab atomic.Pointer[partTable]
	mu  sync.Mutex // serializes inserts
	n   int        // partitions in tab, under mu
	_   [40]byte   // keep shards on separate cache lines
}

// find returns pk's partition, hashed h, or nil.
func (sh *partShard) find(h uint64, pk string) *partition {
	tab := sh.tab.Load()
	if tab == nil {
		return nil
	}
	for i := h & tab.mask; ; {
		p, j := tab.probe(h, i)
		if p == nil || p.pk == pk {
			return p
		}
		i = (j + 1) & tab.mask // another key with the same 64-bit hash
	}
}

// candidate returns the first partition of h's probe sequence whose slot
// has hash h, without reading any partition: almost always pk's, whose
// key the caller still compares. nil means none.
func (sh *partShard) candidate(h uint64) *partition {
	tab := sh.tab.Load()
	if tab == nil {
		return nil
	}
	p, _ := tab.probe(h, h&tab.mask)
	return p
}

// probe walks h's probe sequence from slot i to the first slot that has
// hash h, returning its partition and index, or to a never-written slot,
// returning nil: the sequence ends there.
func (tab *partTable) probe(h, i uint64) (*partition, uint64) {
	for ; ; i = (i + 1) & tab.mask {
		s := &tab.slots[i]
		p := s.p.Load()
		if p == nil || s.h.Load() == h {
			return p, i
		}
	}
}

// insertLocked adds p, hashed h, to sh, whose mutex the caller holds.
func (sh *partShard) insertLocked(h uint64, p *partition) {
	tab := sh.tab.Load()
	if tab == nil || 2*(sh.n+1) > len(tab.slots) {
		size := 16
		if tab != nil {
			size = 2 * len(tab.slots)
		}
		grown := &partTable{mask: uint64(size - 1), slots: make([]partSlot, size)}
		if tab != nil {
			for i := range tab.slots {
				if q := tab.slots[i].p.Load(); q != nil {
					grown.put(tab.slots[i].h.Load(), q)
				}
			}
		}
		sh.tab.Store(grown) // readers of the old table miss only p, below
		tab = grown
	}
	tab.put(h, p)
	sh.n++
}

// put writes p into the first free slot of h's probe sequence: hash first,
// so a reader that loads the partition finds its hash stored.
func (tab *partTable) put(h uint64, p *partition) {
	for i := h & tab.mask; ; i = (i + 1) & tab.mask {
		if s := &tab.slots[i]; s.p.Load() == nil {
			s.h.Store(h)
			s.p.Store(p)
			return
		}
	}
}

// table is one table incarnation. id is never reused, so log records and
// checkpoints of a dropped table are recognised and skipped.
type table struct {
	id     uint64
	schema *storage.Table
	valIdx map[string]int // value column → position in a row's values
	seed   maphash.Seed

	parts   [partShards]partShard // by hash of the encoded partition key
	buckets [bucketCount]atomic.Uint64
	dropped atomic.Bool
}

func newTable(id uint64, schema *storage.Table) *table {
	t := &table{id: id, schema: schema, valIdx: make(map[string]int, len(schema.Columns)), seed: maphash.MakeSeed()}
	for i, c := range schema.Columns {
		t.valIdx[c.Name] = i
	}
	return t
}

func (t *table) clustered() bool { return len(t.schema.ClusteringKey) > 0 }

func (t *table) hash(pk string) uint64 { return maphash.String(t.seed, pk) }

func (t *table) bucketOf(h uint64) *atomic.Uint64 { return &t.buckets[h%bucketCount] }

func (t *table) shardOf(h uint64) *partShard { return &t.parts[h>>56%partShards] }

// rangeParts calls fn for every partition until it returns false.
// Partitions inserted while it runs may or may not be visited.
func (t *table) rangeParts(fn func(*partition) bool) {
	for i := range t.parts {
		tab := t.parts[i].tab.Load()
		if tab == nil {
			continue
		}
		for j := range tab.slots {
			if p := tab.slots[j].p.Load(); p != nil && !fn(p) {
				return
			}
		}
	}
}

// encodePartition encodes a checked partition key.
func (t *table) encodePartition(vals storage.Values) string {
	var buf [128]byte // most keys fit: one allocation, the string
	b := buf[:0]
	for _, c := range t.schema.PartitionKey {
		b = appendKeyValue(b, vals[c.Name], false)
	}
	return string(b)
}

// encodeClustering encodes a checked clustering key, or a bound's prefix.
func (t *table) encodeClustering(vals storage.Values) string {
	var buf [128]byte
	b := buf[:0]
	for _, c := range t.schema.ClusteringKey {
		v, ok := vals[c.Name]
		if !ok {
			break
		}
		b = appendKeyValue(b, v, c.Order == storage.Desc)
	}
	return string(b)
}

// decodePartition decodes a stored partition key.
func (t *table) decodePartition(pk string) ([]storage.Value, error) {
	cols := t.schema.PartitionKey
	return decodeKey(pk, len(cols), func(i int) (storage.DataType, bool) { return cols[i].Type, false })
}

// decodeClustering decodes a stored clustering key.
func (t *table) decodeClustering(ck string) ([]storage.Value, error) {
	cols := t.schema.ClusteringKey
	return decodeKey(ck, len(cols), func(i int) (storage.DataType, bool) { return cols[i].Type, cols[i].Order == storage.Desc })
}

// decodeKey decodes n key columns whose type and direction col gives; the
// key must hold exactly those.
func decodeKey(key string, n int, col func(i int) (typ storage.DataType, desc bool)) ([]storage.Value, error) {
	b := []byte(key)
	out := make([]storage.Value, n)
	for i := range out {
		typ, desc := col(i)
		v, rest, err := decodeKeyValue(b, typ, desc)
		if err != nil {
			return nil, err
		}
		out[i], b = v, rest
	}
	if len(b) != 0 {
		return nil, errKeyEncoding
	}
	return out, nil
}

// partition returns the partition of pk, hashed h, or nil, and the version of pk's
// bucket, which a caller that finds nothing validates. The version is read
// before the lookup, and makePartition bumps it after publishing the
// partition (the atomics are sequentially consistent): a partition the
// lookup missed was published after it, so the bump follows the read.
func (t *table) partition(h uint64, pk string) (*partition, *atomic.Uint64, uint64) {
	b := t.bucketOf(h)
	v := b.Load()
	return t.shardOf(h).find(h, pk), b, v
}

// makePartition returns pk's partition, creating it (empty, or with an
// absent record) if missing. It does not check that pk decodes: the
// caller encoded it, or (recovery) checked it. created reports a new partition, whose bucket version this call bumped
// from the returned old value.
func (t *table) makePartition(h uint64, pk string) (p *partition, created bool, old uint64) {
	sh := t.shardOf(h)
	if p := sh.find(h, pk); p != nil {
		return p, false, 0
	}
	np := newPartition(t, pk)
	sh.mu.Lock()
	if p := sh.find(h, pk); p != nil {
		sh.mu.Unlock()
		return p, false, 0
	}
	sh.insertLocked(h, np)
	old = t.bucketOf(h).Add(1) - 1
	sh.mu.Unlock()
	return np, true, old
}

// inlineRecord and longInlineRecord are a record allocated with room for
// its clustering key, which it stores instead of a string of its own: a
// ledger version's key (a BIGINT, 9 bytes encoded) in the 64-byte size
// class, where the record alone took 48 bytes and its key a 16-byte
// object; the Validator's index entries (a begin clock and a nonce, 47
// bytes) in the 96-byte class, where they took 48 and 48. One object
// fewer per row for the collector to mark, on every cycle, for as long as
// the row lives. A longer key keeps a string of its own.
type inlineRecord struct {
	r   record
	inl [16]byte
}

type longInlineRecord struct {
	r   record
	inl [56]byte
}

func newRecord(p *partition, ck string) *record {
	var r *record
	var inl []byte
	switch {
	case len(ck) <= len(inlineRecord{}.inl):
		ir := &inlineRecord{}
		r, inl = &ir.r, ir.inl[:]
	case len(ck) <= len(longInlineRecord{}.inl):
		ir := &longInlineRecord{}
		r, inl = &ir.r, ir.inl[:]
	default:
		r = &record{ck: ck}
	}
	if inl != nil {
		r.ck = unsafe.String(unsafe.SliceData(inl), copy(inl, ck))
	}
	r.p = p
	r.tid.Store(tidLatest | tidAbsent)
	return r
}

// lookup returns the record for ck in a clustered partition, or nil and
// the partition version to validate the absence against.
func (p *partition) lookup(ck string) (*record, uint64) {
	if p.cl == nil {
		return &p.one, 0
	}
	p.cl.mu.RLock()
	defer p.cl.mu.RUnlock()
	it, _ := p.cl.tree.Get(probe(ck))
	return it.r, p.ver.Load()
}

// makeRecord returns the record for ck, inserting an absent one if
// missing. created reports an insert, which bumped the partition version
// from old.
func (p *partition) makeRecord(ck string) (r *record, created bool, old uint64) {
	if p.cl == nil {
		return &p.one, false, 0
	}
	if r, _ := p.lookup(ck); r != nil {
		return r, false, 0
	}
	p.cl.mu.Lock()
	defer p.cl.mu.Unlock()
	if it, ok := p.cl.tree.Get(probe(ck)); ok {
		return it.r, false, 0
	}
	r = newRecord(p, ck)
	p.cl.tree.ReplaceOrInsert(itemOf(r))
	return r, true, p.ver.Add(1) - 1
}

// rangeRecords appends to out the records with lo ≤ ck < hi ("" hi: no
// end), in ascending or descending order, at most n of them if n > 0, and
// returns it with the partition version they were read at.
func (p *partition) rangeRecords(lo, hi string, desc bool, n int, out []*record) ([]*record, uint64) {
	if p.cl == nil {
		return append(out, &p.one), 0
	}
	p.cl.mu.RLock()
	defer p.cl.mu.RUnlock()
	visit := func(it ckItem) bool {
		out = append(out, it.r)
		return n <= 0 || len(out) < n
	}
	switch {
	case !desc && hi == "":
		p.cl.tree.AscendGreaterOrEqual(probe(lo), visit)
	case !desc:
		p.cl.tree.AscendRange(probe(lo), probe(hi), visit)
	default:
		// DescendRange is (lessOrEqual, greaterThan]; walk down from just
		// below hi and stop below lo.
		down := func(it ckItem) bool {
			if it.r.ck < lo {
				return false
			}
			return visit(it)
		}
		if hi == "" {
			p.cl.tree.Descend(down)
		} else {
			p.cl.tree.DescendLessOrEqual(probe(hi), func(it ckItem) bool {
				if it.r.ck >= hi {
					return true
				}
				return down(it)
			})
		}
	}
	return out, p.ver.Load()
}

// readStable returns a consistent (TID word, row) pair of r. It waits out
// a writer's lock, so the TID returned is never locked.
func (r *record) readStable() (uint64, *row) {
	for spins := 0; ; spins++ {
		t1 := r.tid.Load()
		if t1&tidLock != 0 {
			backoff(spins)
			continue
		}
		rw := r.row.Load()
		if r.tid.Load() == t1 {
			return t1, rw
		}
	}
}
