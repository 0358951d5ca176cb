// Package coordinator gives strictly serializable multi-partition
// transactions to a storage.Store that has none of its own (Cassandra),
// using only what every Store has: single-row reads, single-partition
// scans and conditional writes. It is a client-coordinated commit in the
// manner of ScalarDB's Consensus Commit; every process that opens the
// same Store through it takes part, and no server of its own is needed.
//
// # Layout
//
// Each table the coordinator creates is the user's table plus metadata
// columns, all named with the reserved prefix "cc_": the transaction that
// wrote the row (cc_tx), the row's state (cc_state: committed, prepared,
// or prepared for deletion), its version (cc_version, 1 for the first),
// when it was prepared (cc_prepared, µs), and the row's committed image
// before the transaction that prepared it: cc_before_present, one
// cc_b_<column> per value column, and cc_before_version. User column
// names must not start with "cc_". A table "state" in the coordinator's
// own namespace records each transaction's decision: committed or
// aborted, written once with IfNotExists.
//
// # Protocol
//
// Reads go to the store; a transaction buffers its writes. Commit:
//
//  1. Prepare: every written row is conditionally put in the prepared
//     state, with the new values and the old image, on the condition that
//     it is still what the transaction read (the same committed version,
//     or still absent). A failed condition is a conflict: the prepared
//     rows are rolled back.
//  2. Validate: every row and scan the transaction read and did not write
//     is read again; a different version, a row prepared by another, or a
//     scan whose rows changed is a conflict.
//  3. Decide: the decision "committed" is put IfNotExists in the state
//     table. This is the transaction's linearization point. If a reader
//     recorded "aborted" first (below), the transaction rolls back.
//  4. Commit the rows: each prepared row becomes committed (its version
//     one higher) or is deleted, on the condition that this transaction
//     still holds it. This may be left unfinished: readers finish it.
//
// A transaction that read and wrote a single row, and nothing else, commits
// in one phase instead: one conditional write puts the row committed if it
// is still the version read. Single operations through the coordinator
// (Put, Delete) are such transactions: a read and one write.
//
// A reader that meets a row prepared by another transaction looks up
// that transaction's decision: committed, it rolls the row forward;
// aborted, it restores the old image; none yet and the row prepared more
// than Config.Expiry ago, it records "aborted" for that transaction
// (IfNotExists: whoever is first decides) and acts on what is recorded;
// otherwise the reader's transaction conflicts, and Update retries it.
//
// Why it is serializable: when a transaction decides, every row it wrote
// is prepared by it, so no other transaction can have changed those rows
// since it read them (a writer's prepare condition would have failed) and
// none can change them until they are committed; every row and scan it
// only read was found unchanged after its prepares, so the transaction
// behaves as if it ran at its decision. A transaction that conflicts
// leaves no trace a reader would take for data.
//
// Invariants, and why they hold whatever client crashes when:
//
//   - A transaction is committed exactly when its decision row says
//     "committed". The decision is written once (IfNotExists), by the
//     transaction itself or, as "aborted", by a reader; so there is one
//     verdict, and Commit returns nil only after writing "committed". A
//     write of the decision whose reply is lost is ErrCommitUnknown, never
//     success or a plain failure. A failure before the decision, a
//     prepare whose reply is lost included, is not: the transaction can
//     no longer commit, so Commit reports the conflict, or ErrUnavailable
//     (retryable) for a store's failure.
//   - An acknowledged commit survives any client crash: before its
//     decision every row it wrote holds its new image (prepared), and the
//     decision is durable in the store; a row still prepared after the
//     client died is rolled forward by the first reader that meets it,
//     since the decision says "committed". Nothing but that transaction
//     can change a row it holds, and a reader's roll-back needs an
//     "aborted" decision, which cannot coexist with "committed".
//   - A reader never sees a half-committed transaction: it returns only
//     committed rows, and turns every prepared row it meets into a
//     committed one first, by the writer's decision (or, once expired
//     undecided, by deciding "aborted" itself); so it sees each
//     transaction's rows all with their new images or all with their old.
//     A prepare or decision that reaches the store twice (a retried call)
//     changes nothing the second time: the conditions name the
//     transaction and the version read.
//   - Expiry only bounds how long a crashed client's rows stay locked; it
//     is not needed for safety. A transaction slower than Config.Expiry is
//     aborted by a reader, and its own decision then fails IfNotExists and
//     it reports a conflict.
//
// The decision rows are never removed yet: the table grows by one row per
// writing transaction.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kiroku-db/kiroku/storage"
)

