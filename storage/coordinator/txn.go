package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kiroku-db/kiroku/storage"
)

// txn is a coordinator transaction; see the package documentation.
type txn struct {
	db     *DB
	id     string
	reads  map[string]*readRec
	writes map[string]*writeRec
	scans  []*scanRec
	done   bool
}

// readRec is what the transaction saw of a row: present or not, and its
// committed version and image. A blind record is a row written without
// being read (see blindPut): it is taken to be absent until its prepare
// finds otherwise.
type readRec struct {
	ti          *tableInfo
	part, clust storage.Values
	present     bool
	id          identity    // if present
	row         storage.Row // the store's row, if present
	blind       bool
	stale       bool // prepared by a committed transaction this process did not remember (see tidy)
}

// writeRec is the transaction's write of a row: its new user values, or
// its deletion.
type writeRec struct {
	key    string
	del    bool
	values storage.Values // every value column (NULL where unset)
	// ifAbsent: a blind Deferred IfNotExists put; a row found present
	// when it is prepared fails the transaction with ErrConditionNotMet.
	ifAbsent bool
}

// scanRec is a scan the transaction made, with what it found: key →
// identity of each row's committed image.
type scanRec struct {
	ti    *tableInfo
	scan  storage.Scan
	found map[string]identity
}

func conflict(op, detail string) error {
	return &storage.Error{Kind: storage.ErrConflict, Op: op, Detail: detail}
}

// rowKey names a row of a table.
func rowKey(ti *tableInfo, part, clust storage.Values) string {
	var b strings.Builder
	b.WriteString(ti.user.Namespace)
	b.WriteByte('/')
	b.WriteString(ti.user.Name)
	for _, v := range ti.user.KeyValues(part, clust) {
		s := v.Content()
		if t := v.Type(); t != storage.TypeText && t != storage.TypeBlob {
			s = v.String()
		}
		b.WriteByte('/')
		b.WriteString(strconv.Itoa(int(v.Type())))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String()
}

func (t *txn) check() error {
	if t.done {
		return &storage.Error{Kind: storage.ErrTxnDone, Op: "txn"}
	}
	return nil
}

// fail ends the transaction on err, if it is one that ends it.
func (t *txn) fail(err error) error {
	if errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrClosed) {
		t.done = true
	}
	return err
}

// ---- reading through prepared rows -----------------------------------------

// readRaw reads a row from the store, resolving rows other transactions
// prepared, and returns its committed image (see resolve), or absent.
func (t *txn) readRaw(ctx context.Context, ti *tableInfo, part, clust storage.Values) (_ storage.Row, found, stale bool, _ error) {
	for range 8 {
		row, ok, err := t.db.s.Get(ctx, &storage.Get{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: part, Clustering: clust})
		if err != nil || !ok {
			return nil, false, false, err
		}
		committed, stale, err := t.db.resolve(ctx, ti, row)
		if err != nil {
			return nil, false, false, err
		}
		if committed {
			return row, true, stale, nil
		}
	}
	return nil, false, false, conflict("get", "a row kept being prepared by other transactions")
}

// identity is what tells a row's committed images apart: its version and
// the transaction that wrote it (cc_tx). The version alone would not: a
// row deleted and inserted again starts again at version 1.
type identity struct {
	version int64
	tx      storage.Value // TEXT, or NULL for a row rolled back before the transaction id was kept
}

func identityOf(row storage.Row) identity {
	return identity{version: row[colVersion].AsBigInt(), tx: valueOr(row, colTx)}
}

func (a identity) equal(b identity) bool {
	return a.version == b.version && a.tx.IsNull() == b.tx.IsNull() && (a.tx.IsNull() || a.tx.Equal(b.tx))
}

// decision returns a transaction's recorded decision, or 0. A committed
// decision, which never changes, is remembered; remembered says the
// decision was.
func (db *DB) decision(ctx context.Context, tx string) (d int64, remembered bool, _ error) {
	if db.committed.has(tx) {
		return decCommitted, true, nil
	}
	row, ok, err := db.s.Get(ctx, &storage.Get{Namespace: db.cfg.Namespace, Table: stateTable, Partition: storage.Values{"tx": storage.Text(tx)}})
	if err != nil || !ok {
		return 0, false, err
	}
	d = row["decision"].AsBigInt()
	if d == decCommitted {
		db.committed.add(tx)
	}
	return d, false, nil
}

