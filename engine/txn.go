package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/kiroku-db/kiroku/storage"
)

// tx is the OCC core of a transaction (Silo): reads record the TID they
// saw, absent reads and scans record a structure version, and writes are
// buffered until commit. It is not safe for concurrent use.
type tx struct {
	db     *DB
	reads  []readEntry
	nodes  []nodeEntry
	writes []writeEntry
	widx   map[wkey]int  // index into writes, once there are many
	order  []*writeEntry // writes in lock order, during commit
	cand   []*partition  // resolve's candidates, one per write
	recs   []*record     // a scan's records, while it reads them
	last   int           // index of the write put touched last
	pinned *worker       // the worker every commit uses (RawTxn.Pin)
	// scratch and scratchSet hold the columns of partial Puts, which
	// commit merges into a new row and never installs: a pooled core
	// reuses them instead of allocating a full row of columns per Put.
	scratch    []storage.Value
	scratchSet []bool
	// readRoom holds the rows get decoded, until reset.
	readRoom []storage.Value
	// readMax is the largest version read: a read-only transaction is
	// released once that version's epoch is durable.
	readMax uint64
}

type readEntry struct {
	r   *record
	tid uint64 // the TID word seen, unlocked
}

type nodeEntry struct {
	ver *atomic.Uint64
	v   uint64
}

type wkey struct {
	t      *table
	pk, ck string
}

// writeEntry is a buffered write. cols holds the value columns; set says
// which a partial Put sets (nil: all of them). At commit a partial Put is
// merged into the row current under the record's lock.
type writeEntry struct {
	wkey
	h    uint64 // pk's hash in its table
	del  bool
	cols []storage.Value // nil when full came prebuilt (raw API)
	set  []bool
	full *row // the whole row, encoded; nil for a partial write

	r   *record // resolved at commit
	old uint64  // TID word at lock time
	out *row    // row installed (nil for a delete)
}

const linearWrites = 16

// reset empties the transaction for reuse, keeping its slices' room.
func (x *tx) reset() {
	// Drop references to old rows. Only the used entries: the room past
	// them is zero already (entries are only appended, and only this
	// truncates), and a pooled core may keep a bulk load's room, which
	// clearing whole on every transaction cost more than the rest of a
	// small one.
	clear(x.writes)
	clear(x.order)
	clear(x.scratch) // the values' strings
	clear(x.readRoom)
	if cap(x.readRoom) > maxReadRoom {
		x.readRoom = nil // a long transaction's room is not worth keeping
	}
	x.readRoom = x.readRoom[:0]
	if cap(x.recs) > maxSpareScanned {
		x.recs = nil // a long scan's room is not worth keeping
	}
	clear(x.recs)
	x.recs = x.recs[:0]
	x.reads, x.nodes, x.writes, x.order = x.reads[:0], x.nodes[:0], x.writes[:0], x.order[:0]
	x.scratch, x.scratchSet = x.scratch[:0], x.scratchSet[:0]
	x.widx, x.readMax, x.last = nil, 0, 0
}

// findWrite returns the index of the write to k, whose partition key
// hashes to h, or -1.
func (x *tx) findWrite(k wkey, h uint64) int {
	if x.widx != nil {
		if i, ok := x.widx[k]; ok {
			return i
		}
		return -1
	}
	for i := range x.writes {
		if x.writes[i].h == h && x.writes[i].wkey == k {
			return i
		}
	}
	return -1
}

// minWrites is the room a write set starts with: a ledger transaction
// writes three records, and growing from one entry would allocate thrice.
const minWrites = 3

func (x *tx) addWrite(w writeEntry) {
	x.last = len(x.writes)
	if x.writes == nil {
		x.writes = make([]writeEntry, 0, minWrites)
	}
	x.writes = append(x.writes, w)
	if x.widx == nil && len(x.writes) > linearWrites {
		x.widx = make(map[wkey]int, 2*len(x.writes))
		for i := range x.writes {
			x.widx[x.writes[i].wkey] = i
		}
	} else if x.widx != nil {
		x.widx[w.wkey] = len(x.writes) - 1
	}
}

func (x *tx) noteRead(r *record, tid uint64) {
	x.reads = append(x.reads, readEntry{r, tid})
	x.readMax = max(x.readMax, tidVersion(tid))
}

