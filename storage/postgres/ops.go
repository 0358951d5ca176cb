package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kiroku-db/kiroku/storage"
)

// querier is what the pool and a transaction have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// mapErr is the package mapErr plus forgetting a cached schema whose table
// PostgreSQL no longer has.
func (b *Backend) mapErr(op string, t *relTable, err error, mayHaveCommitted bool) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		b.uncache(t.Namespace, t.Name)
	}
	return mapErr(op, t.Namespace, t.Name, err, mayHaveCommitted)
}

func toRow(t *relTable, cols []string, vals []any) (storage.Row, error) {
	row := make(storage.Row, len(cols))
	for i, name := range cols {
		typ, _, _ := t.Lookup(name)
		v, err := fromGo(typ, vals[i])
		if err != nil {
			return nil, err
		}
		row[name] = v
	}
	return row, nil
}

func (b *Backend) get(ctx context.Context, q querier, t *relTable, g *storage.Get) (storage.Row, bool, error) {
	sql, args, cols := getSQL(t, g)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, false, b.mapErr("get", t, err, false)
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, false, b.mapErr("get", t, rows.Err(), false)
	}
	vals, err := rows.Values()
	if err != nil {
		return nil, false, b.mapErr("get", t, err, false)
	}
	// An error may follow the row (a serialization failure, a timeout):
	// it fails the get, not silently the transaction.
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, b.mapErr("get", t, err, false)
	}
	row, err := toRow(t, cols, vals)
	return row, err == nil, err
}

func condFailed(op string, t *relTable, detail string) error {
	return &storage.Error{Kind: storage.ErrConditionNotMet, Op: op, Namespace: t.Namespace, Table: t.Name, Detail: detail}
}

// write runs the statement of one Put or Delete on q and checks its
// condition; autocommit says whether it commits on its own (q is a pooled
// connection) or inside a transaction.
func (b *Backend) write(ctx context.Context, q querier, autocommit bool, t *relTable, m storage.Mutation) error {
	return b.runWrite(ctx, q, autocommit, writeSQL(t, m))
}

func (b *Backend) runWrite(ctx context.Context, q querier, autocommit bool, w writeStmt) error {
	tag, err := q.Exec(ctx, w.sql, w.args...)
	if err != nil {
		return b.mapErr(w.op, w.t, err, autocommit)
	}
	if w.conditional && tag.RowsAffected() == 0 {
		return condFailed(w.op, w.t, "")
	}
	return nil
}

// writeStmt is the statement of one Put or Delete on table t.
type writeStmt struct {
	op   string // "put" or "delete"
	t    *relTable
	sql  string
	args []any
	// conditional: the write has a condition, which failed if it changed
	// no row; a Skippable put's has no answer to check. (A queued write
	// keeps no part of its request: the caller may reuse it once the call
	// returns.)
	conditional bool
	// deferred: a transaction's Deferred put (deferredSQL) or Expect
	// (expectSQL), queued; unmet says what its failure means.
	deferred bool
	unmet    string
}

func writeSQL(t *relTable, m storage.Mutation) writeStmt {
	w := writeStmt{t: t}
	switch m := m.(type) {
	case *storage.Put:
		// A Skippable put's condition that does not hold changes no row,
		// which is its answer: nothing to check, so a transaction queues it.
		w.op, w.conditional = "put", m.Condition != nil && !m.Skippable
		w.sql, w.args = putSQL(t, m)
	case *storage.Delete:
		w.op, w.conditional = "delete", m.Condition != nil
		w.sql, w.args = deleteSQL(t, m)
	default:
		panic(fmt.Sprintf("postgres: mutation %T", m))
	}
	return w
}

// writeOne is Put and Delete: one autocommitted statement. The schema is
// looked up inside the retry loop, so a table replaced by another process
// is reloaded and the request checked again.
func (b *Backend) writeOne(ctx context.Context, op string, m storage.Mutation) error {
	ns, name := storage.MutationTable(m)
	return b.retry(ctx, func() error {
		t, err := b.table(ctx, op, ns, name)
		if err != nil {
			return err
		}
		if err := t.CheckMutation(m, b.limits); err != nil {
			return err
		}
		return b.onConn(ctx, op, t, func(c querier) error { return b.write(ctx, c, true, t, m) })
	})
}

