// Package postgres is the PostgreSQL backend of the storage API.
//
// Mapping. A kiroku namespace is a PostgreSQL schema of the same name and a
// kiroku table is one SQL table in it, named after the table plus '$' and a
// tag drawn when it is created (orders$1f3a9c2b), so that a table dropped and
// created again by another process is a different relation and a stale
// cached schema is noticed rather than written by. Key columns are NOT NULL
// and form the primary key (partition columns, then clustering columns); when
// a clustering column is DESC an extra index holds the exact clustering
// order. Types map as BOOLEAN→boolean, BIGINT→bigint, DOUBLE→double
// precision, TEXT→text COLLATE "C" (byte order, independent of the server's
// locale), BLOB→bytea, TIMESTAMP→timestamptz. Schemas are kept, as JSON, in
// the kiroku_meta schema of the same database (with a layout version this
// build checks), so any process attached to it finds them. DDL runs in one
// PostgreSQL transaction with its metadata, under an advisory lock.
//
// Isolation. Every connection runs at SERIALIZABLE (default_transaction_
// isolation), single statements included. PostgreSQL's serializable snapshot
// isolation gives serializability with phantom protection (predicate locks on
// index ranges); since a transaction's snapshot is taken after its Begin and
// a commit is visible to every later snapshot once COMMIT returns, the order
// also respects real time, which makes it strictly serializable.
//
// Conditions are part of the writing statement (UPDATE ... WHERE cond,
// INSERT ... ON CONFLICT DO NOTHING), so the check and the write are atomic.
//
// Errors. Serialization failures (40001) and deadlocks (40P01) become
// storage.ErrConflict; single operations retry them internally, transactions
// return them for storage.Update to retry. Connection failures become
// storage.ErrUnavailable, or storage.ErrCommitUnknown when a write or COMMIT
// may have reached the server.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kiroku-db/kiroku/storage"
)

// Config configures a Backend.
type Config struct {
	// DSN is a libpq connection string or URL. Required.
	DSN string
	// MaxConns is the connection pool size; 0 means 32.
	MaxConns int32
	// Limits are the storage size limits; zero fields take the defaults.
	Limits storage.Limits
	// OpRetries is how many times a single (non-transactional) operation is
	// tried when it hits a serialization failure or deadlock; 0 means 10.
	OpRetries int

	// isolation is always serializable outside this package's tests, which
	// weaken it to show that the conformance suite catches the anomalies.
	isolation pgx.TxIsoLevel
}

// Validate fills defaults and rejects bad settings.
func (c *Config) Validate() error {
	if c.DSN == "" {
		return errors.New("postgres: Config.DSN is empty")
	}
	if c.MaxConns < 0 || c.OpRetries < 0 {
		return errors.New("postgres: negative MaxConns or OpRetries")
	}
	if c.MaxConns == 0 {
		c.MaxConns = 32
	}
	if c.OpRetries == 0 {
		c.OpRetries = 10
	}
	if c.isolation == "" {
		c.isolation = pgx.Serializable
	}
	lim, err := c.Limits.WithDefaults()
	c.Limits = lim
	return err
}

// Backend is a storage.Backend on PostgreSQL.
type Backend struct {
	pool   *pgxpool.Pool
	limits storage.Limits
	tries  int
	iso    pgx.TxIsoLevel
	closed atomic.Bool

	mu struct {
		sync.RWMutex
		tables map[string]*relTable // "ns.table" → schema and relation
	}
}

var _ storage.Backend = (*Backend)(nil)

// metaVersion is the layout of the kiroku_meta schema this build reads.
const metaVersion = 1

// metaLock is the advisory lock key that serializes kiroku DDL across processes.
const metaLock = 0x6b69726f6b75 // "kiroku"

// Open connects to PostgreSQL and creates kiroku's metadata schema if needed.
// A server that cannot be reached gives storage.ErrUnavailable.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres: bad DSN: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = string(cfg.isolation)
	pc.ConnConfig.RuntimeParams["timezone"] = "UTC"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	b := &Backend{pool: pool, limits: cfg.Limits, tries: cfg.OpRetries, iso: cfg.isolation}
	b.mu.tables = map[string]*relTable{}
	err = b.inTx(ctx, "open", func(tx pgx.Tx) error {
		for _, q := range []string{
			`CREATE SCHEMA IF NOT EXISTS kiroku_meta`,
			`CREATE TABLE IF NOT EXISTS kiroku_meta.version (version int NOT NULL)`,
			`INSERT INTO kiroku_meta.version SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM kiroku_meta.version)`,
			`CREATE TABLE IF NOT EXISTS kiroku_meta.namespaces (name text COLLATE "C" PRIMARY KEY)`,
			`CREATE TABLE IF NOT EXISTS kiroku_meta.tables (namespace text COLLATE "C", name text COLLATE "C",
				relation text NOT NULL, definition jsonb NOT NULL, PRIMARY KEY (namespace, name))`,
		} {
			var args []any
			if strings.Contains(q, "$1") {
				args = []any{metaVersion}
			}
			if _, err := tx.Exec(ctx, q, args...); err != nil {
				return err
			}
		}
		var v int
		if err := tx.QueryRow(ctx, `SELECT max(version) FROM kiroku_meta.version`).Scan(&v); err != nil {
			return err
		}
		if v != metaVersion {
			return fmt.Errorf("postgres: this database holds kiroku metadata version %d; this build reads version %d", v, metaVersion)
		}
		return nil
	})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return b, nil
}

