package cassandra

import (
	"context"
	"errors"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/kiroku-db/kiroku/storage"
)

// mapErr is the package mapErr plus forgetting a cached schema whose CQL
// table Cassandra no longer has.
func (db *DB) mapErr(op string, t *relTable, err error, write bool) error {
	err = mapErr(op, t.Namespace, t.Name, err, write)
	if errors.Is(err, storage.ErrConflict) {
		db.uncache(t.Namespace, t.Name)
	}
	return err
}

// Get implements storage.Ops. The schema is looked up inside the retry
// loop, so a table replaced by another process is reloaded and the request
// checked again.
func (db *DB) Get(ctx context.Context, g *storage.Get) (row storage.Row, found bool, err error) {
	const op = "get"
	err = db.retry(func() error {
		t, err := db.table(ctx, op, g.Namespace, g.Table)
		if err != nil {
			return err
		}
		if err := t.CheckGet(g, db.cfg.Limits); err != nil {
			return err
		}
		st, cols := getCQL(t, g)
		dest, cells := t.dest(cols)
		err = db.session.Query(st.cql, st.args...).Consistency(db.cfg.read).ScanContext(ctx, dest...)
		if errors.Is(err, gocql.ErrNotFound) {
			row, found = nil, false
			return nil
		}
		if err != nil {
			return db.mapErr(op, t, err, false)
		}
		row, found = toRow(cols, cells), true
		return nil
	})
	return row, found, err
}

// dest returns scan destinations for cols and the hidden existsCol.
func (t *relTable) dest(cols []string) ([]any, []*cell) {
	cells := make([]*cell, len(cols)+1)
	dest := make([]any, len(cols)+1)
	for i, c := range cols {
		cells[i] = t.newCell(c)
		dest[i] = cells[i]
	}
	cells[len(cols)] = &cell{typ: storage.TypeBoolean}
	dest[len(cols)] = cells[len(cols)]
	return dest, cells
}

func toRow(cols []string, cells []*cell) storage.Row {
	row := make(storage.Row, len(cols))
	for i, c := range cols {
		row[c] = cells[i].v
	}
	return row
}

// Put implements storage.Ops.
func (db *DB) Put(ctx context.Context, p *storage.Put) error {
	return db.mutate(ctx, "put", []storage.Mutation{p})
}

// Delete implements storage.Ops.
func (db *DB) Delete(ctx context.Context, d *storage.Delete) error {
	return db.mutate(ctx, "delete", []storage.Mutation{d})
}

// Mutate implements storage.Ops: one conditional batch on the partition.
func (db *DB) Mutate(ctx context.Context, ms []storage.Mutation) error {
	return db.mutate(ctx, "mutate", ms)
}

// maxBatch is the most statements a batch can carry (the native
// protocol's count is 16 bits).
const maxBatch = 65535

func (db *DB) mutate(ctx context.Context, op string, ms []storage.Mutation) error {
	if err := db.checkOpen(op); err != nil {
		return err
	}
	ns, name, err := storage.CheckMutationTarget(ms)
	if err != nil {
		if op != "mutate" { // a nil Put or Delete
			return storage.WithOp(err, op)
		}
		return err
	}
	return db.retry(func() error {
		t, err := db.table(ctx, op, ns, name)
		if err != nil {
			return err
		}
		total := 0
		for _, m := range ms {
			if err := t.CheckMutation(m, db.cfg.Limits); err != nil {
				return err
			}
			total += mutationSize(m)
		}
		if total > db.cfg.Limits.MaxWriteSize {
			return &storage.Error{Kind: storage.ErrTooLarge, Op: op, Namespace: ns, Table: name,
				Detail: fmt.Sprintf("mutations of %d bytes in all, limit %d: a Mutate is one Cassandra mutation", total, db.cfg.Limits.MaxWriteSize)}
		}
		ws, err := fold(t, ms)
		if err != nil {
			return err
		}
		if len(ws) > maxBatch {
			return &storage.Error{Kind: storage.ErrTooLarge, Op: op, Namespace: ns, Table: name,
				Detail: fmt.Sprintf("%d rows, at most %d in one Mutate", len(ws), maxBatch)}
		}
		return db.apply(ctx, op, t, ms, ws)
	})
}

// mutationSize is what a mutation counts against MaxWriteSize: its key and
// the values it sets.
func mutationSize(m storage.Mutation) int {
	n := 0
	var p, c storage.Values
	switch m := m.(type) {
	case *storage.Put:
		p, c = m.Partition, m.Clustering
		for _, v := range m.Values {
			n += v.Size()
		}
	case *storage.Delete:
		p, c = m.Partition, m.Clustering
	}
	for _, v := range p {
		n += v.Size()
	}
	for _, v := range c {
		n += v.Size()
	}
	return n
}

