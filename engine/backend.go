package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kiroku-db/kiroku/storage"
)

var _ storage.Backend = (*DB)(nil)

// Limits returns the size limits in force.
func (db *DB) Limits() storage.Limits { return db.cfg.Limits }

func (db *DB) usable(op string) error {
	if err := db.checkOpen(op); err != nil {
		return err
	}
	if err := db.failure(); err != nil {
		kind := storage.ErrUnavailable
		if errors.Is(err, storage.ErrNotLeader) {
			kind = storage.ErrNotLeader // leadership lost: writes go to the new leader
		}
		return &storage.Error{Kind: kind, Op: op, Cause: err}
	}
	return nil
}

// Begin starts a transaction. Reads and writes run without locks; Commit
// validates and installs them (Silo) and returns once they are durable.
func (db *DB) Begin(ctx context.Context) (storage.Txn, error) { return db.begin(false) }

func (db *DB) begin(unsynced bool) (storage.Txn, error) {
	if err := db.usable("begin"); err != nil {
		return nil, err
	}
	x := txPool.Get().(*pooledTx)
	x.db = db
	return &Txn{db: db, x: x, unsynced: unsynced}, nil
}

// Txn is a transaction of the storage API. Its OCC core comes from a pool
// and goes back when the transaction ends, with its read, node and write
// sets, so that a short transaction allocates little more than this
// handle; a Txn is not safe for concurrent use, and a call racing its own
// Commit or Abort could reach a core another transaction holds by then.
type Txn struct {
	db       *DB
	x        *pooledTx // nil once the transaction ended
	unsynced bool      // Commit returns once visible (see DB.Unsynced)
}

// pooledTx is a transaction core and the arrays that back its read and
// node sets while they are small.
type pooledTx struct {
	tx
	readBuf [4]readEntry
	nodeBuf [2]nodeEntry
}

var txPool = sync.Pool{New: func() any {
	x := new(pooledTx)
	x.reads, x.nodes = x.readBuf[:0], x.nodeBuf[:0]
	return x
}}

// maxPooledEntries bounds the read, node and write sets a core keeps for
// the next transaction; a larger one (a bulk load's) is dropped.
const maxPooledEntries = 1024

// end finishes the transaction and returns its core to the pool.
func (t *Txn) end() {
	x := t.x
	t.x = nil
	if cap(x.reads) > maxPooledEntries {
		x.reads = x.readBuf[:0]
	}
	if cap(x.nodes) > maxPooledEntries {
		x.nodes = x.nodeBuf[:0]
	}
	if cap(x.writes) > maxPooledEntries {
		x.writes = nil
	}
	if cap(x.order) > maxPooledEntries {
		x.order = nil
	}
	x.reset()
	x.db = nil
	txPool.Put(x)
}

func (t *Txn) table(op, ns, name string) (*table, error) {
	if t.x == nil {
		return nil, &storage.Error{Kind: storage.ErrTxnDone, Op: op, Namespace: ns, Table: name}
	}
	if err := t.db.usable(op); err != nil {
		return nil, err
	}
	return t.db.cat.lookup(op, ns, name)
}

func (t *Txn) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	tb, err := t.table("get", g.Namespace, g.Table)
	if err != nil {
		return nil, false, err
	}
	if err := tb.schema.CheckGet(g, t.db.cfg.Limits); err != nil {
		return nil, false, err
	}
	pk, ck := tb.encodePartition(g.Partition), tb.encodeClustering(g.Clustering)
	cols := t.x.get(tb, pk, ck)
	if cols == nil {
		return nil, false, nil
	}
	return tb.rowFromKey(g.Partition, g.Clustering, cols, g.Projection), true, nil
}

// rowFromKey builds a result row from a request's key and the value
// columns.
func (tb *table) rowFromKey(part, clus storage.Values, cols []storage.Value, proj []string) storage.Row {
	out := make(storage.Row, rowSize(len(part)+len(clus)+len(cols), proj))
	for k, v := range part {
		if wanted(proj, k) {
			out[k] = v
		}
	}
	for k, v := range clus {
		if wanted(proj, k) {
			out[k] = v
		}
	}
	tb.addColumns(out, cols, proj)
	return out
}