// decide records decision d for tx unless one is recorded, and returns
// the one recorded.
func (db *DB) decide(ctx context.Context, tx string, d int64) (int64, error) {
	err := db.s.Put(ctx, &storage.Put{Namespace: db.cfg.Namespace, Table: stateTable, Partition: storage.Values{"tx": storage.Text(tx)},
		Values: storage.Values{"decision": storage.BigInt(d), "at": storage.BigInt(db.cfg.Now().UnixMicro())}, Condition: storage.IfNotExists()})
	if err == nil {
		if d == decCommitted {
			db.committed.add(tx)
		}
		return d, nil
	}
	if !errors.Is(err, storage.ErrConditionNotMet) {
		return 0, err
	}
	d, _, err = db.decision(ctx, tx)
	return d, err
}

// resolve judges a row read from the store. It returns true if the row is
// a committed image as it stands: committed, or prepared (not for
// deletion) by a transaction that committed — the commit does not
// rewrite the rows it prepared (see the package doc), so the prepared
// image is the committed one. stale says the row is such a prepared one
// whose decision had to be read from the state table: this process had
// not made it or had forgotten it, and another reader may not have it
// either (see tidy). Otherwise resolve finishes, one way or the other,
// the transaction that prepared the row, if that has decided or expired,
// and returns false (read the row again); if not, it is a conflict.
func (db *DB) resolve(ctx context.Context, ti *tableInfo, row storage.Row) (committed, stale bool, _ error) {
	state := row[colState].AsBigInt()
	if state == stateCommitted {
		return true, false, nil
	}
	tx := row[colTx].AsText()
	d, remembered, err := db.decision(ctx, tx)
	if err != nil {
		return false, false, err
	}
	if d == 0 {
		age := db.cfg.Now().UnixMicro() - row[colPrepared].AsBigInt()
		if age < db.cfg.Expiry.Microseconds() {
			return false, false, conflict("read", fmt.Sprintf("a row is prepared by transaction %s, undecided", tx))
		}
		if d, err = db.decide(ctx, tx, decAborted); err != nil {
			return false, false, err
		}
	}
	switch {
	case d == decCommitted && state == statePrepared:
		return true, !remembered, nil
	case d == decCommitted:
		return false, false, db.rollForward(ctx, ti, row, tx)
	}
	return false, false, db.rollBack(ctx, ti, row, tx)
}

// tidy rolls forward the stale rows the transaction read and did not
// write (see resolve): committed, with their version and image as they
// are, so that the next reader need not look up their decision. Their
// identity does not change, so this changes nothing the transaction
// read, and a failure changes nothing at all. A row the transaction
// writes is not rolled forward: its prepare or commit rewrites it.
func (t *txn) tidy(ctx context.Context) {
	for k, r := range t.reads {
		if r.stale && t.writes[k] == nil {
			_ = t.db.rollForward(ctx, r.ti, r.row, r.row[colTx].AsText())
			r.stale = false
		}
	}
}

// heldBy is the condition that tx still holds a row it prepared.
func heldBy(tx string) *storage.Condition {
	return storage.If(storage.Eq(colTx, storage.Text(tx)), storage.Ne(colState, storage.BigInt(stateCommitted)))
}

// ignoreLost drops the failure of a conditional write that another
// process made unnecessary.
func ignoreLost(err error) error {
	if errors.Is(err, storage.ErrConditionNotMet) {
		return nil
	}
	return err
}

func (db *DB) rollForward(ctx context.Context, ti *tableInfo, row storage.Row, tx string) error {
	part, clust := keyOf(ti, row)
	if row[colState].AsBigInt() == statePreparedDel {
		return ignoreLost(db.s.Delete(ctx, &storage.Delete{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: part, Clustering: clust,
			Condition: heldBy(tx)}))
	}
	return ignoreLost(db.s.Put(ctx, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: part, Clustering: clust,
		Values: storage.Values{colState: storage.BigInt(stateCommitted)}, Condition: heldBy(tx)}))
}