// apply writes the folded rows ws of the mutations ms in one lightweight
// transaction: one conditional statement, or a conditional batch. When it
// is not applied, the rows Cassandra returns with the verdict (their
// current values) say which condition failed; if only Skippable puts' did,
// those are replaced by guards that they still fail, and the batch is sent
// again.
func (db *DB) apply(ctx context.Context, op string, t *relTable, ms []storage.Mutation, ws []*rowWrite) error {
	for attempt := 0; ; attempt++ {
		var live []*rowWrite // the writes whose key-column conditions hold
		for _, w := range ws {
			if !keyHolds(t, w.cond, w.partition, w.clustering) {
				if !w.skippable() {
					return db.condFailed(op, t, ms, w)
				}
				continue // the condition cannot hold: the put is skipped, whatever the row
			}
			live = append(live, w)
		}
		if len(live) == 0 {
			return nil
		}
		applied, current, err := db.exec(ctx, op, t, live)
		if err != nil || applied {
			return err
		}
		failed := failedWrites(t, live, current)
		if len(failed) == 0 {
			// The verdict and the rows returned with it disagree; both come
			// from one Paxos round, so this is a bug, not a race.
			return &storage.Error{Kind: storage.ErrConditionNotMet, Op: op, Namespace: t.Namespace, Table: t.Name,
				Detail: "a condition did not hold; nothing was written"}
		}
		for _, w := range failed {
			if !w.skippable() {
				return db.condFailed(op, t, ms, w)
			}
		}
		if attempt >= ddlAttempts {
			return &storage.Error{Kind: storage.ErrConflict, Op: op, Namespace: t.Namespace, Table: t.Name,
				Detail: "the rows of skippable puts kept changing"}
		}
		for _, w := range failed {
			w.guardSkip(t, current[clusteringKey(t, w.clustering)])
		}
	}
}

// condFailed is the error of a write whose condition did not hold.
func (db *DB) condFailed(op string, t *relTable, ms []storage.Mutation, w *rowWrite) error {
	e := &storage.Error{Kind: storage.ErrConditionNotMet, Op: op, Namespace: t.Namespace, Table: t.Name}
	if len(ms) > 1 {
		e.Detail = fmt.Sprintf("mutation %d of %d; nothing was written", w.first+1, len(ms))
	}
	return e
}

// exec sends the statements of ws, and returns whether they were applied
// and, if not, the current rows Cassandra returned with the verdict, by
// clusteringKey: the rows that exist among those with conditions, with
// their key columns and the columns the conditions name.
func (db *DB) exec(ctx context.Context, op string, t *relTable, ws []*rowWrite) (bool, map[string]storage.Row, error) {
	var iter *gocql.Iter
	if len(ws) == 1 {
		st := writeCQL(t, ws[0])
		iter = db.session.Query(st.cql, st.args...).Consistency(db.cfg.consistency).
			SerialConsistency(db.cfg.serial).IterContext(ctx)
	} else {
		b := db.session.Batch(gocql.UnloggedBatch).Consistency(db.cfg.consistency).SerialConsistency(db.cfg.serial)
		for _, w := range ws {
			st := writeCQL(t, w)
			b.Query(st.cql, st.args...)
		}
		iter = b.IterContext(ctx)
	}
	cols := iter.Columns()
	dest := make([]any, len(cols))
	cells := make([]*cell, len(cols))
	var applied bool
	for i, c := range cols {
		switch {
		case i == 0:
			dest[0] = &applied
		case c.Name == existsName:
			cells[i] = &cell{typ: storage.TypeBoolean}
			dest[i] = cells[i]
		default:
			if _, _, ok := t.Lookup(c.Name); !ok {
				return false, nil, fmt.Errorf("storage: %s %s.%s: Cassandra returned an unknown column %q", op, t.Namespace, t.Name, c.Name)
			}
			cells[i] = t.newCell(c.Name)
			dest[i] = cells[i]
		}
	}
	current := map[string]storage.Row{}
	n := 0
	for iter.Scan(dest...) {
		n++
		if applied {
			continue
		}
		row := storage.Row{}
		for i, c := range cols[1:] {
			row[c.Name] = cells[i+1].v
		}
		if len(ws) == 1 {
			// A single statement's result has the columns of its
			// condition, and no key: it is that row's, NULL if absent.
			current[clusteringKey(t, ws[0].clustering)] = row
			continue
		}
		ck := make(storage.Values, len(t.ClusteringKey))
		placeholder := false // a missing row's line, all NULL
		for _, c := range t.ClusteringKey {
			ck[c.Name] = row[c.Name]
			placeholder = placeholder || row[c.Name].IsNull()
		}
		if !placeholder {
			current[clusteringKey(t, ck)] = row
		}
	}
	if err := iter.Close(); err != nil {
		return false, nil, db.mapErr(op, t, err, true)
	}
	if n == 0 {
		return false, nil, fmt.Errorf("storage: %s %s.%s: Cassandra returned no verdict", op, t.Namespace, t.Name)
	}
	return applied, current, nil
}

