package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/cockroachdb/errors/oserror"

	"github.com/kiroku-db/kiroku/internal/vfsutil"
	"github.com/kiroku-db/kiroku/storage"
)

// The catalog (namespaces, tables and their ids) lives in one JSON file,
// catalog.json, replaced atomically (write a temporary file, fsync,
// rename, fsync the directory) by every DDL before the DDL returns. DDL is
// rare, so it is not logged with the data: table ids are never reused, and
// log records and checkpoint rows of a table the catalog no longer has are
// skipped. The file also holds the void epoch ranges (see recover.go).

const catalogName = "catalog.json"

type catalogFile struct {
	Version    int            `json:"version"`
	NextID     uint64         `json:"next_table_id"`
	Namespaces []string       `json:"namespaces"`
	Tables     []catalogTable `json:"tables"`
	Void       []epochRange   `json:"void_epochs,omitempty"`
	// Loggers is the number of logs the data is spread over; opening with
	// another Config.Loggers is refused.
	Loggers int `json:"loggers"`
}

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
		void       []epochRange
		loggers    int
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
	out := make([]*table, 0, len(c.mu.byID))
	for _, t := range c.mu.byID {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (c *catalog) voidRanges() []epochRange {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return append([]epochRange(nil), c.mu.void...)
}

func (c *catalog) fileLocked() catalogFile {
	f := catalogFile{Version: 1, NextID: c.mu.nextID, Void: c.mu.void, Loggers: c.mu.loggers}
	for ns := range c.mu.namespaces {
		f.Namespaces = append(f.Namespaces, ns)
	}
	sort.Strings(f.Namespaces)
	for id, t := range c.mu.byID {
		f.Tables = append(f.Tables, catalogTable{ID: id, Schema: t.schema})
	}
	sort.Slice(f.Tables, func(i, j int) bool { return f.Tables[i].ID < f.Tables[j].ID })
	return f
}

// saveLocked writes the catalog file durably. A failure leaves the old
// file in place; the caller undoes its in-memory change.
func (db *DB) saveCatalogLocked() error {
	data, err := json.MarshalIndent(db.cat.fileLocked(), "", "  ")
	if err != nil {
		return err
	}
	return vfsutil.WriteFileAtomic(db.fs, db.cfg.Dir, catalogName, data, nil)
}

// loadCatalog reads catalog.json, if any.
func (db *DB) loadCatalog() error {
	f, err := db.fs.Open(db.fs.PathJoin(db.cfg.Dir, catalogName))
	if oserror.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return err
	}
	var cf catalogFile
	if err := json.Unmarshal(data, &cf); err != nil {
		return fmt.Errorf("engine: %s: %w", catalogName, err)
	}
	if cf.Version != 1 {
		return fmt.Errorf("engine: %s: unknown version %d", catalogName, cf.Version)
	}
	c := &db.cat
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.nextID = cf.NextID
	c.mu.void = cf.Void
	c.mu.loggers = cf.Loggers
	for _, ns := range cf.Namespaces {
		c.mu.namespaces[ns] = map[string]*table{}
	}
	for _, ct := range cf.Tables {
		if ct.Schema == nil || ct.Schema.Validate() != nil || ct.ID >= cf.NextID {
			return fmt.Errorf("engine: %s: bad table %d", catalogName, ct.ID)
		}
		tabs, ok := c.mu.namespaces[ct.Schema.Namespace]
		if !ok {
			return fmt.Errorf("engine: %s: table %d in unknown namespace %q", catalogName, ct.ID, ct.Schema.Namespace)
		}
		t := newTable(ct.ID, ct.Schema)
		tabs[ct.Schema.Name] = t
		c.mu.byID[ct.ID] = t
	}
	return nil
}

// ---- storage.Admin ----------------------------------------------------------

func (db *DB) checkOpen(op string) error {
	if db.closed.Load() {
		return &storage.Error{Kind: storage.ErrClosed, Op: op}
	}
	return nil
}

