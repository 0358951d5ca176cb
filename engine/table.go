package engine

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

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

// row holds the value columns of a row, in schema order.
type row struct{ cols []storage.Value }

// partition is the rows sharing a partition key. A table without a
// clustering key has exactly one record per partition, solo; otherwise the
// records sit in a B-tree ordered by encoded clustering key, guarded by mu.
// ver changes whenever a record is added to or unlinked from the tree: a
// scan or an absent read validates against it, the way Silo validates
// Masstree node versions.
type partition struct {
	solo *record // &one for a table without clustering key, else nil
	one  record  // inline, so a lookup's cache miss also fetches the record
	t    *table
	pk   string          // encoded partition key
	keys []storage.Value // partition-key values

	mu   sync.RWMutex
	tree *btree.BTreeG[*record]
	ver  atomic.Uint64

	next *partition // the next partition whose key hashes alike (shard's lock)
}

func recordLess(a, b *record) bool { return a.ck < b.ck }

// bucketCount is the number of structure versions per table that guard the
// partition map against phantoms: creating or unlinking a partition bumps
// its bucket's version, which a read that found no partition recorded.
const bucketCount = 1024

// partShards is the number of shards of a table's partition map. A plain
// map per shard under a read-write lock costs about two cache misses per
// lookup; sync.Map's hash trie walks a node per level, a miss each, and
// measured twice as slow on a million partitions. The map is keyed by the
// 64-bit hash of the encoded partition key, computed once per lookup for
// shard, map and bucket alike; partitions whose keys hash alike chain
// through next. A string-keyed map hashed the key a second time and read
// its stored key's bytes, a cache miss, to compare.
const partShards = 256

type partShard struct {
	mu sync.RWMutex
	m  map[uint64]*partition
	_  [32]byte // keep shards' locks on separate cache lines
}