// failedWrites evaluates the conditions of ws on the current rows: the
// same judgement Cassandra made, in kiroku's terms.
func failedWrites(t *relTable, ws []*rowWrite, current map[string]storage.Row) []*rowWrite {
	var out []*rowWrite
	for _, w := range ws {
		row, exists := current[clusteringKey(t, w.clustering)]
		if exists {
			exists = !row[existsName].IsNull()
		}
		if !exists {
			row = nil
		}
		if !holds(w, row, exists) {
			out = append(out, w)
		}
	}
	return out
}

// holds evaluates a write's condition (or guard) on a row, nil if it does
// not exist: the judgement Cassandra made on the same row, in kiroku's
// terms. Expressions on key columns were checked before sending.
func holds(w *rowWrite, row storage.Row, exists bool) bool {
	if g := w.guard; g != nil {
		if !g.exists || !exists {
			return g.exists == exists
		}
		for col, v := range g.vals {
			if !row[col].Equal(v) {
				return false
			}
		}
		return true
	}
	c := w.cond
	switch {
	case c == nil:
		return true
	case c.Kind == storage.CondIfNotExists:
		return !exists
	case !exists:
		return false
	case c.Kind == storage.CondIfExists:
		return true
	}
	for _, e := range c.Exprs {
		if v, ok := row[e.Column]; ok && !e.Eval(v) {
			return false
		}
	}
	return true
}

// Scan implements storage.Ops: one CQL query (see scanPlan), whose first
// page is read before Scan returns, so that a table replaced by another
// process is retried like the other operations. Later pages are read as
// the rows are consumed; a failure then reaches the caller through Err.
func (db *DB) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	const op = "scan"
	var out *scanRows
	err := db.retry(func() error {
		t, err := db.table(ctx, op, s.Namespace, s.Table)
		if err != nil {
			return err
		}
		if err := t.CheckScan(s, db.cfg.Limits); err != nil {
			return err
		}
		p := scanCQL(t, s, true)
		r := &scanRows{db: db, t: t, plan: p, limit: s.Limit, order: s.Order}
		if p.empty {
			r.done = true
			out = r
			return nil
		}
		if !p.exact {
			r.start, r.end = s.Start, s.End
			r.ck = make([]int, len(t.ClusteringKey))
			for i, c := range t.ClusteringKey {
				for j, name := range p.cols {
					if name == c.Name {
						r.ck[i] = j
					}
				}
			}
		}
		r.dest, r.cells = t.dest(p.cols)
		r.iter = db.session.Query(p.stmt.cql, p.stmt.args...).Consistency(db.cfg.read).IterContext(ctx)
		r.primed = r.advance()
		if !r.primed && r.err != nil {
			return r.err
		}
		out = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// scanRows streams a scan's rows from the driver's iterator, which reads a
// page at a time and holds no connection between pages.
type scanRows struct {
	db    *DB
	t     *relTable
	plan  scanPlan
	iter  *gocql.Iter
	dest  []any
	cells []*cell
	// For a plan that is not exact: the bounds to filter by, and where
	// each clustering column is among the selected columns.
	start, end *storage.Bound
	ck         []int
	order      storage.Order
	limit, n   int
	primed     bool // advance has read the first row, which the first Next returns
	done       bool
	cur        storage.Row
	err        error
}

// advance reads the next row in range into r.cur; false at the end or on
// an error (r.err).
func (r *scanRows) advance() bool {
	if r.done || r.limit > 0 && r.n >= r.limit {
		r.finish()
		return false
	}
	for r.iter.Scan(r.dest...) {
		if r.ck != nil {
			key := make([]storage.Value, len(r.ck))
			for i, j := range r.ck {
				key[i] = r.cells[j].v
			}
			where := inRange(r.t, &storage.Scan{Start: r.start, End: r.end}, key)
			if where != 0 {
				// Past the far end in the scan's direction: nothing more.
				if where > 0 && r.order == storage.Asc || where < 0 && r.order == storage.Desc {
					break
				}
				continue
			}
		}
		r.cur = toRow(r.plan.proj, r.cells)
		r.n++
		return true
	}
	r.finish()
	return false
}

// finish closes the iterator and keeps its error.
func (r *scanRows) finish() {
	if r.done {
		return
	}
	r.done = true
	if err := r.iter.Close(); err != nil && r.err == nil {
		r.err = r.db.mapErr("scan", r.t, err, false)
	}
}

func (r *scanRows) Next() bool {
	if r.err != nil {
		return false
	}
	if r.primed {
		r.primed = false
		return true
	}
	return r.advance()
}

func (r *scanRows) Row() storage.Row { return r.cur }
func (r *scanRows) Err() error       { return r.err }
func (r *scanRows) Close() error {
	r.primed = false
	r.finish()
	return r.err
}