// Metadata column names.
const (
	prefix        = "cc_"
	colTx         = "cc_tx"
	colState      = "cc_state"
	colVersion    = "cc_version"
	colPrepared   = "cc_prepared"
	colBefPresent = "cc_before_present"
	colBefVersion = "cc_before_version"
	befPrefix     = "cc_b_"
)

// Row states.
const (
	stateCommitted   = 1
	statePrepared    = 2
	statePreparedDel = 3
)

// Decisions in the state table.
const (
	decCommitted = 1
	decAborted   = 2
)

// Config configures a coordinator.
type Config struct {
	// Namespace holds the state table; "" means "coordinator". Users
	// cannot create or drop it through the coordinator.
	Namespace string
	// Expiry is how long a prepared row of a transaction with no decision
	// is left to it before a reader aborts the transaction. 0 means 10 s;
	// it must exceed the longest commit.
	Expiry time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DB is a Store with the coordinator's transactions: a storage.Backend.
type DB struct {
	s   storage.Store
	cfg Config
	lim storage.Limits

	mu     sync.Mutex
	tables map[string]*tableInfo // by namespace/name
}

var _ storage.Backend = (*DB)(nil)

// tableInfo is a table's user schema and the store's.
type tableInfo struct {
	user  *storage.Table
	inner *storage.Table
}

const stateTable = "state"

// Open wraps s. It creates the state table if it is missing.
func Open(ctx context.Context, s storage.Store, cfg Config) (*DB, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "coordinator"
	}
	if cfg.Expiry == 0 {
		cfg.Expiry = 10 * time.Second
	}
	if cfg.Expiry < 0 {
		return nil, errors.New("coordinator: negative expiry")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	lim := s.Limits()
	// A prepared row holds two images of its values.
	lim.MaxWriteSize = (lim.MaxWriteSize - lim.MaxKeySize) / 2
	lim.MaxValueSize = min(lim.MaxValueSize, lim.MaxWriteSize)
	db := &DB{s: s, cfg: cfg, lim: lim, tables: map[string]*tableInfo{}}
	st := &storage.Table{Namespace: cfg.Namespace, Name: stateTable,
		PartitionKey: []storage.Column{{Name: "tx", Type: storage.TypeText}},
		Columns:      []storage.Column{{Name: "decision", Type: storage.TypeBigInt}, {Name: "at", Type: storage.TypeBigInt}}}
	if err := storage.EnsureTables(ctx, s, cfg.Namespace, []*storage.Table{st}); err != nil {
		return nil, fmt.Errorf("coordinator: the state table: %w", err)
	}
	return db, nil
}

// Store is the store underneath.
func (db *DB) Store() storage.Store { return db.s }

// Limits are the store's, with room for a prepared row's second image.
func (db *DB) Limits() storage.Limits { return db.lim }

// Close closes the store.
func (db *DB) Close() error { return db.s.Close() }

// ---- Admin ----------------------------------------------------------------

func (db *DB) reserved(ns string) error {
	if ns == db.cfg.Namespace {
		return &storage.Error{Kind: storage.ErrInvalidName, Op: "namespace", Namespace: ns, Detail: "the transaction coordinator's namespace"}
	}
	return nil
}

func (db *DB) CreateNamespace(ctx context.Context, name string) error {
	if err := db.reserved(name); err != nil {
		return err
	}
	return db.s.CreateNamespace(ctx, name)
}

func (db *DB) DropNamespace(ctx context.Context, name string) error {
	if err := db.reserved(name); err != nil {
		return err
	}
	return db.s.DropNamespace(ctx, name)
}

func (db *DB) ListNamespaces(ctx context.Context) ([]string, error) {
	ns, err := db.s.ListNamespaces(ctx)
	return slices.DeleteFunc(ns, func(n string) bool { return n == db.cfg.Namespace }), err
}

// innerTable is t with the metadata columns.
func innerTable(t *storage.Table) *storage.Table {
	in := t.Clone()
	for _, c := range t.Columns {
		in.Columns = append(in.Columns, storage.Column{Name: befPrefix + c.Name, Type: c.Type})
	}
	in.Columns = append(in.Columns,
		storage.Column{Name: colTx, Type: storage.TypeText},
		storage.Column{Name: colState, Type: storage.TypeBigInt},
		storage.Column{Name: colVersion, Type: storage.TypeBigInt},
		storage.Column{Name: colPrepared, Type: storage.TypeBigInt},
		storage.Column{Name: colBefPresent, Type: storage.TypeBoolean},
		storage.Column{Name: colBefVersion, Type: storage.TypeBigInt})
	return in
}

// userTable is the user's schema of a store table.
func userTable(in *storage.Table) *storage.Table {
	t := in.Clone()
	t.Columns = slices.DeleteFunc(t.Columns, func(c storage.Column) bool { return strings.HasPrefix(c.Name, prefix) })
	return t
}

func (db *DB) CreateTable(ctx context.Context, t *storage.Table) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if err := db.reserved(t.Namespace); err != nil {
		return err
	}
	for _, n := range t.ColumnNames() {
		if strings.HasPrefix(n, prefix) {
			return &storage.Error{Kind: storage.ErrInvalidSchema, Op: "create table", Namespace: t.Namespace, Table: t.Name, Column: n,
				Detail: "column names starting with " + prefix + " are the transaction coordinator's"}
		}
	}
	if len(t.Columns)*2+len(t.PartitionKey)+len(t.ClusteringKey)+6 > storage.MaxColumns {
		return &storage.Error{Kind: storage.ErrInvalidSchema, Op: "create table", Namespace: t.Namespace, Table: t.Name,
			Detail: fmt.Sprintf("%d value columns: the coordinator keeps two images of each, and at most %d columns fit", len(t.Columns), storage.MaxColumns)}
	}
	return db.s.CreateTable(ctx, innerTable(t))
}

