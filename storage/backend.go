package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Admin manages namespaces and tables. Schemas are stored in the backend
// itself, so a new process attached to the same store finds them.
type Admin interface {
	// CreateNamespace fails with ErrNamespaceExists if it exists.
	CreateNamespace(ctx context.Context, name string) error
	// DropNamespace fails with ErrNamespaceNotFound if it does not exist and
	// ErrNamespaceNotEmpty if it still holds tables.
	DropNamespace(ctx context.Context, name string) error
	// ListNamespaces returns the namespaces, sorted.
	ListNamespaces(ctx context.Context) ([]string, error)
	// CreateTable validates t and creates it in its namespace; ErrTableExists
	// if a table of that name exists.
	CreateTable(ctx context.Context, t *Table) error
	// DropTable drops a table and every row in it.
	DropTable(ctx context.Context, namespace, table string) error
	// DescribeTable returns a copy of the table's schema.
	DescribeTable(ctx context.Context, namespace, table string) (*Table, error)
	// ListTables returns the namespace's table names, sorted.
	ListTables(ctx context.Context, namespace string) ([]string, error)
}

// Ops are the single operations of Apollo Storage's multi-dimensional map:
// single-row reads and conditional writes, and single-partition scans and
// batches. Each call is atomic and linearizable on its own; for more, use
// a Txn.
type Ops interface {
	// Get returns the row and true, or false if it does not exist.
	Get(ctx context.Context, g *Get) (Row, bool, error)
	// Scan streams the rows of one partition. The caller must Close the Rows.
	Scan(ctx context.Context, s *Scan) (Rows, error)
	// Put writes one row; with a condition, atomically with its check.
	Put(ctx context.Context, p *Put) error
	// Delete removes one row; with a condition, atomically with its check.
	Delete(ctx context.Context, d *Delete) error
	// Mutate applies puts and deletes to one partition of one table
	// atomically: if any condition fails, nothing is written and the error
	// (ErrConditionNotMet) says which mutation failed.
	Mutate(ctx context.Context, ms []Mutation) error
}

// Txn is a strictly serializable transaction: its reads and writes take
// effect at one point between Begin and the return of a successful Commit,
// and a transaction that scanned a range conflicts with one that inserts
// into it. It sees its own writes. A Txn is not safe for concurrent use.
//
// Any method may return ErrConflict; the transaction is then finished and
// the whole unit of work should be retried (Update does that). After Commit,
// Abort or such an error, methods return ErrTxnDone; Abort after the end is
// a no-op.
type Txn interface {
	Get(ctx context.Context, g *Get) (Row, bool, error)
	// Scan returns the matching rows, own writes included. Within a
	// transaction the rows may be materialized before the first Next.
	Scan(ctx context.Context, s *Scan) (Rows, error)
	// Put and Delete take conditions as in Store, evaluated on what this
	// transaction sees; a failed condition returns ErrConditionNotMet, writes
	// nothing, and leaves the transaction usable — unless the Put is
	// Deferred, whose failure may come from a later call and ends the
	// transaction, or Skippable, which skips the write and returns nil.
	Put(ctx context.Context, p *Put) error
	Delete(ctx context.Context, d *Delete) error
	// Expect makes the transaction commit only if a row meets a condition,
	// and writes nothing; a condition that does not hold ends the
	// transaction with ErrConditionNotMet, from Expect or a later call
	// (see Expect).
	Expect(ctx context.Context, e *Expect) error
	// Commit returns nil only once the transaction is committed and durable.
	// ErrConflict: rolled back; ErrCommitUnknown: the outcome is not known.
	Commit(ctx context.Context) error
	// Abort rolls back; it is safe to call more than once.
	Abort(ctx context.Context) error
}

// Store is what every database kiroku runs on provides natively: its
// schemas (Admin) and the single operations (Ops). It is the interface a
// backend must implement. A Store is safe for concurrent use.
type Store interface {
	Admin
	Ops
	// Limits returns the size limits in force.
	Limits() Limits
	// Close releases the store's resources. Open Rows (and, on a Backend,
	// Txns) must be finished first.
	Close() error
}

// Backend is a Store with strictly serializable multi-partition
// transactions: natively (the embedded engine, PostgreSQL), or from a
// coordinator built over a Store that has none. The ledger and the
// Validator need one. A Backend is safe for concurrent use.
type Backend interface {
	Store
	// Begin starts a transaction.
	Begin(ctx context.Context) (Txn, error)
}