// rowFromStored builds a result row from stored keys; pkeys and ckeys are
// the partition and clustering keys' values, each nil unless the
// projection asks for part of it (wantsClustering).
func (tb *table) rowFromStored(pkeys, ckeys, cols []storage.Value, proj []string) storage.Row {
	out := make(storage.Row, rowSize(len(pkeys)+len(ckeys)+len(cols), proj))
	for i, c := range tb.schema.PartitionKey {
		if wanted(proj, c.Name) {
			out[c.Name] = pkeys[i]
		}
	}
	if ckeys != nil {
		for i, c := range tb.schema.ClusteringKey {
			if wanted(proj, c.Name) {
				out[c.Name] = ckeys[i]
			}
		}
	}
	tb.addColumns(out, cols, proj)
	return out
}

// wantsClustering reports whether a projection asks for a clustering
// column (never, for a table without one), which scans then decode from
// the stored key.
func (tb *table) wantsClustering(proj []string) bool {
	return slices.ContainsFunc(tb.schema.ClusteringKey, func(c storage.ClusteringColumn) bool { return wanted(proj, c.Name) })
}

func (tb *table) addColumns(out storage.Row, cols []storage.Value, proj []string) {
	for i, c := range tb.schema.Columns {
		if wanted(proj, c.Name) {
			out[c.Name] = cols[i]
		}
	}
}

// wanted reports whether a projection keeps column name; an empty
// projection keeps every column.
func wanted(proj []string, name string) bool { return len(proj) == 0 || slices.Contains(proj, name) }

func rowSize(all int, proj []string) int {
	if len(proj) > 0 {
		return min(all, len(proj))
	}
	return all
}

// scanRange turns a checked scan's bounds into the clustering-key range
// [lo, hi); hi "" means no upper end. empty reports a range with no keys.
func (tb *table) scanRange(s *storage.Scan) (lo, hi string, empty bool) {
	enc := func(b *storage.Bound) string { return tb.encodeClustering(b.Key) }
	if s.Start != nil {
		lo = enc(s.Start)
		if !s.Start.Inclusive {
			if lo = prefixEnd([]byte(lo)); lo == "" {
				return "", "", true
			}
		}
	}
	if s.End != nil {
		hi = enc(s.End)
		if s.End.Inclusive {
			hi = prefixEnd([]byte(hi))
		}
	}
	return lo, hi, hi != "" && lo >= hi
}

func inRange(ck, lo, hi string) bool { return ck >= lo && (hi == "" || ck < hi) }

type scanned struct {
	ck    string
	rw    *row            // the committed row, decoded into cols when read
	cols  []storage.Value // the row's values, once decoded (or this transaction's own)
	ckeys []storage.Value // the decoded ck, if the projection wants it
}

// values decodes the row, once.
func (s *scanned) values(tb *table) []storage.Value {
	if s.cols == nil && s.rw != nil {
		s.cols = s.rw.values(tb)
	}
	return s.cols
}

// scanRows is a scan's result. A row's map is built only when Row asks
// for it; Column reads one column without it (storage.ColumnReader).
type scanRows struct {
	tb    *table
	pkeys []storage.Value
	rows  []scanned
	spare *[]scanned // what rows came in from scannedPool, for Close
	proj  []string
	i     int
	row   storage.Row // rows[i]'s, once built
}

func (r *scanRows) Next() bool {
	r.row = nil
	if r.i < len(r.rows) {
		r.i++
	}
	return r.i < len(r.rows)
}

func (r *scanRows) Row() storage.Row {
	if r.row == nil {
		s := &r.rows[r.i]
		r.row = r.tb.rowFromStored(r.pkeys, s.ckeys, s.values(r.tb), r.proj)
	}
	return r.row
}

