package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/kiroku-db/kiroku/storage"
)

// The catalog (namespaces, tables and their ids) changes only through DDL
// records in the log (records.go): a DDL is logged, made durable, and then
// applied, by the same step every replica applies it with (apply.go).
// Each checkpoint holds the catalog as of its start (catalogSnapshot), so
// that the log before it can be truncated. Table ids are never reused:
// log records and checkpoint rows of a table the catalog no longer has
// are skipped, and applying a DDL record twice (once in a checkpoint's
// snapshot, once from the log after it) changes nothing the second time.

type catalogTable struct {
	ID     uint64         `json:"id"`
	Schema *storage.Table `json:"schema"`
}

// epochRange is an inclusive range of epochs.
type epochRange struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
}

type catalog struct {
	mu struct {
		sync.RWMutex
		namespaces map[string]map[string]*table
		byID       map[uint64]*table
		nextID     uint64
	}
}

func (c *catalog) init() {
	c.mu.namespaces = map[string]map[string]*table{}
	c.mu.byID = map[uint64]*table{}
	c.mu.nextID = 1
}

// lookup returns a live table.
func (c *catalog) lookup(op, ns, name string) (*table, error) {
	c.mu.RLock()
	t := c.mu.namespaces[ns][name]
	_, nsOK := c.mu.namespaces[ns]
	c.mu.RUnlock()
	if t != nil {
		return t, nil
	}
	if err := storage.CheckName("namespace", ns); err != nil {
		return nil, err
	}
	if err := storage.CheckName("table", name); err != nil {
		return nil, err
	}
	if !nsOK {
		return nil, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: ns, Table: name}
	}
	return nil, &storage.Error{Kind: storage.ErrTableNotFound, Op: op, Namespace: ns, Table: name}
}

func (c *catalog) byID(id uint64) *table {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.mu.byID[id]
}

func (c *catalog) tables() []*table {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.tablesLocked()
}