// Unsyncer is implemented by a backend that can return from a call once its
// effects are committed and visible to other callers, before they are
// durable. Such a view is for writes whose loss the writer can afford:
// bookkeeping whose values reach a caller only through a later, durable
// commit — the Validator's logical clock, whose values are durable once
// the log rows that carry them are — or a record that can be rebuilt from
// elsewhere, as the Validator rebuilds a lost outcome from the ledger. A
// backend may implement it only if it keeps both of these promises:
//
//   - Prefix. Whatever a call through the view wrote or read is durable no
//     later than the writes of any commit that begins after the call
//     returned, durable or itself through the view. (A read-only commit
//     promises only what it read.)
//   - No survivors. If such an effect is lost (a crash, a failed log), no
//     later durable commit succeeds in the process that saw it.
//
// The embedded engine keeps them (one global durable epoch; a crash ends the
// process and a failed log fails every later commit). A server backend
// whose restart survives its clients must not implement it.
type Unsyncer interface {
	Unsynced() Ops
}

// Unsynced returns b's unsynced view if it has one, and b itself (every
// call durable) otherwise.
func Unsynced(b Ops) Ops {
	if u, ok := b.(Unsyncer); ok {
		return u.Unsynced()
	}
	return b
}

// Exclusive is implemented by a backend whose data no other process can
// reach while it is open (the embedded engine locks its directory), so
// every write to it is made through this process. Shared returns the value
// kept under key for as long as the backend is open, made by mk on first
// use: callers in the process that must agree on some state of the
// database meet there. The Validator's clocks keep there the highest clock
// value handed out, which on such a database is all they need to read,
// and how far the clock counters were raised ahead of it (see package
// validator). A backend other processes can reach — a server, a
// shared directory — must not implement it.
type Exclusive interface {
	Shared(key any, mk func() any) any
}

// Rows iterates over scan results, like database/sql.Rows:
//
//	for rows.Next() { use(rows.Row()) }
//	if err := rows.Err(); err != nil { ... }
//	rows.Close()
type Rows interface {
	Next() bool
	// Row is the current row; valid until the next call to Next.
	Row() Row
	// Err is the error that stopped iteration, if any.
	Err() error
	// Close releases the iterator; safe to call more than once.
	Close() error
}

// ColumnReader is implemented by Rows that can read one column of the
// current row without building the row: Column returns the value of the
// named column and whether the row has it (a column outside the scan's
// projection, or no column of that name, it has not). A row is a map, and
// a caller that wants one column of many rows (the Validator's clock
// reads a counter from each of K rows at every tick) would otherwise pay
// for a map per row. Use it through RowColumn.
type ColumnReader interface {
	Column(name string) (Value, bool)
}

// RowColumn returns the named column of rows' current row, through
// ColumnReader when rows implements it.
func RowColumn(rows Rows, name string) (Value, bool) {
	if cr, ok := rows.(ColumnReader); ok {
		return cr.Column(name)
	}
	v, ok := rows.Row()[name]
	return v, ok
}

// SliceRows returns a Rows over materialized rows.
func SliceRows(rows []Row) Rows { return &sliceRows{rows: rows, i: -1} }

type sliceRows struct {
	rows []Row
	i    int
}

func (r *sliceRows) Next() bool   { r.i++; return r.i < len(r.rows) }
func (r *sliceRows) Row() Row     { return r.rows[r.i] }
func (r *sliceRows) Err() error   { return nil }
func (r *sliceRows) Close() error { r.i = len(r.rows); return nil }

// Single operations as transactions, for a backend whose single
// operations are its transactions' (the embedded engine, the transaction
// coordinator): each runs in one transaction through Update.

// GetIn reads one row in a transaction of db.
func GetIn(ctx context.Context, db Beginner, g *Get) (Row, bool, error) {
	var row Row
	var ok bool
	err := Update(ctx, db, func(t Txn) error {
		var err error
		row, ok, err = t.Get(ctx, g)
		return err
	})
	return row, ok, err
}