// onConn runs an autocommitted write on a connection of its own. Failing to
// get one sends nothing (ErrUnavailable, or the context's error); any failure
// after that may have committed.
func (b *Backend) onConn(ctx context.Context, op string, t *relTable, fn func(querier) error) error {
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return b.mapErr(op, t, err, false)
	}
	defer c.Release()
	return fn(c)
}

// Get implements storage.Ops.
//
// Single operations look the schema up inside their retry loop, so a table
// replaced by another process is reloaded and the request checked again.
func (b *Backend) Get(ctx context.Context, g *storage.Get) (row storage.Row, found bool, err error) {
	err = b.retry(ctx, func() error {
		t, err := b.table(ctx, "get", g.Namespace, g.Table)
		if err != nil {
			return err
		}
		if err := t.CheckGet(g, b.limits); err != nil {
			return err
		}
		row, found, err = b.get(ctx, b.pool, t, g)
		return err
	})
	return row, found, err
}

// Put implements storage.Ops.
func (b *Backend) Put(ctx context.Context, p *storage.Put) error { return b.writeOne(ctx, "put", p) }

// Delete implements storage.Ops.
func (b *Backend) Delete(ctx context.Context, d *storage.Delete) error {
	return b.writeOne(ctx, "delete", d)
}

// Mutate implements storage.Ops: the mutations run in one transaction,
// which rolls back if any condition fails.
func (b *Backend) Mutate(ctx context.Context, ms []storage.Mutation) error {
	const op = "mutate"
	ns, name, err := storage.CheckMutationTarget(ms)
	if err != nil {
		return err
	}
	return b.retry(ctx, func() error {
		t, err := b.table(ctx, op, ns, name)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if err := t.CheckMutation(m, b.limits); err != nil {
				return err
			}
		}
		tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: b.iso})
		if err != nil {
			return b.mapErr(op, t, err, false)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		for i, m := range ms {
			err := b.write(ctx, tx, false, t, m)
			if errors.Is(err, storage.ErrConditionNotMet) {
				return condFailed(op, t, fmt.Sprintf("mutation %d of %d; nothing was written", i+1, len(ms)))
			}
			if err != nil {
				return err
			}
		}
		return commit(ctx, op, tx)
	})
}