// readCommitted reads the committed row of (t, pk, ck) and records what
// validation needs. It returns nil if there is no row.
func (x *tx) readCommitted(t *table, h uint64, pk, ck string) *row {
	p, b, bv := t.partition(h, pk)
	if p == nil {
		x.nodes = append(x.nodes, nodeEntry{b, bv})
		return nil
	}
	r, pv := p.lookup(ck)
	if r == nil {
		x.nodes = append(x.nodes, nodeEntry{&p.ver, pv})
		return nil
	}
	tid, rw := r.readStable()
	x.noteRead(r, tid)
	if tid&tidAbsent != 0 {
		return nil
	}
	return rw
}

// get returns the row as this transaction sees it: its own write if any,
// else the committed row, decoded into the transaction's scratch room
// (valid until it is reset: its callers copy or drop it before).
func (x *tx) get(t *table, pk, ck string) []storage.Value {
	h := t.hash(pk)
	i := x.findWrite(wkey{t, pk, ck}, h)
	if i < 0 {
		if rw := x.readCommitted(t, h, pk, ck); rw != nil {
			return rw.decodeInto(t, x.room(len(t.schema.Columns)))
		}
		return nil
	}
	w := &x.writes[i]
	switch {
	case w.del:
		return nil
	case w.set == nil:
		return w.values(t)
	}
	return merge(t, x.readCommitted(t, h, pk, ck), w.cols, w.set)
}

// maxReadRoom bounds the values a pooled transaction keeps room for.
const maxReadRoom = 1 << 12

// room returns room for n values from readRoom: a row get decodes there
// instead of allocating one per read.
func (x *tx) room(n int) []storage.Value {
	if cap(x.readRoom)-len(x.readRoom) < n {
		x.readRoom = make([]storage.Value, 0, max(2*cap(x.readRoom), n))
	}
	i := len(x.readRoom)
	x.readRoom = x.readRoom[:i+n]
	return x.readRoom[i : i+n : i+n]
}

// values is a whole write's row.
func (w *writeEntry) values(t *table) []storage.Value {
	if w.cols == nil && w.full != nil {
		return w.full.values(t)
	}
	return w.cols
}

// merge overlays the set columns of cols on base (nil: a new row, all
// NULL).
func merge(t *table, base *row, cols []storage.Value, set []bool) []storage.Value {
	var bv []storage.Value
	if base != nil {
		bv = base.values(t)
	}
	return mergeValues(t, bv, cols, set)
}

// mergeValues overlays the set columns of cols on base's values (nil: a
// new row, all NULL).
func mergeValues(t *table, base, cols []storage.Value, set []bool) []storage.Value {
	out := make([]storage.Value, len(cols))
	for i := range out {
		switch {
		case set[i]:
			out[i] = cols[i]
		case base != nil:
			out[i] = base[i]
		default:
			out[i] = storage.NullOf(t.schema.Columns[i].Type)
		}
	}
	return out
}

// partial returns room for a partial Put of n columns, all unset: cols
// and set stay this transaction's until reset, so the caller must not
// install cols as a row (merge copies them).
func (x *tx) partial(n int) (cols []storage.Value, set []bool) {
	if cap(x.scratch)-len(x.scratch) < n {
		// Slices handed out before keep the old array; reset clears only
		// the new one, which is all the next transaction will use.
		x.scratch = make([]storage.Value, 0, max(2*cap(x.scratch), 4*n))
		x.scratchSet = make([]bool, 0, cap(x.scratch))
	}
	i := len(x.scratch)
	x.scratch, x.scratchSet = x.scratch[:i+n], x.scratchSet[:i+n]
	clear(x.scratchSet[i:])
	return x.scratch[i : i+n : i+n], x.scratchSet[i : i+n : i+n]
}