func (r *scanRows) Column(name string) (storage.Value, bool) {
	if !wanted(r.proj, name) {
		return storage.Value{}, false
	}
	s := &r.rows[r.i]
	if j, ok := r.tb.valIdx[name]; ok {
		return s.values(r.tb)[j], true
	}
	if j := slices.IndexFunc(r.tb.schema.PartitionKey, func(c storage.Column) bool { return c.Name == name }); j >= 0 {
		return r.pkeys[j], true
	}
	if j := slices.IndexFunc(r.tb.schema.ClusteringKey, func(c storage.ClusteringColumn) bool { return c.Name == name }); j >= 0 && s.ckeys != nil {
		return s.ckeys[j], true
	}
	return storage.Value{}, false
}

func (r *scanRows) Err() error { return nil }

// Close hands the rows' room on to later scans. A second Close finds
// none to hand on, so closing twice is safe.
func (r *scanRows) Close() error {
	if cap(r.rows) > 0 && cap(r.rows) <= maxSpareScanned {
		clear(r.rows) // their keys and columns; past them the room is zero
		if r.spare == nil {
			r.spare = new([]scanned)
		}
		*r.spare = r.rows[:0]
		scannedPool.Put(r.spare)
	}
	r.rows, r.spare, r.i, r.row = nil, nil, 0, nil
	return nil
}

// scannedPool holds room for scanned rows (*[]scanned), handed on by
// scanRows.Close: short scans, such as the Validator's clock, are most of
// a scan's allocation otherwise. Room for more than maxSpareScanned rows
// is left to the collector.
var scannedPool sync.Pool

const maxSpareScanned = 256

// spareScanned returns room handed on by a Close, if there is any, and
// the pointer it came in for the next Close to reuse.
func spareScanned() ([]scanned, *[]scanned) {
	if p, ok := scannedPool.Get().(*[]scanned); ok {
		return *p, p
	}
	return nil, nil
}

func (t *Txn) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	tb, err := t.table("scan", s.Namespace, s.Table)
	if err != nil {
		return nil, err
	}
	if err := tb.schema.CheckScan(s, t.db.cfg.Limits); err != nil {
		return nil, err
	}
	return t.x.scan(tb, s)
}

func (x *tx) scan(tb *table, s *storage.Scan) (*scanRows, error) {
	pk := tb.encodePartition(s.Partition)
	lo, hi, empty := tb.scanRange(s)
	if empty {
		return &scanRows{tb: tb, i: -1}, nil
	}
	desc := s.Order == storage.Desc
	var rows []scanned
	var spare *[]scanned
	p, b, bv := tb.partition(tb.hash(pk), pk)
	if p == nil {
		x.nodes = append(x.nodes, nodeEntry{b, bv})
	} else {
		rows, spare = spareScanned()
		rows = x.scanCommitted(p, lo, hi, desc, x.scanWant(tb, pk, lo, hi, s.Limit), rows)
	}
	// Overlay this transaction's own writes to the partition.
	own := false
	for i := range x.writes {
		w := &x.writes[i]
		if w.t != tb || w.pk != pk || !inRange(w.ck, lo, hi) {
			continue
		}
		own = true
		j := slices.IndexFunc(rows, func(r scanned) bool { return r.ck == w.ck })
		var cols []storage.Value
		switch {
		case w.del:
		case w.set == nil:
			cols = w.values(tb)
		default:
			var base []storage.Value
			if j >= 0 {
				base = rows[j].values(tb)
			}
			cols = mergeValues(tb, base, w.cols, w.set)
		}
		switch {
		case j >= 0 && cols == nil:
			rows = slices.Delete(rows, j, j+1)
		case j >= 0:
			rows[j].cols, rows[j].rw = cols, nil
		case cols != nil:
			rows = append(rows, scanned{ck: w.ck, cols: cols})
		}
	}
	if own {
		slices.SortFunc(rows, func(a, b scanned) int {
			if desc {
				return strings.Compare(b.ck, a.ck)
			}
			return strings.Compare(a.ck, b.ck)
		})
	}
	if s.Limit > 0 && len(rows) > s.Limit {
		clear(rows[s.Limit:]) // Close clears only the rows it holds
		rows = rows[:s.Limit]
	}
	var pkeys []storage.Value // nil unless the projection asks for part of the partition key
	if slices.ContainsFunc(tb.schema.PartitionKey, func(c storage.Column) bool { return wanted(s.Projection, c.Name) }) {
		pkeys = tb.schema.KeyValues(s.Partition, nil)[:len(tb.schema.PartitionKey)]
	}
	if tb.wantsClustering(s.Projection) {
		for i := range rows {
			var err error
			if rows[i].ckeys, err = tb.decodeClustering(rows[i].ck); err != nil {
				return nil, err
			}
		}
	}
	return &scanRows{tb: tb, pkeys: pkeys, rows: rows, spare: spare, proj: s.Projection, i: -1}, nil
}