// Scan implements storage.Ops. The rows stream from the server; the
// connection is held until Close. Running the query up to its first row is
// retried on a conflict like the other single operations (pgx reports an
// execution error with the rows, not from Query); a failure later, while
// the rows stream, reaches the caller through Rows.Err.
func (b *Backend) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	var out *pgRows
	err := b.retry(ctx, func() error {
		t, err := b.table(ctx, "scan", s.Namespace, s.Table)
		if err != nil {
			return err
		}
		if err := t.CheckScan(s, b.limits); err != nil {
			return err
		}
		sql, args, cols := scanSQL(t, s)
		rows, err := b.pool.Query(ctx, sql, args...)
		if err != nil {
			return b.mapErr("scan", t, err, false)
		}
		primed := rows.Next()
		if !primed {
			rows.Close()
			if err := rows.Err(); err != nil {
				return b.mapErr("scan", t, err, false)
			}
		}
		out = &pgRows{b: b, t: t, cols: cols, rows: rows, primed: primed}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

type pgRows struct {
	b    *Backend
	t    *relTable
	cols []string
	rows pgx.Rows
	// primed: Scan has advanced rows to the first row, which the first
	// Next returns.
	primed bool
	cur    storage.Row
	err    error
}

func (r *pgRows) Next() bool {
	if r.err != nil {
		return false
	}
	if r.primed {
		r.primed = false
	} else if !r.rows.Next() {
		r.err = r.b.mapErr("scan", r.t, r.rows.Err(), false)
		return false
	}
	vals, err := r.rows.Values()
	if err == nil {
		r.cur, err = toRow(r.t, r.cols, vals)
	}
	if err != nil {
		r.err = r.b.mapErr("scan", r.t, err, false)
		r.rows.Close()
		return false
	}
	return true
}

func (r *pgRows) Row() storage.Row { return r.cur }
func (r *pgRows) Err() error       { return r.err }
func (r *pgRows) Close() error {
	r.rows.Close()
	if r.err == nil {
		r.err = r.b.mapErr("scan", r.t, r.rows.Err(), false)
	}
	return r.err
}

// Begin implements storage.Backend: a SERIALIZABLE PostgreSQL transaction.
// It takes a connection from the pool and sends nothing yet: BEGIN travels
// with the transaction's first statement.
func (b *Backend) Begin(ctx context.Context) (storage.Txn, error) {
	if err := b.checkOpen("begin"); err != nil {
		return nil, err
	}
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, mapErr("begin", "", "", err, false)
	}
	return &txn{b: b, conn: c}, nil
}

// txn runs its operations in one PostgreSQL transaction on a connection it
// holds until it ends, and saves round trips by pipelining:
//
//   - BEGIN is sent with the first statement, not on its own;
//   - an unconditional Put or Delete, whose only answer is success, is
//     queued and sent with the next statement that needs an answer (a
//     read, a conditional write) or with COMMIT; so is a Deferred put,
//     whose statement fails the transaction if its condition does not
//     hold, as an Expect's does, and a Skippable put, whose statement
//     then changes nothing.
//
// A ledger YCSB-F transaction, which reads an asset's head and writes its
// new version, the head and the nonce's state (a Deferred put), then costs
// two round trips rather than seven. Reads still see the
// transaction's own writes, since the queue goes first. A queued write the
// server refuses (a serialization failure, a table dropped meanwhile)
// reports its error, naming the write, from the call that sent it; the
// request itself was checked against the schema before it was queued.
//
// A server-side error aborts a PostgreSQL transaction, so after one the
// txn is finished; a validation error or a failed condition is found before
// anything is sent and leaves it usable.
type txn struct {
	b      *Backend
	conn   *pgxpool.Conn // nil once the txn has ended
	begun  bool          // BEGIN has been sent
	queued []writeStmt   // unconditional and deferred writes not yet sent
	failed bool          // a deferred write failed: the server aborted the transaction
}

func (x *txn) table(ctx context.Context, op, ns, name string) (*relTable, error) {
	if x.conn == nil {
		return nil, &storage.Error{Kind: storage.ErrTxnDone, Op: op, Namespace: ns, Table: name}
	}
	t, err := x.b.tableVia(ctx, x, op, ns, name)
	if se := (*storage.Error)(nil); err != nil && (!errors.As(err, &se) || se.Cause != nil) {
		// The lookup itself failed on the server, which aborts the transaction.
		return nil, x.end(ctx, err)
	}
	return t, err
}

// end finishes the transaction after a server error (a deferred
// condition's failure is one) and returns err.
func (x *txn) end(ctx context.Context, err error) error {
	if err != nil && (x.failed || !errors.Is(err, storage.ErrConditionNotMet)) && x.conn != nil {
		x.finish(context.WithoutCancel(ctx), false)
	}
	return err
}

// finish ends the transaction: it rolls back under ctx unless committed,
// and gives the connection back. The pool discards a connection left
// inside a transaction (a ROLLBACK that failed), so none is reused
// mid-transaction.
func (x *txn) finish(ctx context.Context, committed bool) {
	x.queued = nil
	if x.begun && !committed {
		// A failed rollback means the connection is gone, and the server
		// rolls back on its own when it notices: nothing to report.
		_, _ = x.conn.Exec(ctx, "ROLLBACK")
	}
	x.conn.Release()
	x.conn = nil
}

// send sends, in one round trip, BEGIN if it has not been sent, the queued
// writes, and last (a statement, or "" for none), and reads the results of
// all but last, whose result is left for the caller in br. On an error it
// returns the first failure (batchErr); mayHaveCommitted is for a batch
// that ends in COMMIT. The caller closes br in every case.
func (x *txn) send(ctx context.Context, last string, args []any, mayHaveCommitted bool) (br pgx.BatchResults, err error) {
	var b pgx.Batch
	if !x.begun {
		b.BeginTx(pgx.TxOptions{IsoLevel: x.b.iso})
	}
	for _, q := range x.queued {
		b.Queue(q.sql, q.args...)
	}
	if last != "" {
		b.Queue(last, args...)
	}
	queued := x.queued
	x.queued = nil
	br = x.conn.SendBatch(ctx, &b)
	if !x.begun {
		x.begun = true
		if _, err := br.Exec(); err != nil {
			// A lost connection may have lost the answer to the COMMIT
			// at the batch's end, not only to its BEGIN.
			op := "begin"
			if mayHaveCommitted {
				op = "commit"
			}
			return br, x.batchErr(err, queued, last, writeStmt{op: op}, mayHaveCommitted)
		}
	}
	for _, q := range queued {
		if _, err := br.Exec(); err != nil {
			if pe := (*pgconn.PgError)(nil); q.deferred && errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "22012") {
				x.failed = true // the server aborted the transaction
				if pe.Code == "23505" {
					return br, condFailed(q.op, q.t, "the row exists (a deferred IfNotExists)")
				}
				return br, condFailed(q.op, q.t, q.unmet)
			}
			return br, x.batchErr(err, queued, last, q, mayHaveCommitted)
		}
	}
	return br, nil
}