func (db *DB) rollBack(ctx context.Context, ti *tableInfo, row storage.Row, tx string) error {
	part, clust := keyOf(ti, row)
	if !row[colBefPresent].AsBool() {
		return ignoreLost(db.s.Delete(ctx, &storage.Delete{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: part, Clustering: clust,
			Condition: heldBy(tx)}))
	}
	// cc_tx stays the aborted transaction's: the image restored gets an
	// identity no other image of the row has had (see identity).
	vals := storage.Values{colState: storage.BigInt(stateCommitted), colVersion: row[colBefVersion]}
	for _, c := range ti.user.Columns {
		vals[c.Name] = valueOr(row, befPrefix+c.Name)
	}
	return ignoreLost(db.s.Put(ctx, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: part, Clustering: clust,
		Values: vals, Condition: heldBy(tx)}))
}

func valueOr(row storage.Row, col string) storage.Value {
	if v, ok := row[col]; ok {
		return v
	}
	return storage.Null()
}

// keyOf is a store row's key.
func keyOf(ti *tableInfo, row storage.Row) (part, clust storage.Values) {
	part = storage.Values{}
	for _, c := range ti.user.PartitionKey {
		part[c.Name] = row[c.Name]
	}
	if len(ti.user.ClusteringKey) > 0 {
		clust = storage.Values{}
		for _, c := range ti.user.ClusteringKey {
			clust[c.Name] = row[c.Name]
		}
	}
	return part, clust
}

// userRow is a store row's user columns, projected.
func userRow(ti *tableInfo, row storage.Row, proj []string) storage.Row {
	out := storage.Row{}
	for _, n := range ti.user.ColumnNames() {
		if len(proj) == 0 || slices.Contains(proj, n) {
			out[n] = valueOr(row, n)
		}
	}
	return out
}

// ---- the transaction's view ------------------------------------------------

// view is the row as this transaction sees it: its own write, or what it
// read (reading it now if it has not). It returns the user row (nil if
// absent).
func (t *txn) view(ctx context.Context, ti *tableInfo, part, clust storage.Values) (storage.Row, string, error) {
	key := rowKey(ti, part, clust)
	if w := t.writes[key]; w != nil {
		if w.del {
			return nil, key, nil
		}
		row := storage.Row{}
		for k, v := range part {
			row[k] = v
		}
		for k, v := range clust {
			row[k] = v
		}
		for k, v := range w.values {
			row[k] = v
		}
		return row, key, nil
	}
	r, err := t.read(ctx, ti, key, part, clust)
	if err != nil || !r.present {
		return nil, key, err
	}
	return userRow(ti, r.row, nil), key, nil
}

// read reads a row once per transaction: a row read before is not read
// again (the commit checks it is still what was read), and a blind
// record is replaced by a real read.
func (t *txn) read(ctx context.Context, ti *tableInfo, key string, part, clust storage.Values) (*readRec, error) {
	if old := t.reads[key]; old != nil && !old.blind {
		return old, nil
	}
	row, ok, stale, err := t.readRaw(ctx, ti, part, clust)
	if err != nil {
		return nil, err
	}
	// The caller may refill its request's maps once the call returns.
	r := &readRec{ti: ti, part: cloneValues(part), clust: cloneValues(clust), present: ok, row: row, stale: stale}
	if ok {
		r.id = identityOf(row)
	}
	t.reads[key] = r
	return r, nil
}

// blindPut says whether p is written without reading its row first: a
// Deferred IfNotExists put, whose condition may be checked as late as
// the commit, and there is checked by the conditional write that
// prepares the row (or commits it, in one phase) on condition that it is
// absent, as the transaction takes it to be. A row found present there is
// read: if it exists, the put's condition fails; if not (it was being
// written by a transaction that did not commit), it is written again.
// (An unconditional put that sets every column could be written blind
// too, but an update of a row that exists would then cost a conditional
// write more than the read it saves.)
func blindPut(p *storage.Put) bool {
	return p.Deferred && p.Condition != nil && p.Condition.Kind == storage.CondIfNotExists
}