// scanWant is how many committed rows a scan of [lo, hi) with limit must
// read for its first limit rows once this transaction's own writes are
// laid over them: limit plus one for each own delete in the range, since
// each may remove one of them (0: all rows). An own write to a row past
// the rows read sorts after at least limit rows that survive, so the limit
// cuts it off whatever the row it would have merged with.
func (x *tx) scanWant(tb *table, pk, lo, hi string, limit int) int {
	if limit <= 0 {
		return 0
	}
	for i := range x.writes {
		if w := &x.writes[i]; w.del && w.t == tb && w.pk == pk && inRange(w.ck, lo, hi) {
			limit++
		}
	}
	return limit
}

// scanCommitted reads the visible committed rows of p in [lo, hi), in
// order, until it has want of them (0: all). It walks the partition in
// chunks, since records of deleted rows (absent) take a place in the tree
// and count for nothing; each chunk's partition version is validated at
// commit like any structure read.
func (x *tx) scanCommitted(p *partition, lo, hi string, desc bool, want int, rows []scanned) []scanned {
	for {
		n := 0
		if want > 0 {
			n = want - len(rows)
		}
		recs, pv := p.rangeRecords(lo, hi, desc, n, x.recs[:0])
		x.recs = recs
		x.nodes = append(x.nodes, nodeEntry{&p.ver, pv})
		rows = slices.Grow(rows, len(recs))
		x.reads = slices.Grow(x.reads, len(recs))
		for _, r := range recs {
			tid, rw := r.readStable()
			x.noteRead(r, tid)
			if tid&tidAbsent == 0 {
				rows = append(rows, scanned{ck: r.ck, rw: rw})
			}
		}
		if n == 0 || len(recs) < n || len(rows) >= want || p.cl == nil {
			return rows
		}
		// Go on past the last record read: in descending order hi is
		// exclusive already, and ck+"\x00" is the least key above ck.
		if last := recs[len(recs)-1].ck; desc {
			hi = last
		} else {
			lo = last + "\x00"
		}
	}
}

func condFailed(op string, tb *table, detail string) error {
	return &storage.Error{Kind: storage.ErrConditionNotMet, Op: op, Namespace: tb.schema.Namespace, Table: tb.schema.Name, Detail: detail}
}

// checkCondition evaluates c on the row as the transaction sees it.
func (x *tx) checkCondition(op string, tb *table, c *storage.Condition, part, clus storage.Values, pk, ck string) error {
	if c == nil {
		return nil
	}
	cols := x.get(tb, pk, ck)
	switch c.Kind {
	case storage.CondIfExists:
		if cols == nil {
			return condFailed(op, tb, "the row does not exist")
		}
	case storage.CondIfNotExists:
		if cols != nil {
			return condFailed(op, tb, "the row exists")
		}
	case storage.CondIf:
		if cols == nil {
			return condFailed(op, tb, "the row does not exist")
		}
		for _, e := range c.Exprs {
			var v storage.Value
			if i, ok := tb.valIdx[e.Column]; ok {
				v = cols[i]
			} else if pv, ok := part[e.Column]; ok {
				v = pv
			} else {
				v = clus[e.Column]
			}
			if !e.Eval(v) {
				return condFailed(op, tb, fmt.Sprintf("%s %v %v does not hold", e.Column, e.Op, e.Value))
			}
		}
	}
	return nil
}