// table is one table incarnation. id is never reused, so log records and
// checkpoints of a dropped table are recognised and skipped.
type table struct {
	id     uint64
	schema *storage.Table
	valIdx map[string]int // value column → position in row.cols
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

func (t *table) bucket(pk string) *atomic.Uint64 { return t.bucketOf(t.hash(pk)) }

func (t *table) bucketOf(h uint64) *atomic.Uint64 { return &t.buckets[h%bucketCount] }

func (t *table) shardOf(h uint64) *partShard { return &t.parts[h>>56%partShards] }

// find returns pk's partition, hashed h, from sh, which the caller locks.
func (sh *partShard) find(h uint64, pk string) *partition {
	p := sh.m[h]
	for p != nil && p.pk != pk {
		p = p.next
	}
	return p
}

// insertLocked adds p, hashed h, to sh, which the caller write-locks.
func (sh *partShard) insertLocked(h uint64, p *partition) {
	if sh.m == nil {
		sh.m = map[uint64]*partition{}
	}
	p.next = sh.m[h]
	sh.m[h] = p
}

// load returns pk's partition or nil.
func (t *table) load(pk string) *partition {
	h := t.hash(pk)
	sh := t.shardOf(h)
	sh.mu.RLock()
	p := sh.find(h, pk)
	sh.mu.RUnlock()
	return p
}

// rangeParts calls fn for every partition until it returns false. It does
// not hold a lock while fn runs.
func (t *table) rangeParts(fn func(*partition) bool) {
	var ps []*partition
	for i := range t.parts {
		sh := &t.parts[i]
		sh.mu.RLock()
		ps = ps[:0]
		for _, p := range sh.m {
			for ; p != nil; p = p.next {
				ps = append(ps, p)
			}
		}
		sh.mu.RUnlock()
		for _, p := range ps {
			if !fn(p) {
				return
			}
		}
	}
}

// encodePartition encodes a checked partition key.
func (t *table) encodePartition(vals storage.Values) string {
	var b []byte
	for _, c := range t.schema.PartitionKey {
		b = appendKeyValue(b, vals[c.Name], false)
	}
	return string(b)
}

// encodeClustering encodes a checked clustering key, or a bound's prefix.
func (t *table) encodeClustering(vals storage.Values) string {
	var b []byte
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

// partition returns the partition of pk, or nil, and the version of pk's
// bucket, which a caller that finds nothing validates. Both are read under
// the shard's lock, under which makePartition inserts and bumps: a
// partition that was missing when the version was read cannot appear
// without changing it.
func (t *table) partition(pk string) (*partition, *atomic.Uint64, uint64) {
	h := t.hash(pk)
	sh, b := t.shardOf(h), t.bucketOf(h)
	sh.mu.RLock()
	v := b.Load()
	p := sh.find(h, pk)
	sh.mu.RUnlock()
	return p, b, v
}

// makePartition returns pk's partition, creating it (empty, or with an
// absent solo record) if missing. keys decodes pk lazily when it is nil.
// created reports a new partition, whose bucket version this call bumped
// from the returned old value.
func (t *table) makePartition(pk string, keys []storage.Value) (p *partition, created bool, old uint64, err error) {
	if p := t.load(pk); p != nil {
		return p, false, 0, nil
	}
	if keys == nil {
		if keys, err = t.decodePartition(pk); err != nil {
			return nil, false, 0, err
		}
	}
	np := &partition{t: t, pk: pk, keys: keys}
	if t.clustered() {
		np.tree = btree.NewG(16, recordLess)
	} else {
		np.one.p = np
		np.one.tid.Store(tidLatest | tidAbsent)
		np.solo = &np.one
	}
	h := t.hash(pk)
	sh := t.shardOf(h)
	sh.mu.Lock()
	if p := sh.find(h, pk); p != nil {
		sh.mu.Unlock()
		return p, false, 0, nil
	}
	sh.insertLocked(h, np)
	old = t.bucketOf(h).Add(1) - 1
	sh.mu.Unlock()
	return np, true, old, nil
}

func newRecord(p *partition, ck string) *record {
	r := &record{ck: ck, p: p}
	r.tid.Store(tidLatest | tidAbsent)
	return r
}

// lookup returns the record for ck in a clustered partition, or nil and
// the partition version to validate the absence against.
func (p *partition) lookup(ck string) (*record, uint64) {
	if p.solo != nil {
		return p.solo, 0
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	r, _ := p.tree.Get(&record{ck: ck})
	return r, p.ver.Load()
}

// makeRecord returns the record for ck, inserting an absent one if
// missing. created reports an insert, which bumped the partition version
// from old.
func (p *partition) makeRecord(ck string) (r *record, created bool, old uint64) {
	if p.solo != nil {
		return p.solo, false, 0
	}
	if r, _ := p.lookup(ck); r != nil {
		return r, false, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.tree.Get(&record{ck: ck}); ok {
		return r, false, 0
	}
	r = newRecord(p, ck)
	p.tree.ReplaceOrInsert(r)
	return r, true, p.ver.Add(1) - 1
}

// rangeRecords returns the records with lo ≤ ck < hi ("" hi: no end), in
// ascending or descending order, and the partition version they were read
// at.
func (p *partition) rangeRecords(lo, hi string, desc bool) ([]*record, uint64) {
	if p.solo != nil {
		return []*record{p.solo}, 0
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []*record
	visit := func(r *record) bool {
		out = append(out, r)
		return true
	}
	loR := &record{ck: lo}
	switch {
	case !desc && hi == "":
		p.tree.AscendGreaterOrEqual(loR, visit)
	case !desc:
		p.tree.AscendRange(loR, &record{ck: hi}, visit)
	default:
		// DescendRange is (lessOrEqual, greaterThan]; walk down from just
		// below hi and stop below lo.
		down := func(r *record) bool {
			if r.ck < lo {
				return false
			}
			return visit(r)
		}
		if hi == "" {
			p.tree.Descend(down)
		} else {
			p.tree.DescendLessOrEqual(&record{ck: hi}, func(r *record) bool {
				if r.ck >= hi {
					return true
				}
				return down(r)
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
