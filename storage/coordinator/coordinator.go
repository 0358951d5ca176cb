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
// A row's committed image is told apart from every other image the row
// has had by its identity, the pair (cc_version, cc_tx): every write that
// makes an image writes the id of a transaction that never wrote the row
// before (a roll-back keeps the aborted transaction's id), and the
// version alone would not do: a row deleted and inserted again starts
// again at version 1, and a single conditional put keeps the version
// (see One write below).
//
// # Protocol
//
// Reads go to the store; a transaction buffers its writes and reads each
// row once. Commit:
//
//  1. Prepare: every written row is conditionally put in the prepared
//     state, with the new values and the old image, on the condition that
//     it is still what the transaction read (the same identity, or still
//     absent). A failed condition is a conflict: the transaction records
//     "aborted" and rolls its prepared rows back — also when the failure
//     is the caller's context ending, within Config.Expiry.
//  2. Validate: every row and scan the transaction read and did not write
//     is read again; a row or a scan's row with another identity, or a
//     scan that finds rows appeared or gone, is a conflict.
//  3. Decide: the decision "committed" is put IfNotExists in the state
//     table. This is the transaction's linearization point. If a reader
//     recorded "aborted" first (below), the transaction rolls back.
//  4. The rows it deletes are deleted, on condition that this transaction
//     still holds them (readers finish what is left). The rows it puts
//     are not written again: once the decision says "committed", a row
//     prepared by the transaction holds its committed image, and stays
//     prepared until the next transaction that writes it.
//
// A reader that meets a row prepared by another transaction looks up
// that transaction's decision (a committed one, which never changes, is
// remembered by the process): committed, it takes the prepared image as
// the committed one — and, if it had to read the decision from the state
// table and does not write the row itself, rolls the row forward
// (committed, its version and image as they are) when it commits, so
// that readers elsewhere need not read the decision again — or deletes a
// row prepared for deletion; aborted, it restores the old image; none yet and the row prepared more than
// Config.Expiry ago, it records "aborted" for that transaction
// (IfNotExists: whoever is first decides) and acts on what is recorded;
// otherwise the reader's transaction conflicts, and Update retries it.
//
// Shortcuts, each a case of the protocol above with steps it does not
// need left out:
//
//   - One phase. A transaction that made no scan, and wrote every row it
//     read, all in one partition of one table, commits with one
//     conditional write (a Mutate for several rows) that puts every row
//     committed if each is still what was read. It is atomic, so it is
//     the commit point; no decision is needed and no reader meets the
//     rows prepared. Single operations through the coordinator (Put,
//     Delete, Mutate) are such transactions: a read of each row and one
//     write.
//   - One write. A conditional Put or Delete through the coordinator is
//     first sent as one conditional write, on its condition and that the
//     row is committed (so no transaction holds it, and the condition is
//     judged on its committed image); a put gives the row a new identity
//     by a new cc_tx, keeping its version. The write is the commit point,
//     as in one phase. If it does not apply, the operation runs as a
//     one-row transaction, which tells a condition that does not hold
//     from a row that is prepared.
//   - Blind inserts. A Deferred IfNotExists put is not read: its row is
//     taken to be absent, which the conditional write that prepares it
//     (or commits it in one phase) checks. A row found there is read:
//     present, the put's condition fails (ErrConditionNotMet, after the
//     prepared rows are rolled back); absent (a transaction that wrote it
//     did not commit), it is written again.
//   - A transaction that wrote nothing and read one row or made one scan
//     is not validated: a single read is atomic on its own.
//
// What the coordinator needs of the store: single operations that are
// atomic, and reads that see every write that returned before they began.
// Writes whose outcome the store left unknown may become visible later,
// to a later read only: a transaction whose prepare's outcome is unknown
// aborts, and one whose decision's outcome is unknown reports
// ErrCommitUnknown and its rows stay locked until a reader decides, with
// an IfNotExists write that meets the decision if it was made. On
// Cassandra, whose writes are all lightweight transactions committed at
// QUORUM, QUORUM reads are enough (storage/backends opens it so).
//
// Why it is serializable: when a transaction decides, every row it wrote
// is prepared by it, so no other transaction can have changed those rows
// since it read them (a writer's prepare condition would have failed) and
// none can change them until it has decided; every row and scan it only
// read was found unchanged after its prepares, so the transaction behaves
// as if it ran at its decision. A transaction that conflicts leaves no
// trace a reader would take for data.
//
// Invariants, and why they hold whatever client crashes when:
//
//   - A transaction is committed exactly when its decision row says
//     "committed", or, for a one-phase commit, its one conditional write
//     took effect. The decision is written once (IfNotExists), by the
//     transaction itself or, as "aborted", by a reader; so there is one
//     verdict, and Commit returns nil only after writing "committed". A
//     write of the decision whose reply is lost is ErrCommitUnknown, never
//     success or a plain failure. A failure before the decision, a
//     prepare whose reply is lost included, is not: the transaction can
//     no longer commit, so Commit reports the conflict, or ErrUnavailable
//     (retryable) for a store's failure.
//   - An acknowledged commit survives any client crash: before its
//     decision every row it wrote holds its new image (prepared), and the
//     decision is durable in the store; a prepared row is read by its
//     decision, which says "committed" for good. Nothing but that
//     transaction can change a row it holds until it has decided (a
//     writer's condition names the identity it read, which no reader
//     gives an undecided row), and a reader's roll-back needs an
//     "aborted" decision, which cannot coexist with "committed".
//   - A reader never sees a half-committed transaction: it returns only
//     committed images, and judges every prepared row it meets by the
//     writer's decision (or, once expired undecided, decides "aborted"
//     itself); so it sees each transaction's rows all with their new
//     images or all with their old. A prepare or decision that reaches
//     the store twice (a retried call) changes nothing the second time:
//     the conditions name the transaction and the identity read.
//   - Expiry only bounds how long a crashed client's rows stay locked; it
//     is not needed for safety. A transaction slower than Config.Expiry is
//     aborted by a reader, and its own decision then fails IfNotExists and
//     it reports a conflict.
//
// The decision rows are never removed yet: the table grows by one row per
// writing transaction. A committed transaction's decision is what makes
// its rows committed while they stay prepared, so removing one would
// first need every row it prepared rewritten as committed.
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

	// committed remembers transactions recorded as committed, whose
	// prepared rows readers take as committed without asking the state
	// table again.
	committed txSet
}