// put buffers a write of the set columns (set nil: all columns).
func (x *tx) put(t *table, pk, ck string, cols []storage.Value, set []bool) {
	k, h := wkey{t, pk, ck}, t.hash(pk)
	i := x.findWrite(k, h)
	if i < 0 {
		var full *row
		if set == nil {
			full = newRow(cols) // here, not in commit, where locks are held
		}
		x.addWrite(writeEntry{wkey: k, h: h, cols: cols, set: set, full: full})
		return
	}
	x.last = i
	w := &x.writes[i]
	switch {
	case set == nil:
		w.cols, w.set = cols, nil
	case w.del:
		// The row is gone within this transaction: unset columns are NULL.
		w.cols, w.set = merge(t, nil, cols, set), nil
	default:
		merged := slices.Clone(w.values(t))
		for j := range cols {
			if set[j] {
				merged[j] = cols[j]
				if w.set != nil {
					w.set[j] = true
				}
			}
		}
		w.cols = merged
	}
	w.del, w.full = false, nil
	if w.set == nil {
		w.full = newRow(w.cols)
	}
}

func (x *tx) del(t *table, pk, ck string) {
	k, h := wkey{t, pk, ck}, t.hash(pk)
	if i := x.findWrite(k, h); i >= 0 {
		w := &x.writes[i]
		w.del, w.cols, w.set, w.full = true, nil, nil, nil
		return
	}
	x.addWrite(writeEntry{wkey: k, h: h, del: true})
}

// putRow buffers a write of a whole prebuilt row.
func (x *tx) putRow(t *table, pk, ck string, r *row) {
	k, h := wkey{t, pk, ck}, t.hash(pk)
	if i := x.findWrite(k, h); i >= 0 {
		x.last = i
		x.writes[i] = writeEntry{wkey: k, h: h, full: r}
		return
	}
	x.addWrite(writeEntry{wkey: k, h: h, full: r})
}

// resolve finds the partitions of the writes that the index has, in two
// passes: the first finds every write's slot by hash, the second checks
// each slot's partition. Within a pass the loads do not depend on one
// another, so their cache misses overlap; a lookup per write, each
// waiting for its slot and then its partition, took half of a write-only
// transaction's time. A write to a table without clustering key gets its
// record; x.cand[i] is write i's partition, or nil when commitOn must
// look it up or create it (a missing partition, a 64-bit hash collision).
func (x *tx) resolve() {
	cand := slices.Grow(x.cand[:0], len(x.writes))
	for i := range x.writes {
		wr := &x.writes[i]
		cand = append(cand, wr.t.shardOf(wr.h).candidate(wr.h))
	}
	x.cand = cand
	for i := range x.writes {
		switch p := cand[i]; {
		case p == nil:
		case p.pk != x.writes[i].pk:
			cand[i] = nil
		case p.cl == nil:
			x.writes[i].r = &p.one
		}
	}
}

// nodeIndex locates a transaction's structure reads by version word. A
// transaction that read many structures (an import that reads each key as
// absent, then inserts it) gets one at commit, so that excusing each of
// its inserts (bumped) costs one lookup instead of a pass over every
// structure read: without it such a commit was quadratic, 12 s for 80,000
// keys.
type nodeIndex map[*atomic.Uint64][]int

// linearNodes is the most structure reads bumped scans without an index.
const linearNodes = 16

// indexNodes drops repeated structure reads (the same version word at
// the same value: one validation checks them all) and, if many remain,
// returns their index. Only commitOn calls it, before any bump.
func (x *tx) indexNodes() nodeIndex {
	if len(x.nodes) <= linearNodes {
		return nil
	}
	idx := make(nodeIndex)
	kept := x.nodes[:0]
next:
	for _, n := range x.nodes {
		for _, i := range idx[n.ver] { // one entry per value read: short
			if kept[i].v == n.v {
				continue next
			}
		}
		idx[n.ver] = append(idx[n.ver], len(kept))
		kept = append(kept, n)
	}
	clear(x.nodes[len(kept):])
	x.nodes = kept
	return idx
}

// noteNode adds a structure read during commit, to idx as well if there
// is one.
func (x *tx) noteNode(idx nodeIndex, ver *atomic.Uint64, v uint64) {
	if idx != nil {
		idx[ver] = append(idx[ver], len(x.nodes))
	}
	x.nodes = append(x.nodes, nodeEntry{ver, v})
}

