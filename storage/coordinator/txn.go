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
// committed version and image.
type readRec struct {
	ti          *tableInfo
	part, clust storage.Values
	present     bool
	version     int64
	row         storage.Row // the store's row, if present
}

// writeRec is the transaction's write of a row: its new user values, or
// its deletion.
type writeRec struct {
	key    string
	del    bool
	values storage.Values // every value column (NULL where unset)
}

// scanRec is a scan the transaction made, with what it found (rows it
// had not written): key → version.
type scanRec struct {
	ti    *tableInfo
	scan  storage.Scan
	found map[string]int64
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
// prepared, and returns it committed, or absent.
func (t *txn) readRaw(ctx context.Context, ti *tableInfo, part, clust storage.Values) (storage.Row, bool, error) {
	for range 8 {
		row, ok, err := t.db.s.Get(ctx, &storage.Get{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: part, Clustering: clust})
		if err != nil || !ok {
			return nil, false, err
		}
		if row[colState].AsBigInt() == stateCommitted {
			return row, true, nil
		}
		if err := t.db.resolve(ctx, ti, row); err != nil {
			return nil, false, err
		}
	}
	return nil, false, conflict("get", "a row kept being prepared by other transactions")
}

// decision returns a transaction's recorded decision, or 0.
func (db *DB) decision(ctx context.Context, tx string) (int64, error) {
	row, ok, err := db.s.Get(ctx, &storage.Get{Namespace: db.cfg.Namespace, Table: stateTable, Partition: storage.Values{"tx": storage.Text(tx)}})
	if err != nil || !ok {
		return 0, err
	}
	return row["decision"].AsBigInt(), nil
}

// decide records decision d for tx unless one is recorded, and returns
// the one recorded.
func (db *DB) decide(ctx context.Context, tx string, d int64) (int64, error) {
	err := db.s.Put(ctx, &storage.Put{Namespace: db.cfg.Namespace, Table: stateTable, Partition: storage.Values{"tx": storage.Text(tx)},
		Values: storage.Values{"decision": storage.BigInt(d), "at": storage.BigInt(db.cfg.Now().UnixMicro())}, Condition: storage.IfNotExists()})
	if err == nil {
		return d, nil
	}
	if !errors.Is(err, storage.ErrConditionNotMet) {
		return 0, err
	}
	return db.decision(ctx, tx)
}

// resolve finishes, one way or the other, the transaction that prepared
// row, if it has decided or has expired; otherwise it is a conflict.
func (db *DB) resolve(ctx context.Context, ti *tableInfo, row storage.Row) error {
	tx := row[colTx].AsText()
	d, err := db.decision(ctx, tx)
	if err != nil {
		return err
	}
	if d == 0 {
		age := db.cfg.Now().UnixMicro() - row[colPrepared].AsBigInt()
		if age < db.cfg.Expiry.Microseconds() {
			return conflict("read", fmt.Sprintf("a row is prepared by transaction %s, undecided", tx))
		}
		if d, err = db.decide(ctx, tx, decAborted); err != nil {
			return err
		}
	}
	if d == decCommitted {
		return db.rollForward(ctx, ti, row, tx)
	}
	return db.rollBack(ctx, ti, row, tx)
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
	vals := storage.Values{colState: storage.BigInt(stateCommitted), colVersion: row[colBefVersion], colTx: storage.Null()}
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

// read reads a row once per transaction; a second read that finds
// another version is a conflict.
func (t *txn) read(ctx context.Context, ti *tableInfo, key string, part, clust storage.Values) (*readRec, error) {
	row, ok, err := t.readRaw(ctx, ti, part, clust)
	if err != nil {
		return nil, err
	}
	// The caller may refill its request's maps once the call returns.
	r := &readRec{ti: ti, part: cloneValues(part), clust: cloneValues(clust), present: ok, row: row}
	if ok {
		r.version = row[colVersion].AsBigInt()
	}
	if old := t.reads[key]; old != nil {
		if old.present != r.present || old.version != r.version {
			return nil, conflict("read", "a row changed since the transaction read it")
		}
		return old, nil
	}
	t.reads[key] = r
	return r, nil
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
	t.writes[key] = &writeRec{key: key, values: vals}
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
// prepared rows, and returns the committed rows in the table's order.
func (t *txn) scanRaw(ctx context.Context, ti *tableInfo, s *storage.Scan) ([]storage.Row, error) {
	for range 8 {
		rows, err := t.db.s.Scan(ctx, &storage.Scan{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: s.Partition,
			Start: s.Start, End: s.End})
		if err != nil {
			return nil, err
		}
		var out []storage.Row
		var pending storage.Row
		for rows.Next() {
			r := rows.Row()
			if r[colState].AsBigInt() != stateCommitted {
				pending = cloneRow(r)
				break
			}
			out = append(out, cloneRow(r))
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
		if pending == nil {
			return out, nil
		}
		if err := t.db.resolve(ctx, ti, pending); err != nil {
			return nil, err
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
		found: map[string]int64{}}
	byKey := map[string]storage.Row{}
	for _, r := range raw {
		part, clust := keyOf(ti, r)
		k := rowKey(ti, part, clust)
		rec.found[k] = r[colVersion].AsBigInt()
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
	keys := make([]string, 0, len(t.writes))
	for k := range t.writes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 1 && len(t.scans) == 0 && len(t.reads) == 1 {
		return t.commitOne(ctx, keys[0])
	}
	now := db.cfg.Now().UnixMicro()
	var prepared []string
	abort := func(cause error) error {
		cause = undecided(cause)
		if len(prepared) > 0 {
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
		w, r := t.writes[k], t.reads[k]
		ti := r.ti
		vals := storage.Values{colTx: storage.Text(t.id), colState: storage.BigInt(statePrepared), colVersion: storage.BigInt(r.version + 1),
			colPrepared: storage.BigInt(now), colBefPresent: storage.Bool(r.present), colBefVersion: storage.BigInt(r.version)}
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
		cond := storage.IfNotExists()
		if r.present {
			cond = storage.If(storage.Eq(colVersion, storage.BigInt(r.version)), storage.Eq(colState, storage.BigInt(stateCommitted)))
		}
		err := db.s.Put(ctx, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: r.part, Clustering: r.clust,
			Values: vals, Condition: cond})
		if errors.Is(err, storage.ErrConditionNotMet) {
			return abort(conflict("commit", "a row written changed since the transaction read it"))
		}
		if err != nil {
			prepared = append(prepared, k) // it may have been written
			return abort(err)
		}
		prepared = append(prepared, k)
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
	// 4. Commit the rows; readers finish what is left.
	for _, k := range keys {
		r := t.reads[k]
		row := storage.Row{colTx: storage.Text(t.id), colState: storage.BigInt(statePrepared)}
		if t.writes[k].del {
			row[colState] = storage.BigInt(statePreparedDel)
		}
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

// commitOne commits a transaction that read and wrote one row only, in
// one phase: a single conditional write puts the row in its committed
// state if it is still the version read (or still absent). That write is
// the commit point: no other row needs to agree, so no decision row is
// needed, and no reader ever meets the row prepared. A write whose reply
// is lost leaves the outcome unknown.
func (t *txn) commitOne(ctx context.Context, k string) error {
	w, r := t.writes[k], t.reads[k]
	ti := r.ti
	cond := storage.IfNotExists()
	if r.present {
		cond = storage.If(storage.Eq(colVersion, storage.BigInt(r.version)), storage.Eq(colState, storage.BigInt(stateCommitted)))
	}
	var err error
	if w.del {
		if !r.present {
			return nil // nothing was there
		}
		err = t.db.s.Delete(ctx, &storage.Delete{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: r.part, Clustering: r.clust,
			Condition: cond})
	} else {
		vals := storage.Values{colTx: storage.Text(t.id), colState: storage.BigInt(stateCommitted), colVersion: storage.BigInt(r.version + 1),
			colPrepared: storage.Null(), colBefPresent: storage.Null(), colBefVersion: storage.Null()}
		for _, c := range ti.user.Columns {
			vals[c.Name] = w.values[c.Name]
			vals[befPrefix+c.Name] = storage.Null()
		}
		err = t.db.s.Put(ctx, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: r.part, Clustering: r.clust,
			Values: vals, Condition: cond})
	}
	var se *storage.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, storage.ErrConditionNotMet):
		return conflict("commit", "the row written changed since the transaction read it")
	case errors.As(err, &se):
		return err // the store says what became of the write
	}
	return &storage.Error{Kind: storage.ErrCommitUnknown, Op: "commit", Detail: err.Error(), Cause: err}
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
// unchanged.
func (t *txn) validate(ctx context.Context) error {
	for k, r := range t.reads {
		if t.writes[k] != nil {
			continue
		}
		row, ok, err := t.db.s.Get(ctx, &storage.Get{Namespace: r.ti.inner.Namespace, Table: r.ti.inner.Name, Partition: r.part, Clustering: r.clust})
		if err != nil {
			return err
		}
		if ok != r.present || ok && (row[colState].AsBigInt() != stateCommitted || row[colVersion].AsBigInt() != r.version) {
			return conflict("commit", "a row read changed before the transaction committed")
		}
	}
	for _, s := range t.scans {
		rows, err := t.db.s.Scan(ctx, &storage.Scan{Namespace: s.ti.inner.Namespace, Table: s.ti.inner.Name, Partition: s.scan.Partition,
			Start: s.scan.Start, End: s.scan.End})
		if err != nil {
			return err
		}
		now := map[string]int64{}
		for rows.Next() {
			r := rows.Row()
			part, clust := keyOf(s.ti, r)
			k := rowKey(s.ti, part, clust)
			switch {
			case r[colState].AsBigInt() == stateCommitted:
				now[k] = r[colVersion].AsBigInt()
			case r[colTx].AsText() == t.id:
				if r[colBefPresent].AsBool() {
					now[k] = r[colBefVersion].AsBigInt()
				}
			default:
				rows.Close()
				return conflict("commit", "a row in a range read is being written by another transaction")
			}
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
			if w, ok := now[k]; !ok || w != v {
				return conflict("commit", "a range read changed before the transaction committed")
			}
		}
	}
	return nil
}