// txSet is a bounded set of transaction ids (UUIDs): the most recent
// maxTxSet to 2*maxTxSet of those added, some 40 bytes each. A decision
// never changes once recorded, so a remembered one is never stale; one
// forgotten is read again.
type txSet struct {
	mu       sync.Mutex
	cur, old map[uuid.UUID]struct{}
}

const maxTxSet = 1 << 16

func (s *txSet) add(tx string) {
	id, err := uuid.Parse(tx)
	if err != nil {
		return // not one of ours: not remembered
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cur) >= maxTxSet {
		s.old, s.cur = s.cur, nil
	}
	if s.cur == nil {
		s.cur = map[uuid.UUID]struct{}{}
	}
	s.cur[id] = struct{}{}
}

func (s *txSet) has(tx string) bool {
	id, err := uuid.Parse(tx)
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.cur[id]
	if !ok {
		_, ok = s.old[id]
	}
	return ok
}

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

// Put writes one row. A conditional put is first tried as one
// conditional write (condOnly); otherwise, or if that does not apply, it
// is a one-row transaction.
func (db *DB) Put(ctx context.Context, p *storage.Put) error {
	if p.Condition != nil {
		if done, err := db.condOnly(ctx, p.Namespace, p.Table, p.Condition, func(ti *tableInfo, cond *storage.Condition) error {
			vals := make(storage.Values, len(p.Values)+3)
			for k, v := range p.Values {
				vals[k] = v
			}
			vals[colTx], vals[colState] = storage.Text(uuid.NewString()), storage.BigInt(stateCommitted)
			if p.Condition.Kind == storage.CondIfNotExists {
				vals[colVersion] = storage.BigInt(1)
			}
			return db.s.Put(ctx, &storage.Put{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: p.Partition,
				Clustering: p.Clustering, Values: vals, Condition: cond})
		}, func(ti *tableInfo) error { return ti.user.CheckPut(p, db.lim) }); done {
			return err
		}
	}
	return storage.PutIn(ctx, db, p)
}

// Delete removes one row: as Put does, a conditional delete is first
// tried as one conditional write.
func (db *DB) Delete(ctx context.Context, d *storage.Delete) error {
	if d.Condition != nil {
		if done, err := db.condOnly(ctx, d.Namespace, d.Table, d.Condition, func(ti *tableInfo, cond *storage.Condition) error {
			return db.s.Delete(ctx, &storage.Delete{Namespace: ti.inner.Namespace, Table: ti.inner.Name, Partition: d.Partition,
				Clustering: d.Clustering, Condition: cond})
		}, func(ti *tableInfo) error { return ti.user.CheckDelete(d, db.lim) }); done {
			return err
		}
	}
	return storage.DeleteIn(ctx, db, d)
}

// condOnly tries a single conditional put or delete as one conditional
// write of the store, write, on the user's condition and that the row is
// committed, not prepared: a row that holds its committed image, which
// the condition is then judged on, and that no transaction holds. (A row
// that does not exist is not prepared either: IfNotExists needs no more.)
// The write is the operation's commit point, as a one-phase commit's is
// (see the package doc). A put gives the row a new identity without
// reading it: its version stays, its cc_tx is new. It returns done =
// false when the write did not apply, for whatever reason — the
// condition, a prepared row, a row committed but not yet rolled forward
// — and the caller then runs the operation as a transaction, which tells
// them apart; also when the request does not pass check, so that the
// transaction reports it as it always does. Otherwise done is true, with
// the write's error.
func (db *DB) condOnly(ctx context.Context, ns, table string, c *storage.Condition,
	write func(ti *tableInfo, cond *storage.Condition) error, check func(ti *tableInfo) error) (done bool, _ error) {
	ti, err := db.table(ctx, ns, table)
	if err != nil || check(ti) != nil {
		return false, nil
	}
	cond := c
	if c.Kind != storage.CondIfNotExists {
		committed := storage.Eq(colState, storage.BigInt(stateCommitted))
		cond = storage.If(append(slices.Clip(c.Exprs), committed)...)
	}
	err = write(ti, cond)
	if errors.Is(err, storage.ErrConditionNotMet) {
		return false, nil
	}
	return true, err
}

// Mutate applies ms in one transaction: one partition, all or nothing.
func (db *DB) Mutate(ctx context.Context, ms []storage.Mutation) error {
	return storage.MutateIn(ctx, db, ms)
}

// Begin starts a transaction.
func (db *DB) Begin(ctx context.Context) (storage.Txn, error) {
	return &txn{db: db, id: uuid.NewString(), reads: map[string]*readRec{}, writes: map[string]*writeRec{}}, nil
}