func (x *tx) applyPut(tb *table, p *storage.Put) error {
	pk, ck := tb.encodePartition(p.Partition), tb.encodeClustering(p.Clustering)
	if err := x.checkCondition("put", tb, p.Condition, p.Partition, p.Clustering, pk, ck); err != nil {
		if p.Skippable && errors.Is(err, storage.ErrConditionNotMet) {
			return nil // the condition was read, so it conflicts as a read does
		}
		return err
	}
	n := len(tb.schema.Columns)
	var cols []storage.Value
	var set []bool
	if len(p.Values) == n {
		cols = make([]storage.Value, n) // installed as the row at commit
	} else {
		cols, set = x.partial(n)
	}
	for name, v := range p.Values {
		i := tb.valIdx[name]
		if v.IsNull() {
			v = storage.NullOf(tb.schema.Columns[i].Type)
		}
		cols[i] = v
		if set != nil {
			set[i] = true
		}
	}
	x.put(tb, pk, ck, cols, set)
	return nil
}

func (x *tx) applyDelete(tb *table, d *storage.Delete) error {
	pk, ck := tb.encodePartition(d.Partition), tb.encodeClustering(d.Clustering)
	if err := x.checkCondition("delete", tb, d.Condition, d.Partition, d.Clustering, pk, ck); err != nil {
		return err
	}
	x.del(tb, pk, ck)
	return nil
}

func (t *Txn) Put(ctx context.Context, p *storage.Put) error {
	if p == nil {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "put", Detail: "nil Put"}
	}
	tb, err := t.table("put", p.Namespace, p.Table)
	if err != nil {
		return err
	}
	if err := tb.schema.CheckPut(p, t.db.cfg.Limits); err != nil {
		return err
	}
	err = t.x.applyPut(tb, p)
	if p.Deferred {
		return t.deferred(err)
	}
	return err
}

// deferred is what a Deferred put or an Expect returns: the engine checks
// their condition at once, and one that does not hold ends the
// transaction, as the storage API says a deferred failure does, so that
// nothing of it can commit.
func (t *Txn) deferred(err error) error {
	if errors.Is(err, storage.ErrConditionNotMet) {
		t.end()
	}
	return err
}

func (t *Txn) Delete(ctx context.Context, d *storage.Delete) error {
	if d == nil {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "delete", Detail: "nil Delete"}
	}
	tb, err := t.table("delete", d.Namespace, d.Table)
	if err != nil {
		return err
	}
	if err := tb.schema.CheckDelete(d, t.db.cfg.Limits); err != nil {
		return err
	}
	return t.x.applyDelete(tb, d)
}

// Expect reads the row into the read set and checks the condition now
// (see deferred); validation at commit fails the transaction if the row
// changed since.
func (t *Txn) Expect(ctx context.Context, e *storage.Expect) error {
	if e == nil {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: "expect", Detail: "nil Expect"}
	}
	tb, err := t.table("expect", e.Namespace, e.Table)
	if err != nil {
		return err
	}
	if err := tb.schema.CheckExpect(e, t.db.cfg.Limits); err != nil {
		return err
	}
	pk, ck := tb.encodePartition(e.Partition), tb.encodeClustering(e.Clustering)
	return t.deferred(t.x.checkCondition("expect", tb, e.Condition, e.Partition, e.Clustering, pk, ck))
}