// batchErr maps err, the first error read from a batch, at the result of
// at (a queued write, or BEGIN with no table). pgx prepares the statements
// it has not seen in a round trip of its own before the batch runs; if
// that fails nothing ran, and the error belongs to the statement that
// could not be prepared: a queued write (whose cached schema a dropped
// table then leaves), or last, returned unmapped for its caller to map.
func (x *txn) batchErr(err error, queued []writeStmt, last string, at writeStmt, mayHaveCommitted bool) error {
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pre) {
		for _, q := range queued {
			if q.sql == pre.SQL() {
				return x.b.mapErr(q.op, q.t, err, false)
			}
		}
		if last != "" && pre.SQL() == last {
			return err
		}
		return mapErr(at.op, "", "", err, false)
	}
	if at.t == nil {
		return mapErr(at.op, "", "", err, mayHaveCommitted)
	}
	return x.b.mapErr(at.op, at.t, err, mayHaveCommitted)
}

// Query sends sql after what is queued; it is the querier a txn's reads
// and schema lookups use.
func (x *txn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if x.begun && len(x.queued) == 0 {
		return x.conn.Query(ctx, sql, args...)
	}
	br, err := x.send(ctx, sql, args, false)
	var rows pgx.Rows
	if err == nil {
		rows, err = br.Query()
	}
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// Exec is Query for a statement without rows.
func (x *txn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if x.begun && len(x.queued) == 0 {
		return x.conn.Exec(ctx, sql, args...)
	}
	br, err := x.send(ctx, sql, args, false)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// batchRows is the rows of a batch's last statement; closing them closes
// the batch, which frees the connection.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		r.err = r.br.Close()
		r.br = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (x *txn) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	t, err := x.table(ctx, "get", g.Namespace, g.Table)
	if err != nil {
		return nil, false, err
	}
	if err := t.CheckGet(g, x.b.limits); err != nil {
		return nil, false, err
	}
	row, ok, err := x.b.get(ctx, x, t, g)
	return row, ok, x.end(ctx, err)
}

func (x *txn) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	t, err := x.table(ctx, "scan", s.Namespace, s.Table)
	if err != nil {
		return nil, err
	}
	if err := t.CheckScan(s, x.b.limits); err != nil {
		return nil, err
	}
	sql, args, cols := scanSQL(t, s)
	rows, err := x.Query(ctx, sql, args...)
	if err != nil {
		return nil, x.end(ctx, x.b.mapErr("scan", t, err, false))
	}
	// Materialize: the transaction's connection is needed for what follows.
	out, err := storage.CollectRows(&pgRows{b: x.b, t: t, cols: cols, rows: rows})
	if err != nil {
		return nil, x.end(ctx, err)
	}
	return storage.SliceRows(out), nil
}