// ScanIn scans a partition range in a transaction of db. The transaction's
// Scan must return rows that outlive it (materialized).
func ScanIn(ctx context.Context, db Beginner, s *Scan) (Rows, error) {
	var rows Rows
	err := Update(ctx, db, func(t Txn) error {
		var err error
		rows, err = t.Scan(ctx, s)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// PutIn writes one row in a transaction of db.
func PutIn(ctx context.Context, db Beginner, p *Put) error {
	return Update(ctx, db, func(t Txn) error { return t.Put(ctx, p) })
}

// DeleteIn deletes one row in a transaction of db.
func DeleteIn(ctx context.Context, db Beginner, d *Delete) error {
	return Update(ctx, db, func(t Txn) error { return t.Delete(ctx, d) })
}

// MutateIn applies ms, puts and deletes on one partition of one table, in
// one transaction of db; a condition that does not hold fails the whole
// with ErrConditionNotMet naming the mutation.
func MutateIn(ctx context.Context, db Beginner, ms []Mutation) error {
	if _, _, err := CheckMutationTarget(ms); err != nil {
		return err
	}
	return Update(ctx, db, func(t Txn) error {
		for i, m := range ms {
			var err error
			switch m := m.(type) {
			case *Put:
				err = t.Put(ctx, m)
			case *Delete:
				err = t.Delete(ctx, m)
			default:
				return &Error{Kind: ErrInvalidArgument, Op: "mutate", Detail: fmt.Sprintf("unknown mutation %T", m)}
			}
			var se *Error
			if errors.Is(err, ErrConditionNotMet) && errors.As(err, &se) {
				return &Error{Kind: ErrConditionNotMet, Op: "mutate", Namespace: se.Namespace, Table: se.Table,
					Detail: fmt.Sprintf("mutation %d of %d; nothing was written", i+1, len(ms))}
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// CollectRows reads every row and closes rows.
func CollectRows(rows Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		out = append(out, rows.Row())
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// RetryPolicy bounds Update's retries. Zero fields take the defaults.
type RetryPolicy struct {
	// MaxAttempts is the number of tries in all; 0 means 20.
	MaxAttempts int
	// BaseDelay is the backoff ceiling after the first failure; it doubles
	// with every failure up to MaxDelay. 0 means 1ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling; 0 means 200ms.
	MaxDelay time.Duration
	// Jitter picks the actual sleep in [0, ceiling); nil means uniform
	// ("full jitter") from math/rand/v2. Tests and the simulator inject theirs.
	Jitter func(ceiling time.Duration) time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 20
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = time.Millisecond
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 200 * time.Millisecond
	}
	if p.Jitter == nil {
		p.Jitter = func(c time.Duration) time.Duration { return rand.N(c) }
	}
	return p
}

// Beginner starts transactions; every Backend is one.
type Beginner interface {
	Begin(ctx context.Context) (Txn, error)
}

// Update runs fn in a transaction and commits it, retrying the whole unit of
// work on retryable errors (ErrConflict, ErrUnavailable) with the default
// RetryPolicy. If fn returns an error that is not retryable, the transaction
// is aborted and that error returned. fn may run more than once, so it must
// not have effects outside the transaction.
func Update(ctx context.Context, db Beginner, fn func(Txn) error) error {
	return UpdateWith(ctx, db, RetryPolicy{}, fn)
}

// ErrRetriesExhausted wraps the last retryable error once the policy's
// attempts are used up.
var ErrRetriesExhausted = errors.New("retries exhausted")

// UpdateWith is Update with an explicit retry policy.
func UpdateWith(ctx context.Context, db Beginner, policy RetryPolicy, fn func(Txn) error) error {
	p := policy.withDefaults()
	var last error
	for attempt := 0; attempt < p.MaxAttempts; attempt++ {
		if attempt > 0 {
			if err := p.Sleep(ctx, attempt-1); err != nil {
				return err
			}
		}
		last = updateOnce(ctx, db, fn)
		if last == nil || !IsRetryable(last) {
			return last
		}
	}
	return fmt.Errorf("storage: update: %w after %d attempts: %w", ErrRetriesExhausted, p.MaxAttempts, last)
}

// Sleep waits out the backoff after failure number failure (0 for the
// first): a jittered time below min(BaseDelay·2^failure, MaxDelay). It
// returns early with ctx's error if ctx ends.
func (p RetryPolicy) Sleep(ctx context.Context, failure int) error {
	p = p.withDefaults()
	ceiling := p.BaseDelay
	for i := 0; i < failure && ceiling < p.MaxDelay; i++ {
		ceiling *= 2
	}
	t := time.NewTimer(p.Jitter(min(ceiling, p.MaxDelay)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func updateOnce(ctx context.Context, db Beginner, fn func(Txn) error) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	finished := false
	defer func() {
		if !finished { // fn panicked: do not leave the transaction open
			_ = tx.Abort(context.WithoutCancel(ctx))
		}
	}()
	err = fn(tx)
	finished = true
	if err != nil {
		if aerr := tx.Abort(ctx); aerr != nil && !errors.Is(aerr, ErrTxnDone) && !IsRetryable(err) {
			return errors.Join(err, aerr)
		}
		return err
	}
	return tx.Commit(ctx)
}
