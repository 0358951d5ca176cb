package validator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
)

// gatedDB is a Validator database whose first transaction's Commit waits
// for the test to open the gate, so the callers that arrive meanwhile are
// known to form one group; failNext makes the next Commit after the gate
// fail as if its outcome were lost (it rolls back and says
// ErrCommitUnknown). It counts the transactions begun, and the most under
// way at once.
type gatedDB struct {
	storage.Backend
	gate     chan struct{}
	begins   atomic.Int64
	commits  atomic.Int64
	failNext atomic.Bool

	mu             sync.Mutex
	underWay, peak int
}

type gatedTxn struct {
	storage.Txn
	db   *gatedDB
	over sync.Once // the transaction has ended (Commit or Abort)
}

func (g *gatedDB) Begin(ctx context.Context) (storage.Txn, error) {
	g.begins.Add(1)
	tx, err := g.Backend.Begin(ctx)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.underWay++
	g.peak = max(g.peak, g.underWay)
	g.mu.Unlock()
	return &gatedTxn{Txn: tx, db: g}, nil
}

// mostUnderWay is the most transactions that were under way at once.
func (g *gatedDB) mostUnderWay() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak
}

func (x *gatedTxn) end() {
	x.over.Do(func() {
		x.db.mu.Lock()
		x.db.underWay--
		x.db.mu.Unlock()
	})
}

func (x *gatedTxn) Commit(ctx context.Context) error {
	defer x.end()
	if x.db.commits.Add(1) == 1 {
		<-x.db.gate
	} else if x.db.failNext.CompareAndSwap(true, false) {
		if err := x.Txn.Abort(ctx); err != nil {
			return err
		}
		return &storage.Error{Kind: storage.ErrCommitUnknown, Op: "commit", Detail: "injected"}
	}
	return x.Txn.Commit(ctx)
}

func (x *gatedTxn) Abort(ctx context.Context) error {
	defer x.end()
	return x.Txn.Abort(ctx)
}

// TestCommitterGroups: callers who arrive while a group transaction commits
// go together in the next one, and each gets its own answer. A member
// whose write cannot commit (a nonce already logged) fails alone, the
// others' writes commit once each; after a commit whose outcome is
// unknown every member gets that error and nothing is retried.
func TestCommitterGroups(t *testing.T) {
	eachDB(t, func(t *testing.T, db storage.Backend, ns string) {
		ctx := context.Background()
		if err := ensureSchema(ctx, db, ns); err != nil {
			t.Fatal(err)
		}
		const members = 8
		logged := func(nonce string) bool {
			_, ok, err := db.Get(ctx, &storage.Get{Namespace: ns, Table: tTxs, Partition: storage.Values{"nonce": storage.Text(nonce)}, Projection: []string{"status"}})
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		// round runs one caller alone, holds its commit until the others
		// have all joined the group waiting behind it, and returns each
		// member's error.
		round := func(name string, nonces []string, before func(g *gatedDB)) (*gatedDB, []error) {
			g := &gatedDB{Backend: db, gate: make(chan struct{})}
			c := &committer{db: g}
			if before != nil {
				before(g)
			}
			put := func(nonce string) error {
				lr := newLogRequests(ns)
				tx := &Tx{Request: proof.Request{Nonce: nonce, ContractID: "c", Entity: "e", Argument: []byte("{}")}, Begin: 1}
				_, err := c.do(ctx, lr.requestPut(tx), lr.pendingPut(tx))
				return err
			}
			first := make(chan error, 1)
			go func() { first <- put(name + "-first") }()
			deadline := time.Now().Add(20 * time.Second)
			waitFor := func(what string, done func() bool) {
				for !done() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: after 20 s, still waiting for %s", name, what)
					}
					time.Sleep(time.Millisecond)
				}
			}
			waitFor("the first caller's commit", func() bool { return g.commits.Load() > 0 })
			errs := make([]error, len(nonces))
			var wg sync.WaitGroup
			for i, n := range nonces {
				wg.Go(func() { errs[i] = put(n) })
			}
			waitFor("the others to join the groups waiting", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				n := 0
				for _, g := range c.queue {
					n += len(g.members)
				}
				return n == len(nonces)
			})
			close(g.gate)
			wg.Wait()
			if err := <-first; err != nil {
				t.Fatalf("%s: the first caller: %v", name, err)
			}
			return g, errs
		}

		nonces := make([]string, members)
		for i := range nonces {
			nonces[i] = fmt.Sprintf("a-%d", i)
		}
		g, errs := round("a", nonces, nil)
		for i, err := range errs {
			if err != nil || !logged(nonces[i]) {
				t.Fatalf("member %s: %v, logged %v", nonces[i], err, logged(nonces[i]))
			}
		}
		if n := g.begins.Load(); n != 2 {
			t.Fatalf("%d transactions for one caller and a group of %d; want 2", n, members)
		}

		// More callers than a group takes: the full group and the next
		// one queue behind the commit under way, and none of their callers
		// commits alone beside it.
		many := make([]string, maxGroup+members)
		for i := range many {
			many[i] = fmt.Sprintf("d-%d", i)
		}
		g, errs = round("d", many, nil)
		for i, err := range errs {
			if err != nil || !logged(many[i]) {
				t.Fatalf("member %s of %d callers: %v, logged %v", many[i], len(many), err, logged(many[i]))
			}
		}
		if n := g.begins.Load(); n != 3 {
			t.Fatalf("%d transactions for one caller and %d more, at most %d to a group; want 3", n, len(many), maxGroup)
		}
		if n := g.mostUnderWay(); n != 1 {
			t.Fatalf("%d transactions under way at once; want 1", n)
		}

		// One member repeats a logged nonce: the group fails, every member's
		// writes are tried alone, one after another, and only that one is
		// refused.
		dup := make([]string, members)
		for i := range dup {
			dup[i] = fmt.Sprintf("b-%d", i)
		}
		dup[3] = nonces[5]
		g, errs = round("b", dup, nil)
		for i, err := range errs {
			if i == 3 {
				if !errors.Is(err, storage.ErrConditionNotMet) {
					t.Fatalf("the member repeating a logged nonce got %v, want ErrConditionNotMet", err)
				}
				continue
			}
			if err != nil || !logged(dup[i]) {
				t.Fatalf("member %s beside a refused one: %v, logged %v", dup[i], err, logged(dup[i]))
			}
		}
		if n := g.begins.Load(); n != 2+members {
			t.Fatalf("%d transactions; want 2 and one more per member (%d)", n, 2+members)
		}
		if n := g.mostUnderWay(); n != 1 {
			t.Fatalf("%d transactions under way at once while a failed group's members commit alone; want 1", n)
		}

		// A group commit whose outcome is unknown: every member is told so,
		// and none retries (a retry alone could find its own write and call
		// it a replay).
		unknown := make([]string, members)
		for i := range unknown {
			unknown[i] = fmt.Sprintf("c-%d", i)
		}
		g, errs = round("c", unknown, func(g *gatedDB) { g.failNext.Store(true) })
		for i, err := range errs {
			if !errors.Is(err, storage.ErrCommitUnknown) {
				t.Fatalf("member %s of a group whose commit was lost got %v, want ErrCommitUnknown", unknown[i], err)
			}
			if logged(unknown[i]) {
				t.Fatalf("member %s was written by a transaction that rolled back", unknown[i])
			}
		}
		if n := g.begins.Load(); n != 2 {
			t.Fatalf("%d transactions after a lost group commit; want 2", n)
		}
	})
}