func (x *txn) Put(ctx context.Context, p *storage.Put) error       { return x.write(ctx, "put", p) }
func (x *txn) Delete(ctx context.Context, d *storage.Delete) error { return x.write(ctx, "delete", d) }

func (x *txn) write(ctx context.Context, op string, m storage.Mutation) error {
	ns, name := storage.MutationTable(m)
	t, err := x.table(ctx, op, ns, name)
	if err != nil {
		return err
	}
	if err := t.CheckMutation(m, x.b.limits); err != nil {
		return err
	}
	var w writeStmt
	if p, ok := m.(*storage.Put); ok && p.Deferred {
		w = writeStmt{op: "put", t: t, conditional: true, deferred: true, unmet: "no row met the deferred condition"}
		w.sql, w.args = deferredSQL(t, p)
	} else {
		w = writeSQL(t, m)
	}
	if !w.conditional || w.deferred {
		x.queued = append(x.queued, w)
		return nil
	}
	// A conditional write needs its answer: it goes now, through Exec.
	return x.end(ctx, x.b.runWrite(ctx, x, false, w))
}

// Expect queues its statement (expectSQL) with the writes: it needs no
// round trip of its own.
func (x *txn) Expect(ctx context.Context, e *storage.Expect) error {
	const op = "expect"
	if e == nil {
		return &storage.Error{Kind: storage.ErrInvalidArgument, Op: op, Detail: "nil Expect"}
	}
	t, err := x.table(ctx, op, e.Namespace, e.Table)
	if err != nil {
		return err
	}
	if err := t.CheckExpect(e, x.b.limits); err != nil {
		return err
	}
	w := writeStmt{op: op, t: t, conditional: true, deferred: true, unmet: "the row does not meet the expected condition"}
	if e.Condition.Kind == storage.CondIfNotExists {
		w.unmet = "the row exists (an expected IfNotExists)"
	}
	w.sql, w.args = expectSQL(t, e)
	x.queued = append(x.queued, w)
	return nil
}

// Commit sends the queued writes and COMMIT in one round trip. A
// transaction that sent nothing has nothing to commit.
func (x *txn) Commit(ctx context.Context) error {
	if x.conn == nil {
		return &storage.Error{Kind: storage.ErrTxnDone, Op: "commit"}
	}
	if !x.begun && len(x.queued) == 0 {
		x.finish(ctx, true)
		return nil
	}
	if err := notSent(ctx, "commit", x.conn.Conn()); err != nil {
		x.finish(context.WithoutCancel(ctx), false)
		return err
	}
	br, err := x.send(ctx, "COMMIT", nil, true)
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		switch {
		case err != nil:
			err = mapErr("commit", "", "", err, true)
		case tag.String() == "ROLLBACK":
			// The server had aborted the transaction on an error whose
			// report did not reach a caller (after a read's last row,
			// say), and answered COMMIT by rolling back: nothing was
			// committed, so a retry is safe.
			err = &storage.Error{Kind: storage.ErrConflict, Op: "commit", Detail: "PostgreSQL rolled the transaction back: a statement in it had failed"}
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = mapErr("commit", "", "", cerr, true)
	}
	// After a failure in the batch the server skipped COMMIT and left the
	// transaction aborted, or the connection is gone: either way finish
	// rolls back what is left.
	x.finish(context.WithoutCancel(ctx), err == nil)
	return err
}

func (x *txn) Abort(ctx context.Context) error {
	if x.conn != nil {
		x.finish(ctx, false)
	}
	return nil
}