func (t *txn) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	if err := t.check(); err != nil {
		return nil, false, err
	}
	ti, err := t.db.table(ctx, g.Namespace, g.Table)
	if err != nil {
		return nil, false, err
	}
	if err := ti.user.CheckGet(g, t.db.lim); err != nil {
		return nil, false, err
	}
	row, _, err := t.view(ctx, ti, g.Partition, g.Clustering)
	if err != nil {
		return nil, false, t.fail(err)
	}
	if row == nil {
		return nil, false, nil
	}
	return userRow(ti, row, g.Projection), true, nil
}

// holds evaluates c against row (nil: absent).
func holds(c *storage.Condition, row storage.Row) bool {
	if c == nil {
		return true
	}
	switch c.Kind {
	case storage.CondIfExists:
		return row != nil
	case storage.CondIfNotExists:
		return row == nil
	}
	if row == nil {
		return false
	}
	for _, e := range c.Exprs {
		if !e.Eval(valueOr(row, e.Column)) {
			return false
		}
	}
	return true
}

func notMet(op string, ti *tableInfo) error {
	return &storage.Error{Kind: storage.ErrConditionNotMet, Op: op, Namespace: ti.user.Namespace, Table: ti.user.Name}
}

func (t *txn) Put(ctx context.Context, p *storage.Put) error {
	if err := t.check(); err != nil {
		return err
	}
	ti, err := t.db.table(ctx, p.Namespace, p.Table)
	if err != nil {
		return err
	}
	if err := ti.user.CheckPut(p, t.db.lim); err != nil {
		return err
	}
	key := rowKey(ti, p.Partition, p.Clustering)
	if t.writes[key] == nil && t.reads[key] == nil && blindPut(p) {
		vals := storage.Values{}
		for _, c := range ti.user.Columns {
			vals[c.Name] = storage.Null()
		}
		for k, v := range p.Values {
			vals[k] = v
		}
		t.reads[key] = &readRec{ti: ti, part: cloneValues(p.Partition), clust: cloneValues(p.Clustering), blind: true}
		t.writes[key] = &writeRec{key: key, values: vals, ifAbsent: true}
		return nil
	}
	cur, key, err := t.view(ctx, ti, p.Partition, p.Clustering)
	if err != nil {
		return t.fail(err)
	}
	if !holds(p.Condition, cur) {
		if p.Skippable {
			return nil
		}
		if p.Deferred {
			t.done = true // a deferred failure ends the transaction
		}
		return notMet("put", ti)
	}
	vals := storage.Values{}
	for _, c := range ti.user.Columns {
		vals[c.Name] = valueOr(cur, c.Name)
		if cur == nil {
			vals[c.Name] = storage.Null()
		}
	}
	for k, v := range p.Values {
		vals[k] = v
	}
	// (view read the row first: its read record holds the key for commit)
	w := &writeRec{key: key, values: vals}
	if old := t.writes[key]; old != nil && !old.del {
		w.ifAbsent = old.ifAbsent // a blind put's condition still stands
	}
	t.writes[key] = w
	return nil
}

func (t *txn) Delete(ctx context.Context, d *storage.Delete) error {
	if err := t.check(); err != nil {
		return err
	}
	ti, err := t.db.table(ctx, d.Namespace, d.Table)
	if err != nil {
		return err
	}
	if err := ti.user.CheckDelete(d, t.db.lim); err != nil {
		return err
	}
	key := rowKey(ti, d.Partition, d.Clustering)
	if r := t.reads[key]; r != nil && r.blind {
		// Deleting needs the row's image: read it now.
		w := t.writes[key]
		r, err := t.read(ctx, ti, key, d.Partition, d.Clustering)
		if err != nil {
			return t.fail(err)
		}
		if w.ifAbsent && r.present {
			t.done = true // the Deferred put's condition fails
			return notMet("put", ti)
		}
	}
	cur, key, err := t.view(ctx, ti, d.Partition, d.Clustering)
	if err != nil {
		return t.fail(err)
	}
	if !holds(d.Condition, cur) {
		return notMet("delete", ti)
	}
	if r := t.reads[key]; r != nil && !r.present {
		delete(t.writes, key) // it was never there: nothing to write
		return nil
	}
	t.writes[key] = &writeRec{key: key, del: true}
	return nil
}

