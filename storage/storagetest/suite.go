// Package storagetest is the conformance suite of the storage API: every
// Store (the embedded engine, PostgreSQL, Cassandra) must pass RunStore,
// and every Backend, a Store with transactions, Run, which adds the
// transaction tests.
//
// The suite checks behaviour, not implementation: CRUD, every condition met
// and not met, scans over multi-column clustering keys with mixed ASC/DESC
// against a model, type edge cases, every kind of bad input (a typed error
// and nothing written), transactions, and concurrency workloads whose
// results must show no anomaly — bank transfers that keep their total,
// write skew, lost updates, phantoms, and a randomized list-append workload
// whose history is checked for strict serializability (history.go).
package storagetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// Opener returns a Backend for the test t. Every call within one test must
// reach the same stored data: a call made after the previous Backend was
// closed is a restart, and what was written before must be found again.
// The suite closes every Backend it opens.
type Opener func(t *testing.T) storage.Backend

// StoreOpener is an Opener of a Store, which may have no transactions.
type StoreOpener func(t *testing.T) storage.Store

// RunStore runs the part of the suite every Store must pass: schemas,
// restarts, the single operations and their conditions, scans, types and
// bad input; and, for a store that offers them, the optional capabilities
// (an unsynced view, exclusive access).
func RunStore(t *testing.T, open StoreOpener) {
	t.Run("Admin", func(t *testing.T) { testAdmin(t, open) })
	t.Run("EnsureTables", func(t *testing.T) { testEnsureTables(t, open) })
	t.Run("Restart", func(t *testing.T) { testRestart(t, open) })
	t.Run("CRUD", func(t *testing.T) { testCRUD(t, open) })
	t.Run("Conditions", func(t *testing.T) { testConditions(t, open) })
	t.Run("Mutate", func(t *testing.T) { testMutate(t, open) })
	t.Run("Scan", func(t *testing.T) { testScan(t, open) })
	t.Run("Types", func(t *testing.T) { testTypes(t, open) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, open) })
	t.Run("Capabilities", func(t *testing.T) { testCapabilities(t, open) })
}

// Run runs the whole suite on a Backend: RunStore, then the transactions
// and the concurrency workloads.
func Run(t *testing.T, open Opener) {
	store := func(t *testing.T) storage.Store { return open(t) }
	RunStore(t, store)
	t.Run("Txn", func(t *testing.T) { testTxn(t, open) })
	t.Run("Deferred", func(t *testing.T) { testDeferred(t, open) })
	t.Run("Expect", func(t *testing.T) { testExpect(t, open) })
	t.Run("Skippable", func(t *testing.T) { testSkippable(t, open) })
	t.Run("Bank", func(t *testing.T) { testBank(t, open) })
	t.Run("WriteSkew", func(t *testing.T) { testWriteSkew(t, open) })
	t.Run("LostUpdate", func(t *testing.T) { testLostUpdate(t, open) })
	t.Run("Phantom", func(t *testing.T) { testPhantom(t, open) })
	t.Run("History", func(t *testing.T) { testHistory(t, open) })
	t.Run("SharedRequests", func(t *testing.T) { testSharedRequests(t, open) })
	t.Run("ReusedRequests", func(t *testing.T) { testReusedRequests(t, open) })
}

// V is shorthand for storage.Values in the tests.
type V = storage.Values

var nsSeq atomic.Int64

// env is one test's store and private namespace.
type env struct {
	t    *testing.T
	ctx  context.Context
	open StoreOpener
	db   storage.Store
	ns   string
}

// newEnv is newStoreEnv for a Backend's tests.
func newEnv(t *testing.T, open Opener) *env {
	return newStoreEnv(t, func(t *testing.T) storage.Store { return open(t) })
}

// backend is the env's store as a Backend: only the transaction tests,
// which Run alone runs, call it.
func (e *env) backend() storage.Backend {
	e.t.Helper()
	b, ok := e.db.(storage.Backend)
	if !ok {
		e.t.Fatalf("%T has no transactions", e.db)
	}
	return b
}

func newStoreEnv(t *testing.T, open StoreOpener) *env {
	t.Helper()
	var rnd [5]byte
	_, _ = rand.Read(rnd[:])
	e := &env{t: t, open: open, ns: "st" + hex.EncodeToString(rnd[:]) + "_" + strconv.FormatInt(nsSeq.Add(1), 10)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	e.ctx = ctx
	e.db = open(t)
	t.Cleanup(func() {
		defer cancel()
		if e.db == nil {
			return
		}
		defer e.db.Close()
		cctx := context.Background()
		tables, err := e.db.ListTables(cctx, e.ns)
		if err != nil {
			return
		}
		for _, tb := range tables {
			_ = e.db.DropTable(cctx, e.ns, tb)
		}
		_ = e.db.DropNamespace(cctx, e.ns)
	})
	e.ok(e.db.CreateNamespace(e.ctx, e.ns))
	return e
}

// reopen closes the backend and opens it again: a restart.
func (e *env) reopen() {
	e.t.Helper()
	e.ok(e.db.Close())
	e.db = nil
	e.db = e.open(e.t)
}

func (e *env) ok(err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("unexpected error: %v", err)
	}
}

// is fails the test unless err matches want.
func (e *env) is(err, want error) {
	e.t.Helper()
	if !errors.Is(err, want) {
		e.t.Fatalf("got error %v, want %v", err, want)
	}
	var se *storage.Error
	if !errors.As(err, &se) {
		e.t.Fatalf("error %v is not a *storage.Error", err)
	}
}

func (e *env) table(name string, pk []storage.Column, ck []storage.ClusteringColumn, cols []storage.Column) *storage.Table {
	e.t.Helper()
	tb := &storage.Table{Namespace: e.ns, Name: name, PartitionKey: pk, ClusteringKey: ck, Columns: cols}
	e.ok(e.db.CreateTable(e.ctx, tb))
	return tb
}

func (e *env) put(tb *storage.Table, part, clust, vals V) {
	e.t.Helper()
	e.ok(e.db.Put(e.ctx, &storage.Put{Namespace: tb.Namespace, Table: tb.Name, Partition: part, Clustering: clust, Values: vals}))
}

func (e *env) get(tb *storage.Table, part, clust V, proj ...string) (storage.Row, bool) {
	e.t.Helper()
	row, ok, err := e.db.Get(e.ctx, &storage.Get{Namespace: tb.Namespace, Table: tb.Name, Partition: part, Clustering: clust, Projection: proj})
	e.ok(err)
	return row, ok
}

func (e *env) scan(s *storage.Scan) []storage.Row {
	e.t.Helper()
	out, err := e.scanRows(e.db, s)
	e.ok(err)
	return out
}

// rowEq fails unless row has exactly the want columns and values.
func (e *env) rowEq(row storage.Row, want V) {
	e.t.Helper()
	if len(row) != len(want) {
		e.t.Fatalf("row %v, want %v", row, want)
	}
	for k, w := range want {
		if g, ok := row[k]; !ok || !g.Equal(w) || g.Type() != w.Type() && !w.IsNull() {
			e.t.Fatalf("row %v: column %s = %v, want %v", row, k, row[k], w)
		}
	}
}

func col(name string, t storage.DataType) storage.Column { return storage.Column{Name: name, Type: t} }
func ccol(name string, t storage.DataType, o storage.Order) storage.ClusteringColumn {
	return storage.ClusteringColumn{Name: name, Type: t, Order: o}
}
func cols(c ...storage.Column) []storage.Column { return c }

var (
	i64 = storage.BigInt
	txt = storage.Text
)