func (db *DB) DropTable(ctx context.Context, namespace, table string) error {
	if err := db.reserved(namespace); err != nil {
		return err
	}
	db.mu.Lock()
	delete(db.tables, namespace+"/"+table)
	db.mu.Unlock()
	return db.s.DropTable(ctx, namespace, table)
}

func (db *DB) DescribeTable(ctx context.Context, namespace, table string) (*storage.Table, error) {
	ti, err := db.table(ctx, namespace, table)
	if err != nil {
		return nil, err
	}
	return ti.user.Clone(), nil
}

func (db *DB) ListTables(ctx context.Context, namespace string) ([]string, error) {
	if err := db.reserved(namespace); err != nil {
		return nil, err
	}
	return db.s.ListTables(ctx, namespace)
}

// table returns a table's schemas, cached. A table dropped and created
// again by another process is found again on the next miss only; the
// store refuses what no longer fits.
func (db *DB) table(ctx context.Context, namespace, name string) (*tableInfo, error) {
	key := namespace + "/" + name
	db.mu.Lock()
	ti := db.tables[key]
	db.mu.Unlock()
	if ti != nil {
		return ti, nil
	}
	if err := db.reserved(namespace); err != nil {
		return nil, err
	}
	in, err := db.s.DescribeTable(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	ti = &tableInfo{user: userTable(in), inner: in}
	db.mu.Lock()
	db.tables[key] = ti
	db.mu.Unlock()
	return ti, nil
}

// ---- single operations: one-operation transactions ------------------------

func (db *DB) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	return storage.GetIn(ctx, db, g)
}

func (db *DB) Scan(ctx context.Context, s *storage.Scan) (storage.Rows, error) {
	return storage.ScanIn(ctx, db, s)
}

func (db *DB) Put(ctx context.Context, p *storage.Put) error { return storage.PutIn(ctx, db, p) }

func (db *DB) Delete(ctx context.Context, d *storage.Delete) error {
	return storage.DeleteIn(ctx, db, d)
}

// Mutate applies ms in one transaction: one partition, all or nothing.
func (db *DB) Mutate(ctx context.Context, ms []storage.Mutation) error {
	return storage.MutateIn(ctx, db, ms)
}

// Begin starts a transaction.
func (db *DB) Begin(ctx context.Context) (storage.Txn, error) {
	return &txn{db: db, id: uuid.NewString(), reads: map[string]*readRec{}, writes: map[string]*writeRec{}}, nil
}