func (t *txn) Expect(ctx context.Context, e *storage.Expect) error {
	if err := t.check(); err != nil {
		return err
	}
	ti, err := t.db.table(ctx, e.Namespace, e.Table)
	if err != nil {
		return err
	}
	if err := ti.user.CheckExpect(e, t.db.lim); err != nil {
		return err
	}
	cur, _, err := t.view(ctx, ti, e.Partition, e.Clustering)
	if err != nil {
		return t.fail(err)
	}
	if !holds(e.Condition, cur) {
		t.done = true
		return notMet("expect", ti)
	}
	return nil
}

// ---- scans -----------------------------------------------------------------

// scanRaw scans a partition in the store, resolving other transactions'
// prepared rows, and returns the committed images (see resolve) in the
// table's order. The rows are all read before any is resolved: the scan
// reads one state of the partition.
func (t *txn) scanRaw(ctx context.Context, ti *tableInfo, s *storage.Scan) ([]storage.Row, error) {
	for range 8 {
		rows, err := t.db.s.Scan(ctx, &storage.Scan{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: s.Partition,
			Start: s.Start, End: s.End})
		if err != nil {
			return nil, err
		}
		var out []storage.Row
		for rows.Next() {
			out = append(out, cloneRow(rows.Row()))
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
		again := false
		for _, r := range out {
			committed, stale, err := t.db.resolve(ctx, ti, r)
			if err != nil {
				return nil, err
			}
			if !committed {
				again = true // the row was rolled forward or back: scan again
				break
			}
			if stale {
				// As tidy does for a row read: a scan's rows are more
				// often read again than written.
				_ = t.db.rollForward(ctx, ti, r, r[colTx].AsText())
			}
		}
		if !again {
			return out, nil
		}
	}
	return nil, conflict("scan", "rows kept being prepared by other transactions")
}

func cloneValues(v storage.Values) storage.Values {
	if v == nil {
		return nil
	}
	return cloneRow(v)
}

func cloneBound(b *storage.Bound) *storage.Bound {
	if b == nil {
		return nil
	}
	return &storage.Bound{Key: cloneValues(b.Key), Inclusive: b.Inclusive}
}

func cloneRow(r storage.Row) storage.Row {
	out := make(storage.Row, len(r))
	for k, v := range r {
		out[k] = v
	}
	return out
}

func (t *txn) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	ti, err := t.db.table(ctx, s.Namespace, s.Table)
	if err != nil {
		return nil, err
	}
	if err := ti.user.CheckScan(s, t.db.lim); err != nil {
		return nil, err
	}
	raw, err := t.scanRaw(ctx, ti, s)
	if err != nil {
		return nil, t.fail(err)
	}
	rec := &scanRec{ti: ti, scan: storage.Scan{Partition: cloneValues(s.Partition), Start: cloneBound(s.Start), End: cloneBound(s.End)},
		found: map[string]identity{}}
	byKey := map[string]storage.Row{}
	for _, r := range raw {
		part, clust := keyOf(ti, r)
		k := rowKey(ti, part, clust)
		rec.found[k] = identityOf(r)
		byKey[k] = userRow(ti, r, nil)
	}
	t.scans = append(t.scans, rec)
	// The transaction's own writes to the range.
	for k, w := range t.writes {
		r := t.reads[k]
		if r == nil || r.ti != ti || !samePartition(r.part, s.Partition) || !inBounds(ti.user, r.clust, s) {
			continue
		}
		if w.del {
			delete(byKey, k)
			continue
		}
		row, _, _ := t.view(ctx, ti, r.part, r.clust)
		byKey[k] = row
	}
	out := make([]storage.Row, 0, len(byKey))
	for _, r := range byKey {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b storage.Row) int { return compareClustering(ti.user, a, b) })
	if s.Order == storage.Desc {
		slices.Reverse(out)
	}
	if s.Limit > 0 && len(out) > s.Limit {
		out = out[:s.Limit]
	}
	for i, r := range out {
		out[i] = userRow(ti, r, s.Projection)
	}
	return storage.SliceRows(out), nil
}

func samePartition(a, b storage.Values) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || storage.Compare(v, w) != 0 || v.Type() != w.Type() {
			return false
		}
	}
	return true
}