// ddl runs fn on the catalog under its lock and saves the result; if the
// save fails, undo restores the in-memory catalog.
func (db *DB) ddl(op string, fn func() (undo func(), err error)) error {
	if err := db.checkOpen(op); err != nil {
		return err
	}
	c := &db.cat
	c.mu.Lock()
	defer c.mu.Unlock()
	undo, err := fn()
	if err != nil {
		return err
	}
	if err := db.saveCatalogOrUndo(undo); err != nil {
		return &storage.Error{Kind: storage.ErrUnavailable, Op: op, Detail: "writing the catalog", Cause: err}
	}
	return nil
}

// saveCatalogOrUndo writes the catalog; if that fails, it calls undo to
// restore the catalog in memory — unless the new catalog was already renamed
// into place. The disk may then hold the change, and undoing it in memory
// would let commits to a dropped table be acknowledged that recovery then
// skips, so the engine fails instead. Called with cat.mu held.
func (db *DB) saveCatalogOrUndo(undo func()) error {
	err := db.saveCatalogLocked()
	switch {
	case err == nil:
	case errors.Is(err, vfsutil.ErrRenamed):
		db.fail(fmt.Errorf("catalog written, directory not synced: %w", err))
	default:
		undo()
	}
	return err
}

func (db *DB) CreateNamespace(ctx context.Context, name string) error {
	if err := storage.CheckNamespaceName(name); err != nil {
		return err
	}
	return db.ddl("create namespace", func() (func(), error) {
		if _, ok := db.cat.mu.namespaces[name]; ok {
			return nil, &storage.Error{Kind: storage.ErrNamespaceExists, Op: "create namespace", Namespace: name}
		}
		db.cat.mu.namespaces[name] = map[string]*table{}
		return func() { delete(db.cat.mu.namespaces, name) }, nil
	})
}

func (db *DB) DropNamespace(ctx context.Context, name string) error {
	return db.ddl("drop namespace", func() (func(), error) {
		tabs, ok := db.cat.mu.namespaces[name]
		if !ok {
			return nil, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: "drop namespace", Namespace: name}
		}
		if len(tabs) > 0 {
			return nil, &storage.Error{Kind: storage.ErrNamespaceNotEmpty, Op: "drop namespace", Namespace: name,
				Detail: fmt.Sprintf("%d tables", len(tabs))}
		}
		delete(db.cat.mu.namespaces, name)
		return func() { db.cat.mu.namespaces[name] = tabs }, nil
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
	return db.ddl("create table", func() (func(), error) {
		c := &db.cat
		tabs, ok := c.mu.namespaces[schema.Namespace]
		if !ok {
			return nil, &storage.Error{Kind: storage.ErrNamespaceNotFound, Op: "create table", Namespace: schema.Namespace, Table: schema.Name}
		}
		if _, ok := tabs[schema.Name]; ok {
			return nil, &storage.Error{Kind: storage.ErrTableExists, Op: "create table", Namespace: schema.Namespace, Table: schema.Name}
		}
		id := c.mu.nextID
		nt := newTable(id, schema)
		c.mu.nextID++
		tabs[schema.Name] = nt
		c.mu.byID[id] = nt
		return func() {
			delete(tabs, schema.Name)
			delete(c.mu.byID, id)
			c.mu.nextID--
		}, nil
	})
}

func (db *DB) DropTable(ctx context.Context, ns, name string) error {
	return db.ddl("drop table", func() (func(), error) {
		c := &db.cat
		t, err := db.lookupLocked("drop table", ns, name)
		if err != nil {
			return nil, err
		}
		delete(c.mu.namespaces[ns], name)
		delete(c.mu.byID, t.id)
		t.dropped.Store(true)
		return func() {
			c.mu.namespaces[ns][name] = t
			c.mu.byID[t.id] = t
			t.dropped.Store(false)
		}, nil
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