// bumped adjusts this transaction's own structure reads after its commit
// inserted into a structure whose version went from old to old+1, so its
// own insert does not fail its validation (Silo does the same for node
// versions it changed itself). It reports whether the transaction had
// read the structure at old. idx is indexNodes' index, or nil.
func (x *tx) bumped(idx nodeIndex, ver *atomic.Uint64, old uint64) bool {
	read := false
	if idx != nil {
		for _, i := range idx[ver] {
			if n := &x.nodes[i]; n.v == old {
				n.v = old + 1
				read = true
			}
		}
		return read
	}
	for i := range x.nodes {
		if n := &x.nodes[i]; n.ver == ver && n.v == old {
			n.v = old + 1
			read = true
		}
	}
	return read
}

// commit runs Silo's commit protocol and returns the commit epoch: the
// transaction is committed (visible) but durable only once the durable
// epoch reaches it. On ErrConflict nothing was written.
func (x *tx) commit(ctx context.Context) (uint64, error) {
	if len(x.writes) == 0 {
		return x.commitReadOnly()
	}
	if x.db.following.Load() {
		return 0, &storage.Error{Kind: storage.ErrNotLeader, Op: "commit", Detail: "writes go to the leader"}
	}
	w := x.pinned
	if w == nil {
		select {
		case w = <-x.db.slots:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	e, err := x.commitOn(w)
	if x.pinned == nil {
		x.db.slots <- w
	}
	if x.db.want.Load() && x.db.holdTarget.Load() == 0 {
		x.db.wakeLoggers()
	}
	if err == nil {
		w.lg.throttle()
	}
	return e, err
}

// commitReadOnly validates the reads: a read-only transaction serializes
// at its validation, and what it read is durable once the durable epoch
// reaches the epoch of the newest version it read.
func (x *tx) commitReadOnly() (uint64, error) {
	for _, rd := range x.reads {
		if rd.r.tid.Load() != rd.tid {
			return 0, errConflict
		}
	}
	for _, n := range x.nodes {
		if n.ver.Load() != n.v {
			return 0, errConflict
		}
	}
	return tidEpoch(x.readMax), nil
}

var errConflict = &storage.Error{Kind: storage.ErrConflict, Op: "commit", Detail: "a record read or written changed before commit"}

func (x *tx) commitOn(w *worker) (uint64, error) {
	db := x.db
	w.enter(db)
	defer w.active.Store(0)

	// Find or insert (absent) the records written.
	x.resolve()
	defer clear(x.cand) // keep no partition alive past the commit
	idx := x.indexNodes()
	for i := range x.writes {
		wr := &x.writes[i]
		if wr.r != nil {
			continue // resolved
		}
		p, createdP := x.cand[i], false
		if p == nil {
			var old uint64
			p, createdP, old = wr.t.makePartition(wr.h, wr.pk)
			if createdP {
				if x.bumped(idx, wr.t.bucketOf(wr.h), old) && p.cl != nil {
					// This transaction read the partition as missing,
					// which its bucket's version guarded. Now the
					// partition is published, others can insert into it
					// unseen by that version: validate that it is still
					// as created, empty. (A table without clustering key
					// has its one record noted as read below.)
					x.noteNode(idx, &p.ver, 0)
				}
				if hook := x.db.hooks.partitionCreated.Load(); hook != nil {
					(*hook)()
				}
			}
		}
		r, createdR, old := p.makeRecord(wr.ck)
		if createdR {
			x.bumped(idx, &p.ver, old)
		}
		if createdP || createdR {
			// The insert is visible (absent and unlocked) until phase 1
			// locks it, and another transaction may commit to it in
			// between. Having excused our own structure change above, we
			// must see the record as we created it.
			x.noteRead(r, tidLatest|tidAbsent)
		}
		wr.r = r
	}

	// Phase 1: lock the write set in a global order: record addresses, as
	// Silo does. Go's collector never moves heap objects, so a record's
	// address is fixed for its lifetime.
	ws := slices.Grow(x.order[:0], len(x.writes))
	for i := range x.writes {
		ws = append(ws, &x.writes[i])
	}
	x.order = ws
	sortByRecord(ws)
	locked := 0
	unlock := func() {
		for _, wr := range ws[:locked] {
			wr.r.tid.Store(wr.old)
		}
	}
	for _, wr := range ws {
		for spins := 0; ; spins++ {
			cur := wr.r.tid.Load()
			if cur&tidLock == 0 && wr.r.tid.CompareAndSwap(cur, cur|tidLock) {
				wr.old = cur
				break
			}
			backoff(spins)
		}
		locked++
		if wr.old&tidLatest == 0 || wr.t.dropped.Load() {
			unlock()
			return 0, errConflict
		}
	}

	// The commit epoch, read after every lock is held (Go's atomics are
	// sequentially consistent, which is the fence Silo needs here).
	e := db.epoch.Load()

	// Phase 2: validate the reads and the structures read.
	var own map[*record]bool
	if len(x.writes) > linearWrites {
		own = make(map[*record]bool, len(x.writes))
		for i := range x.writes {
			own[x.writes[i].r] = true
		}
	}
	ownLocked := func(r *record) bool {
		if own != nil {
			return own[r]
		}
		for i := range x.writes {
			if x.writes[i].r == r {
				return true
			}
		}
		return false
	}
	maxv := w.lastTID
	for _, rd := range x.reads {
		cur := rd.r.tid.Load()
		if cur&^tidLock != rd.tid || (cur&tidLock != 0 && !ownLocked(rd.r)) {
			unlock()
			return 0, errConflict
		}
		maxv = max(maxv, tidVersion(rd.tid))
	}
	for _, n := range x.nodes {
		if n.ver.Load() != n.v {
			unlock()
			return 0, errConflict
		}
	}
	for i := range x.writes {
		maxv = max(maxv, tidVersion(x.writes[i].old))
	}
	tid, ok := nextTID(maxv, e)
	if !ok {
		unlock()
		// The sequence numbers of this epoch ran out: ask for a close.
		db.wmu.Lock()
		db.stepLocked(epochMsg{ev: evHurry, epoch: e})
		db.wmu.Unlock()
		return 0, errConflict
	}

	// Phase 3: build the rows, log them, install and unlock.
	for i := range x.writes {
		wr := &x.writes[i]
		switch {
		case wr.del:
			wr.out = nil
		case wr.full != nil:
			wr.out = wr.full
		case wr.set == nil:
			wr.out = newRow(wr.cols)
		default: // a partial write, merged into the row locked
			var base *row
			if wr.old&tidAbsent == 0 {
				base = wr.r.row.Load()
			}
			wr.out = mergeRow(base, wr.cols, wr.set)
		}
	}
	// Each row must fit one log record and one checkpoint chunk.
	limit := maxRowBytes
	if db.cfg.Log == LogWAL {
		limit = min(limit, w.lg.db.maxRecord-64)
	}
	bound := 0 // of the transaction's log entry
	for i := range x.writes {
		wr := &x.writes[i]
		n := writeBound(wr.pk, wr.ck, wr.out)
		if n > limit {
			unlock()
			return 0, &storage.Error{Kind: storage.ErrTooLarge, Op: "commit", Namespace: wr.t.schema.Namespace,
				Table: wr.t.schema.Name, Detail: fmt.Sprintf("a row of %d bytes, the engine takes %d", n, limit)}
		}
		bound += n
	}
	if db.cfg.Log == LogWAL {
		w.log(x.writes, tid, e, bound)
	}
	for i := range x.writes {
		wr := &x.writes[i]
		status := tidLatest
		if wr.out == nil {
			status |= tidAbsent
		}
		wr.r.row.Store(wr.out)
		wr.r.tid.Store(tid | status)
	}
	w.lastTID = tid
	return e, nil
}

// sortByRecord sorts writes by record address: an insertion sort for the
// few writes of most transactions (no comparison function to call), the
// library's sort beyond.
func sortByRecord(ws []*writeEntry) {
	addr := func(w *writeEntry) uintptr { return uintptr(unsafe.Pointer(w.r)) }
	if len(ws) > 24 {
		slices.SortFunc(ws, func(a, b *writeEntry) int { return cmp.Compare(addr(a), addr(b)) })
		return
	}
	for i := 1; i < len(ws); i++ {
		w, a := ws[i], addr(ws[i])
		j := i
		for ; j > 0 && addr(ws[j-1]) > a; j-- {
			ws[j] = ws[j-1]
		}
		ws[j] = w
	}
}

// maxRowBytes bounds one row's encoding (key and value columns).
const maxRowBytes = 64<<20 - 1<<10