// compareClustering orders two rows by the table's clustering order.
func compareClustering(t *storage.Table, a, b storage.Row) int {
	for _, c := range t.ClusteringKey {
		x := storage.Compare(a[c.Name], b[c.Name])
		if c.Order == storage.Desc {
			x = -x
		}
		if x != 0 {
			return x
		}
	}
	return 0
}

// comparePrefix orders a clustering key against a bound's prefix in the
// table's clustering order.
func comparePrefix(t *storage.Table, clust, bound storage.Values) int {
	for _, c := range t.ClusteringKey {
		bv, ok := bound[c.Name]
		if !ok {
			return 0
		}
		x := storage.Compare(clust[c.Name], bv)
		if c.Order == storage.Desc {
			x = -x
		}
		if x != 0 {
			return x
		}
	}
	return 0
}

func inBounds(t *storage.Table, clust storage.Values, s *storage.Scan) bool {
	if s.Start != nil {
		c := comparePrefix(t, clust, s.Start.Key)
		if c < 0 || c == 0 && !s.Start.Inclusive {
			return false
		}
	}
	if s.End != nil {
		c := comparePrefix(t, clust, s.End.Key)
		if c > 0 || c == 0 && !s.End.Inclusive {
			return false
		}
	}
	return true
}

// ---- commit ----------------------------------------------------------------

func (t *txn) Abort(context.Context) error {
	t.done = true
	return nil
}

func (t *txn) Commit(ctx context.Context) error {
	if err := t.check(); err != nil {
		return err
	}
	t.done = true
	db := t.db
	t.tidy(ctx)
	keys := make([]string, 0, len(t.writes))
	for k := range t.writes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 0 && len(t.reads)+len(t.scans) <= 1 {
		return nil // one read is atomic on its own: nothing to check
	}
	if len(keys) > 0 && t.onePartition() {
		return t.commitPartition(ctx, keys)
	}
	now := db.cfg.Now().UnixMicro()
	var prepared []string
	abort := func(cause error) error {
		cause = undecided(cause)
		if len(prepared) > 0 {
			// Even when the caller's context has ended (the likeliest
			// cause), for as long as readers would otherwise leave the
			// rows locked: they need not wait for the expiry then.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), db.cfg.Expiry)
			defer cancel()
			if d, err := db.decide(ctx, t.id, decAborted); err != nil || d != decAborted {
				// Undecidable here; readers will abort it once it expires.
				return cause
			}
			for _, k := range prepared {
				t.undo(ctx, k)
			}
		}
		return cause
	}
	// 1. Prepare.
	for _, k := range keys {
		written, err := t.prepare(ctx, k, now)
		if written {
			prepared = append(prepared, k) // it may have been written
		}
		if err != nil {
			return abort(err)
		}
	}
	// 2. Validate what was only read.
	if err := t.validate(ctx); err != nil {
		return abort(err)
	}
	// 3. Decide.
	if len(keys) > 0 {
		d, err := db.decide(ctx, t.id, decCommitted)
		if err != nil {
			return &storage.Error{Kind: storage.ErrCommitUnknown, Op: "commit", Detail: err.Error()}
		}
		if d != decCommitted {
			for _, k := range prepared {
				t.undo(ctx, k)
			}
			return conflict("commit", "a reader aborted the transaction while it committed")
		}
	}
	// 4. Delete the rows it deletes; readers finish what is left. The rows
	// it puts stay as prepared: with the decision recorded, their images
	// are the committed ones.
	for _, k := range keys {
		if !t.writes[k].del {
			continue
		}
		r := t.reads[k]
		row := storage.Row{colTx: storage.Text(t.id), colState: storage.BigInt(statePreparedDel)}
		for kk, v := range r.part {
			row[kk] = v
		}
		for kk, v := range r.clust {
			row[kk] = v
		}
		_ = db.rollForward(ctx, r.ti, row, t.id)
	}
	return nil
}