// Commit validates and installs the transaction and returns once it is
// durable: once the durable epoch reaches its commit epoch (for a
// read-only transaction, the epoch of the newest version it read).
func (t *Txn) Commit(ctx context.Context) error {
	if t.x == nil {
		return &storage.Error{Kind: storage.ErrTxnDone, Op: "commit"}
	}
	if err := t.db.usable("commit"); err != nil {
		t.end()
		return err
	}
	e, err := t.x.commit(ctx)
	t.end()
	if err != nil || t.unsynced {
		return err
	}
	return t.db.WaitDurable(ctx, e)
}

func (t *Txn) Abort(ctx context.Context) error {
	if t.x != nil {
		t.end()
	}
	return nil
}

// ---- storage.Ops: single operations as transactions ---------------------------

// Get reads the latest committed row and returns it once it is durable.
func (db *DB) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	return db.get(ctx, g, true)
}

func (db *DB) get(ctx context.Context, g *storage.Get, wait bool) (storage.Row, bool, error) {
	if err := db.usable("get"); err != nil {
		return nil, false, err
	}
	tb, err := db.cat.lookup("get", g.Namespace, g.Table)
	if err != nil {
		return nil, false, err
	}
	if err := tb.schema.CheckGet(g, db.cfg.Limits); err != nil {
		return nil, false, err
	}
	x := tx{db: db}
	cols := x.get(tb, tb.encodePartition(g.Partition), tb.encodeClustering(g.Clustering))
	if wait {
		if err := db.WaitDurable(ctx, tidEpoch(x.readMax)); err != nil {
			return nil, false, err
		}
	}
	if cols == nil {
		return nil, false, nil
	}
	return tb.rowFromKey(g.Partition, g.Clustering, cols, g.Projection), true, nil
}

// Scan reads a partition range atomically (a validated read-only
// transaction, retried on conflict) and streams the materialized rows.
func (db *DB) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	return storage.ScanIn(ctx, db, s)
}

func (db *DB) Put(ctx context.Context, p *storage.Put) error { return storage.PutIn(ctx, db, p) }

func (db *DB) Delete(ctx context.Context, d *storage.Delete) error {
	return storage.DeleteIn(ctx, db, d)
}

// Mutate applies the mutations in one transaction.
func (db *DB) Mutate(ctx context.Context, ms []storage.Mutation) error {
	return storage.MutateIn(ctx, db, ms)
}

// ---- the unsynced view ----------------------------------------------------------

var (
	_ storage.Unsyncer  = (*DB)(nil)
	_ storage.Exclusive = (*DB)(nil)
)

// Unsynced returns a view of the database whose calls return once their
// effects are committed and visible, without waiting for the durable epoch
// (storage.Unsyncer). The engine keeps that interface's promises: an
// effect of epoch e is durable once D ≥ e, a commit that begins after the
// call returned gets an epoch ≥ e (epochs only grow, and a reader's commit
// epoch is at least that of every version it read), so its own durable wait
// covers the effect; a failed log fails every later commit; and the
// database dies with the process that used it.
func (db *DB) Unsynced() storage.Ops { return unsyncedView{db} }

// Shared implements storage.Exclusive: an open engine is the only
// reader and writer of its directory (lockDir). Concurrent first calls for
// one key may each call mk; all get the value stored first.
func (db *DB) Shared(key any, mk func() any) any {
	if v, ok := db.shared.Load(key); ok {
		return v
	}
	v, _ := db.shared.LoadOrStore(key, mk())
	return v
}

type unsyncedView struct{ db *DB }

func (u unsyncedView) Begin(ctx context.Context) (storage.Txn, error) { return u.db.begin(true) }

func (u unsyncedView) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	return u.db.get(ctx, g, false)
}

func (u unsyncedView) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	return storage.ScanIn(ctx, u, s)
}
func (u unsyncedView) Put(ctx context.Context, p *storage.Put) error { return storage.PutIn(ctx, u, p) }
func (u unsyncedView) Delete(ctx context.Context, d *storage.Delete) error {
	return storage.DeleteIn(ctx, u, d)
}
func (u unsyncedView) Mutate(ctx context.Context, ms []storage.Mutation) error {
	return storage.MutateIn(ctx, u, ms)
}
