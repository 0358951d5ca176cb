package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
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
// skipped. The file also holds the void epoch ranges (see recover.go) and
// the log floor (see Checkpoint).
//
// The file is an envelope (catalogEnvelope): the catalog itself, and the
// CRC-32C of its compact JSON encoding. A catalog that fails its checksum
// is refused: an edit or a damaged block must not open as an empty or
// different database. (Catalogs written before the envelope, version 1,
// are read without a checksum and rewritten in the envelope at Open.)

const (
	catalogName    = "catalog.json"
	catalogVersion = 2
)

type catalogEnvelope struct {
	Version int             `json:"version"`
	CRC32C  uint32          `json:"crc32c"`
	Catalog json.RawMessage `json:"catalog"`
}

type catalogFile struct {
	Version    int            `json:"version"`
	NextID     uint64         `json:"next_table_id"`
	Namespaces []string       `json:"namespaces"`
	Tables     []catalogTable `json:"tables"`
	Void       []epochRange   `json:"void_epochs,omitempty"`
	// Loggers is the number of logs the data is spread over; opening with
	// another Config.Loggers is refused.
	Loggers int `json:"loggers"`
	// LogFloor is the start of the checkpoint the logs were last truncated
	// for: records of earlier epochs may be gone from them, so recovery
	// needs a checkpoint chain that starts at this epoch or later.
	LogFloor uint64 `json:"log_floor,omitempty"`
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
		logFloor   uint64
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
	f := catalogFile{Version: catalogVersion, NextID: c.mu.nextID, Void: c.mu.void, Loggers: c.mu.loggers, LogFloor: c.mu.logFloor}
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

// saveCatalogLocked writes the catalog file durably. A failure leaves the
// old file in place; the caller undoes its in-memory change.
func (db *DB) saveCatalogLocked() error {
	data, err := encodeCatalog(db.cat.fileLocked())
	if err != nil {
		return err
	}
	return vfsutil.WriteFileAtomic(db.fs, db.cfg.Dir, catalogName, data, nil)
}

// encodeCatalog returns the catalog file's bytes: the envelope, indented
// for people to read, with the checksum of the catalog's compact encoding.
func encodeCatalog(f catalogFile) ([]byte, error) {
	body, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(catalogEnvelope{Version: catalogVersion, CRC32C: crc32.Checksum(body, crcTable), Catalog: body}, "", "  ")
}

// decodeCatalog checks and decodes a catalog file's bytes. It reports
// whether the file was of version 1, which has no checksum.
func decodeCatalog(data []byte) (cf catalogFile, legacy bool, err error) {
	corrupt := func(format string, args ...any) error {
		return &CorruptionError{File: catalogName, Offset: -1, Err: fmt.Errorf(format, args...)}
	}
	var env catalogEnvelope
	if err := json.Unmarshal(data, &env); err != nil {
		return cf, false, corrupt("%v", err)
	}
	body := []byte(env.Catalog)
	switch {
	case env.Version == 1 && env.Catalog == nil:
		body, legacy = data, true
	case env.Version != catalogVersion:
		return cf, false, corrupt("unknown version %d", env.Version)
	default:
		var compact bytes.Buffer
		if err := json.Compact(&compact, body); err != nil {
			return cf, false, corrupt("%v", err)
		}
		if got := crc32.Checksum(compact.Bytes(), crcTable); got != env.CRC32C {
			return cf, false, corrupt("checksum mismatch: the file says %08x, its catalog hashes to %08x", env.CRC32C, got)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cf); err != nil {
		return cf, false, corrupt("%v", err)
	}
	if want := map[bool]int{true: 1, false: catalogVersion}[legacy]; cf.Version != want {
		return cf, false, corrupt("catalog of version %d in a file of version %d", cf.Version, want)
	}
	if cf.NextID == 0 || cf.Loggers < 0 || cf.Loggers > 64 {
		return cf, false, corrupt("next table id %d, %d loggers", cf.NextID, cf.Loggers)
	}
	for _, r := range cf.Void {
		if r.From == 0 || r.From > r.To || r.To > MaxEpoch {
			return cf, false, corrupt("void epochs %d..%d", r.From, r.To)
		}
	}
	if cf.LogFloor > MaxEpoch {
		return cf, false, corrupt("log floor %d", cf.LogFloor)
	}
	return cf, legacy, nil
}

// loadCatalog reads catalog.json. It reports whether there was one, and
// rewrites one of version 1 with a checksum.
func (db *DB) loadCatalog() (found bool, err error) {
	f, err := db.fs.Open(db.fs.PathJoin(db.cfg.Dir, catalogName))
	if oserror.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return false, err
	}
	cf, legacy, err := decodeCatalog(data)
	if err != nil {
		return false, err
	}
	c := &db.cat
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.nextID = cf.NextID
	c.mu.void = cf.Void
	c.mu.loggers = cf.Loggers
	c.mu.logFloor = cf.LogFloor
	for _, ns := range cf.Namespaces {
		if err := storage.CheckNamespaceName(ns); err != nil {
			return false, &CorruptionError{File: catalogName, Offset: -1, Err: fmt.Errorf("namespace %q: %v", ns, err)}
		}
		c.mu.namespaces[ns] = map[string]*table{}
	}
	for _, ct := range cf.Tables {
		if ct.Schema == nil || ct.Schema.Validate() != nil || ct.ID == 0 || ct.ID >= cf.NextID || c.mu.byID[ct.ID] != nil {
			return false, &CorruptionError{File: catalogName, Offset: -1, Err: fmt.Errorf("bad table %d", ct.ID)}
		}
		tabs, ok := c.mu.namespaces[ct.Schema.Namespace]
		if !ok {
			return false, &CorruptionError{File: catalogName, Offset: -1, Err: fmt.Errorf("table %d in unknown namespace %q", ct.ID, ct.Schema.Namespace)}
		}
		if tabs[ct.Schema.Name] != nil {
			return false, &CorruptionError{File: catalogName, Offset: -1, Err: fmt.Errorf("two tables %s.%s", ct.Schema.Namespace, ct.Schema.Name)}
		}
		t := newTable(ct.ID, ct.Schema)
		tabs[ct.Schema.Name] = t
		c.mu.byID[ct.ID] = t
	}
	if legacy {
		if err := db.saveCatalogLocked(); err != nil {
			return false, fmt.Errorf("engine: rewriting %s with a checksum: %w", catalogName, err)
		}
	}
	return true, nil
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