// undecided is the error of a commit that failed before its decision.
// The transaction did not commit, whatever the store said of the write
// that failed: only the transaction itself can decide "committed", and it
// will not. A prepare of unknown outcome is undone by the abort, or by a
// reader once it expires. So ErrCommitUnknown becomes ErrUnavailable:
// nothing committed, retryable.
func undecided(err error) error {
	if !errors.Is(err, storage.ErrCommitUnknown) {
		return err
	}
	return &storage.Error{Kind: storage.ErrUnavailable, Op: "commit", Detail: "a write before the decision failed, and the transaction did not commit: " + err.Error()}
}

// readCond is the condition that a row is still what the transaction
// read: the same committed image (its identity: the row may be committed,
// or still prepared by the transaction that wrote that image and
// committed), or still absent (a blind record included).
func readCond(r *readRec) *storage.Condition {
	if !r.present {
		return storage.IfNotExists()
	}
	tx := storage.IsNull(colTx)
	if !r.id.tx.IsNull() {
		tx = storage.Eq(colTx, r.id.tx)
	}
	return storage.If(storage.Eq(colVersion, storage.BigInt(r.id.version)), tx)
}

// prepare puts row k in the prepared state, on condition that it is
// still what the transaction read. A blind row found present is read and
// prepared again: the write does not depend on what the row held, unless
// it is a Deferred IfNotExists put, whose condition then fails. written
// says whether the row may have been written.
func (t *txn) prepare(ctx context.Context, k string, now int64) (written bool, _ error) {
	w := t.writes[k]
	for {
		r := t.reads[k]
		ti := r.ti
		vals := storage.Values{colTx: storage.Text(t.id), colState: storage.BigInt(statePrepared), colVersion: storage.BigInt(r.id.version + 1),
			colPrepared: storage.BigInt(now), colBefPresent: storage.Bool(r.present), colBefVersion: storage.BigInt(r.id.version)}
		if w.del {
			vals[colState] = storage.BigInt(statePreparedDel)
		}
		for _, c := range ti.user.Columns {
			old := storage.Null()
			if r.present {
				old = valueOr(r.row, c.Name)
			}
			vals[befPrefix+c.Name] = old
			if w.del {
				vals[c.Name] = old
			} else {
				vals[c.Name] = w.values[c.Name]
			}
		}
		err := t.db.s.Put(ctx, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: r.part, Clustering: r.clust,
			Values: vals, Condition: readCond(r)})
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, storage.ErrConditionNotMet):
			return true, err
		case !r.blind:
			return false, conflict("commit", "a row written changed since the transaction read it")
		}
		if err := t.readBlind(ctx, k); err != nil {
			return false, err
		}
	}
}

// readBlind reads the row of blind record k, which its conditional write
// found present; a Deferred IfNotExists put's condition then fails.
func (t *txn) readBlind(ctx context.Context, k string) error {
	r := t.reads[k]
	r, err := t.read(ctx, r.ti, k, r.part, r.clust)
	if err != nil {
		return err
	}
	if t.writes[k].ifAbsent && r.present {
		return notMet("put", r.ti)
	}
	return nil
}

// onePartition says whether the transaction can commit in one phase: it
// made no scan, wrote every row it read, and wrote rows of one partition
// of one table only.
func (t *txn) onePartition() bool {
	if len(t.scans) > 0 {
		return false
	}
	var first *readRec
	for k, r := range t.reads {
		if t.writes[k] == nil {
			return false
		}
		if first == nil {
			first = r
			continue
		}
		if r.ti != first.ti || !samePartition(r.part, first.part) {
			return false
		}
	}
	return true
}