// Limits implements storage.Backend.
func (b *Backend) Limits() storage.Limits { return b.limits }

// Close closes the pool.
func (b *Backend) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.pool.Close()
	}
	return nil
}

func (b *Backend) checkOpen(op string) error {
	if b.closed.Load() {
		return &storage.Error{Kind: storage.ErrClosed, Op: op}
	}
	return nil
}

// inTx runs fn in a serializable transaction under kiroku's DDL lock,
// retrying serialization failures.
func (b *Backend) inTx(ctx context.Context, op string, fn func(pgx.Tx) error) error {
	return b.retry(ctx, func() error {
		tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: b.iso})
		if err != nil {
			return mapErr(op, "", "", err, false)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(metaLock)); err != nil {
			return mapErr(op, "", "", err, false)
		}
		if err := fn(tx); err != nil {
			return mapErr(op, "", "", err, false)
		}
		return commit(ctx, op, tx)
	})
}

// retry runs fn until it does not return ErrConflict, at most b.tries times,
// with a short jittered backoff.
func (b *Backend) retry(ctx context.Context, fn func() error) error {
	policy := storage.RetryPolicy{MaxAttempts: b.tries, BaseDelay: 500 * time.Microsecond, MaxDelay: 50 * time.Millisecond}
	var err error
	for attempt := 0; ; attempt++ {
		err = fn()
		if err == nil || !errors.Is(err, storage.ErrConflict) || attempt+1 >= b.tries {
			return err
		}
		if werr := policy.Sleep(ctx, attempt); werr != nil {
			return werr
		}
	}
}

// mapErr turns a driver error into a storage error. mayHaveCommitted says
// whether the failed call could have committed something on its own (a
// COMMIT, or an autocommitted write): a lost connection then gives
// ErrCommitUnknown, unless the connection was never made. pgconn.SafeToRetry
// is not trusted for this: when the reply to a query that was sent is lost,
// pgx can report a "conn closed" lock error that claims to be safe to retry
// (TestCommitOutcomeUnknown shows it).
func mapErr(op, ns, table string, err error, mayHaveCommitted bool) error {
	if err == nil {
		return nil
	}
	var se *storage.Error
	if errors.As(err, &se) {
		return err
	}
	e := &storage.Error{Op: op, Namespace: ns, Table: table, Cause: err}
	var pe *pgconn.PgError
	isPg := errors.As(err, &pe)
	ctxDone := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	// Was the call cut short by something other than the server's verdict
	// on it: a lost connection, a server shutting down, the caller's context?
	if ctxDone || isConnErr(err) ||
		isPg && (strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P") || pe.Code == "53300") {
		var ce *pgconn.ConnectError
		switch {
		case mayHaveCommitted && !errors.As(err, &ce):
			e.Kind = storage.ErrCommitUnknown
		case ctxDone:
			return fmt.Errorf("storage: %s: %w", op, err)
		default:
			e.Kind = storage.ErrUnavailable
		}
		return e
	}
	if !isPg {
		return fmt.Errorf("storage: %s: postgres: %w", op, err)
	}
	switch {
	case pe.Code == "40001" || pe.Code == "40P01":
		e.Kind = storage.ErrConflict
	case pe.Code == "42P01":
		// The cached schema names a relation that is gone: another process
		// dropped (and perhaps recreated) the table. That is a conflict with
		// its DDL; a retry reloads the schema and judges the request again.
		e.Kind = storage.ErrConflict
		e.Detail = "the table was dropped or replaced by another process"
	case pe.Code == "3F000":
		e.Kind = storage.ErrNamespaceNotFound
	case pe.Code == "54000":
		e.Kind = storage.ErrTooLarge
	case strings.HasPrefix(pe.Code, "22"):
		e.Kind = storage.ErrInvalidValue
	default:
		return fmt.Errorf("storage: %s: postgres: %w", op, err)
	}
	return e
}

func isConnErr(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err)
}

// notSent is why a COMMIT is not worth sending, or nil: the caller's
// context has ended (a plain context error: nothing was sent), or the
// connection is known dead (ErrUnavailable: nothing can have committed).
func notSent(ctx context.Context, op string, c *pgx.Conn) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("storage: %s: not sent: %w", op, err)
	}
	if c.IsClosed() {
		return &storage.Error{Kind: storage.ErrUnavailable, Op: op, Detail: "connection lost before commit; nothing was committed"}
	}
	return nil
}

// commit commits tx. A connection already known dead has sent nothing, so
// the transaction cannot have committed: ErrUnavailable. Otherwise a lost
// connection leaves the outcome unknown.
func commit(ctx context.Context, op string, tx pgx.Tx) error {
	if err := notSent(ctx, op, tx.Conn()); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	err := tx.Commit(ctx)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	return mapErr(op, "", "", err, true)
}