func (c *catalog) tablesLocked() []*table {
	out := make([]*table, 0, len(c.mu.byID))
	for _, t := range c.mu.byID {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// ddlOp is one catalog change, as a DDL record holds it.
type ddlOp struct {
	Op        string         `json:"op"` // one of the ddl* names
	Namespace string         `json:"namespace"`
	ID        uint64         `json:"id,omitempty"`     // the table's id (create_table, drop_table)
	Schema    *storage.Table `json:"schema,omitempty"` // create_table
}

const (
	ddlCreateNamespace = "create_namespace"
	ddlDropNamespace   = "drop_namespace"
	ddlCreateTable     = "create_table"
	ddlDropTable       = "drop_table"
)

// check checks what a DDL record says by itself.
func (op ddlOp) check() error {
	if err := storage.CheckNamespaceName(op.Namespace); err != nil {
		return err
	}
	switch op.Op {
	case ddlCreateNamespace, ddlDropNamespace:
		if op.ID != 0 || op.Schema != nil {
			return fmt.Errorf("%s with a table", op.Op)
		}
	case ddlCreateTable:
		if op.ID == 0 || op.Schema == nil || op.Schema.Namespace != op.Namespace {
			return fmt.Errorf("create_table %d without its schema", op.ID)
		}
		return op.Schema.Validate()
	case ddlDropTable:
		if op.ID == 0 || op.Schema != nil {
			return fmt.Errorf("drop_table of table %d", op.ID)
		}
	default:
		return fmt.Errorf("unknown operation %q", op.Op)
	}
	return nil
}

// applyLocked applies a checked DDL operation. It is idempotent: a change
// already made (a checkpoint's snapshot holds it) changes nothing. One
// that contradicts the catalog (a table in a namespace that does not
// exist, a namespace dropped with tables in it) is an error. Called with
// mu held.
func (c *catalog) applyLocked(op ddlOp) error {
	tabs, nsOK := c.mu.namespaces[op.Namespace]
	switch op.Op {
	case ddlCreateNamespace:
		if !nsOK {
			c.mu.namespaces[op.Namespace] = map[string]*table{}
		}
	case ddlDropNamespace:
		if len(tabs) > 0 {
			return fmt.Errorf("namespace %s dropped with %d tables", op.Namespace, len(tabs))
		}
		delete(c.mu.namespaces, op.Namespace)
	case ddlCreateTable:
		c.mu.nextID = max(c.mu.nextID, op.ID+1)
		if c.mu.byID[op.ID] != nil {
			return nil
		}
		if !nsOK {
			return fmt.Errorf("table %d created in namespace %s, which does not exist", op.ID, op.Namespace)
		}
		if tabs[op.Schema.Name] != nil {
			return fmt.Errorf("table %d created as %s.%s, which exists", op.ID, op.Namespace, op.Schema.Name)
		}
		t := newTable(op.ID, op.Schema.Clone())
		tabs[op.Schema.Name] = t
		c.mu.byID[op.ID] = t
	case ddlDropTable:
		t := c.mu.byID[op.ID]
		if t == nil {
			return nil
		}
		delete(c.mu.namespaces[t.schema.Namespace], t.schema.Name)
		delete(c.mu.byID, op.ID)
		t.dropped.Store(true)
	}
	return nil
}

// catalogSnapshot is the catalog as a checkpoint holds it, with the
// logger count of the era the checkpoint was taken in (the log after it
// may no longer hold that era's record).
type catalogSnapshot struct {
	NextID     uint64         `json:"next_table_id"`
	Namespaces []string       `json:"namespaces"`
	Tables     []catalogTable `json:"tables"`
	Loggers    int            `json:"loggers"`
}

func (c *catalog) snapshotLocked(loggers int) catalogSnapshot {
	s := catalogSnapshot{NextID: c.mu.nextID, Namespaces: []string{}, Tables: []catalogTable{}, Loggers: loggers}
	for ns := range c.mu.namespaces {
		s.Namespaces = append(s.Namespaces, ns)
	}
	sort.Strings(s.Namespaces)
	for _, t := range c.tablesLocked() {
		s.Tables = append(s.Tables, catalogTable{ID: t.id, Schema: t.schema})
	}
	return s
}

// restore replaces the catalog by a snapshot, checking it as untrusted.
func (c *catalog) restore(s catalogSnapshot) error {
	if s.NextID == 0 || s.Loggers < 1 || s.Loggers > maxLoggers {
		return malformed("catalog: next table id %d, %d loggers", s.NextID, s.Loggers)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	c.mu.nextID = s.NextID
	for _, ns := range s.Namespaces {
		if err := c.applyLocked(ddlOp{Op: ddlCreateNamespace, Namespace: ns}); err != nil {
			return malformed("catalog: %v", err)
		}
	}
	for _, ct := range s.Tables {
		if ct.Schema == nil {
			return malformed("catalog: table %d without a schema", ct.ID)
		}
		op := ddlOp{Op: ddlCreateTable, Namespace: ct.Schema.Namespace, ID: ct.ID, Schema: ct.Schema}
		if err := op.check(); err != nil || ct.ID >= s.NextID || c.mu.byID[ct.ID] != nil {
			return malformed("catalog: bad table %d (%v)", ct.ID, err)
		}
		if err := c.applyLocked(op); err != nil {
			return malformed("catalog: %v", err)
		}
	}
	c.mu.nextID = s.NextID
	return nil
}

// ---- storage.Admin ----------------------------------------------------------

func (db *DB) checkOpen(op string) error {
	if db.closed.Load() {
		return &storage.Error{Kind: storage.ErrClosed, Op: op}
	}
	return nil
}

// ddl makes one catalog change: under the catalog's lock, build checks
// it against the catalog and describes it; the change is logged and made
// durable, and then applied as every replica applies it. A change whose
// record may or may not have reached the log (the log failed) is
// ErrCommitUnknown, and the engine has failed.
func (db *DB) ddl(opName string, build func() (ddlOp, error)) error {
	if err := db.usable(opName); err != nil {
		return err
	}
	if db.following.Load() {
		return &storage.Error{Kind: storage.ErrNotLeader, Op: opName, Detail: "catalog changes go to the leader"}
	}
	c := &db.cat
	c.mu.Lock()
	defer c.mu.Unlock()
	op, err := build()
	if err != nil {
		return err
	}
	if db.cfg.Log == LogWAL {
		rec, err := ddlRecord(db.epoch.Load(), op)
		if err != nil {
			return err
		}
		if err := db.logDDL(rec); err != nil {
			return &storage.Error{Kind: storage.ErrCommitUnknown, Op: opName, Detail: "logging the catalog change", Cause: err}
		}
	}
	if err := c.applyLocked(op); err != nil {
		// The record is durable and every replica will fail on it too.
		db.fail(fmt.Errorf("catalog change %s: %w", op.Op, err))
		return &storage.Error{Kind: storage.ErrUnavailable, Op: opName, Cause: err}
	}
	return nil
}

func (db *DB) CreateNamespace(ctx context.Context, name string) error {
	if err := storage.CheckNamespaceName(name); err != nil {
		return err
	}
	return db.ddl("create namespace", func() (ddlOp, error) {
		if _, ok := db.cat.mu.namespaces[name]; ok {
			return ddlOp{}, &storage.Error{Kind: storage.ErrNamespaceExists, Op: "create namespace", Namespace: name}
		}
		return ddlOp{Op: ddlCreateNamespace, Namespace: name}, nil
	})
}

func (db *DB) DropNamespace(ctx context.Context, name string) error {
	return db.ddl("drop namespace", func() (ddlOp, error) {
		tabs, ok := db.cat.mu.namespaces[name]
		if !ok {
			return ddlOp{}, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: "drop namespace", Namespace: name}
		}
		if len(tabs) > 0 {
			return ddlOp{}, &storage.Error{Kind: storage.ErrNamespaceNotEmpty, Op: "drop namespace", Namespace: name,
				Detail: fmt.Sprintf("%d tables", len(tabs))}
		}
		return ddlOp{Op: ddlDropNamespace, Namespace: name}, nil
	})
}

func (db *DB) ListNamespaces(ctx context.Context) ([]string, error) {
	if err := db.checkOpen("list namespaces"); err != nil {
		return nil, err
	}
	db.cat.mu.RLock()
	defer db.cat.mu.RUnlock()
	out := make([]string, 0, len(db.cat.mu.namespaces))
	for ns := range db.cat.mu.namespaces {
		out = append(out, ns)
	}
	sort.Strings(out)
	return out, nil
}

func (db *DB) CreateTable(ctx context.Context, t *storage.Table) error {
	if t == nil {
		return &storage.Error{Kind: storage.ErrInvalidSchema, Op: "create table", Detail: "nil table"}
	}
	if err := t.Validate(); err != nil {
		return err
	}
	schema := t.Clone()
	return db.ddl("create table", func() (ddlOp, error) {
		c := &db.cat
		tabs, ok := c.mu.namespaces[schema.Namespace]
		if !ok {
			return ddlOp{}, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: "create table", Namespace: schema.Namespace, Table: schema.Name}
		}
		if _, ok := tabs[schema.Name]; ok {
			return ddlOp{}, &storage.Error{Kind: storage.ErrTableExists, Op: "create table", Namespace: schema.Namespace, Table: schema.Name}
		}
		return ddlOp{Op: ddlCreateTable, Namespace: schema.Namespace, ID: c.mu.nextID, Schema: schema}, nil
	})
}

func (db *DB) DropTable(ctx context.Context, ns, name string) error {
	return db.ddl("drop table", func() (ddlOp, error) {
		t, err := db.lookupLocked("drop table", ns, name)
		if err != nil {
			return ddlOp{}, err
		}
		return ddlOp{Op: ddlDropTable, Namespace: ns, ID: t.id}, nil
	})
}

func (db *DB) lookupLocked(op, ns, name string) (*table, error) {
	tabs, ok := db.cat.mu.namespaces[ns]
	if !ok {
		return nil, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: op, Namespace: ns, Table: name}
	}
	t, ok := tabs[name]
	if !ok {
		return nil, &storage.Error{Kind: storage.ErrTableNotFound, Op: op, Namespace: ns, Table: name}
	}
	return t, nil
}

func (db *DB) DescribeTable(ctx context.Context, ns, name string) (*storage.Table, error) {
	if err := db.checkOpen("describe table"); err != nil {
		return nil, err
	}
	t, err := db.cat.lookup("describe table", ns, name)
	if err != nil {
		return nil, err
	}
	return t.schema.Clone(), nil
}

func (db *DB) ListTables(ctx context.Context, ns string) ([]string, error) {
	if err := db.checkOpen("list tables"); err != nil {
		return nil, err
	}
	db.cat.mu.RLock()
	defer db.cat.mu.RUnlock()
	tabs, ok := db.cat.mu.namespaces[ns]
	if !ok {
		return nil, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: "list tables", Namespace: ns}
	}
	out := make([]string, 0, len(tabs))
	for name := range tabs {
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}