// commitPartition commits, in one phase, a transaction that read and
// wrote rows of one partition only (onePartition): one conditional Mutate
// puts every row in its committed state if each is still the version read
// (or still absent). That Mutate is the commit point: it is atomic, no
// other partition needs to agree, so no decision row is needed, and no
// reader ever meets the rows prepared. A blind row found present is read
// and the Mutate sent again. A Mutate whose reply is lost leaves the
// outcome unknown.
func (t *txn) commitPartition(ctx context.Context, keys []string) error {
	for attempt := 0; ; attempt++ {
		ms := make([]storage.Mutation, 0, len(keys))
		blind := false
		for _, k := range keys {
			w, r := t.writes[k], t.reads[k]
			ti := r.ti
			blind = blind || r.blind
			if w.del {
				if !r.present {
					continue // nothing was there
				}
				ms = append(ms, &storage.Delete{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: r.part, Clustering: r.clust,
					Condition: readCond(r)})
				continue
			}
			vals := storage.Values{colTx: storage.Text(t.id), colState: storage.BigInt(stateCommitted), colVersion: storage.BigInt(r.id.version + 1),
				colPrepared: storage.Null(), colBefPresent: storage.Null(), colBefVersion: storage.Null()}
			for _, c := range ti.user.Columns {
				vals[c.Name] = w.values[c.Name]
				vals[befPrefix+c.Name] = storage.Null()
			}
			ms = append(ms, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: r.part, Clustering: r.clust,
				Values: vals, Condition: readCond(r)})
		}
		var err error
		switch len(ms) {
		case 0:
			return nil
		case 1:
			switch m := ms[0].(type) {
			case *storage.Put:
				err = t.db.s.Put(ctx, m)
			case *storage.Delete:
				err = t.db.s.Delete(ctx, m)
			}
		default:
			err = t.db.s.Mutate(ctx, ms)
		}
		var se *storage.Error
		switch {
		case err == nil:
			return nil
		case errors.Is(err, storage.ErrConditionNotMet) && blind && attempt == 0:
			// Read the blind rows and try again.
			for _, k := range keys {
				if t.reads[k].blind {
					if err := t.readBlind(ctx, k); err != nil {
						return err
					}
				}
			}
			continue
		case errors.Is(err, storage.ErrConditionNotMet):
			return conflict("commit", "a row written changed since the transaction read it")
		case errors.As(err, &se):
			return err // the store says what became of the write
		}
		return &storage.Error{Kind: storage.ErrCommitUnknown, Op: "commit", Detail: err.Error(), Cause: err}
	}
}

// undo rolls back the row k this transaction prepared.
func (t *txn) undo(ctx context.Context, k string) {
	r := t.reads[k]
	row, ok, err := t.db.s.Get(ctx, &storage.Get{Namespace: r.ti.inner.Namespace, Table: r.ti.inner.Name, Partition: r.part, Clustering: r.clust})
	if err != nil || !ok || !row[colTx].IsNull() && row[colTx].AsText() != t.id {
		return
	}
	_ = t.db.rollBack(ctx, r.ti, row, t.id)
}

// validate checks that what the transaction read and did not write is
// unchanged: each row is still the image read (its identity, whether the
// row is committed or still prepared by the transaction that wrote that
// image), or still absent.
func (t *txn) validate(ctx context.Context) error {
	for k, r := range t.reads {
		if t.writes[k] != nil {
			continue
		}
		row, ok, err := t.db.s.Get(ctx, &storage.Get{Namespace: r.ti.inner.Namespace, Table: r.ti.inner.Name, Partition: r.part, Clustering: r.clust})
		if err != nil {
			return err
		}
		if ok != r.present || ok && !identityOf(row).equal(r.id) {
			return conflict("commit", "a row read changed before the transaction committed")
		}
	}
	for _, s := range t.scans {
		rows, err := t.db.s.Scan(ctx, &storage.Scan{Namespace: s.ti.inner.Namespace, Table: s.ti.inner.Name, Partition: s.scan.Partition,
			Start: s.scan.Start, End: s.scan.End})
		if err != nil {
			return err
		}
		now := map[string]identity{}
		for rows.Next() {
			r := rows.Row()
			part, clust := keyOf(s.ti, r)
			k := rowKey(s.ti, part, clust)
			if r[colState].AsBigInt() != stateCommitted && r[colTx].AsText() == t.id {
				// Prepared by this transaction, on condition that it was
				// still the image the transaction read, or absent.
				if rr := t.reads[k]; rr != nil && rr.present {
					now[k] = rr.id
				}
				continue
			}
			// Anything else is the image found only if its identity is: a
			// row prepared by another transaction since has another.
			now[k] = identityOf(r)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return err
		}
		if len(now) != len(s.found) {
			return conflict("commit", "a range read changed before the transaction committed")
		}
		for k, v := range s.found {
			if w, ok := now[k]; !ok || !w.equal(v) {
				return conflict("commit", "a range read changed before the transaction committed")
			}
		}
	}
	return nil
}
