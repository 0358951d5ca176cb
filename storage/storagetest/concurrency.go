package storagetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/storage"
)

// step is one operation of a scripted transaction.
type step func(ctx context.Context, tx storage.Txn) error

// runSchedule runs one transaction per script, interleaving their steps in
// the given order: order lists script indices, each appearance running that
// script's next step, and each script's last appearance is its commit (so a
// script of n steps appears n+1 times). Each transaction runs on its own
// goroutine, so a backend that blocks a step (a lock wait) does not stall the
// schedule: after a short wait the schedule moves on. It returns, per
// script, nil if it committed or the first error that stopped it.
func runSchedule(t *testing.T, db storage.Backend, scripts [][]step, order []int) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type actor struct {
		signal, done chan struct{}
		err          error
	}
	actors := make([]*actor, len(scripts))
	var wg sync.WaitGroup
	for i, script := range scripts {
		a := &actor{signal: make(chan struct{}, len(script)+1), done: make(chan struct{}, len(script)+1)}
		actors[i] = a
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 0; s <= len(script); s++ {
				<-a.signal
				if a.err == nil {
					if s < len(script) {
						if a.err = script[s](ctx, tx); a.err != nil {
							_ = tx.Abort(ctx)
						}
					} else {
						a.err = tx.Commit(ctx)
					}
				}
				a.done <- struct{}{}
			}
		}()
	}
	// Before moving on, wait for every step sent to this actor so far, a
	// step that blocked earlier included, so the order stays the schedule's;
	// if it stays blocked, let the others go on.
	sent, finished := make([]int, len(actors)), make([]int, len(actors))
	for _, i := range order {
		actors[i].signal <- struct{}{}
		sent[i]++
		blocked := time.After(300 * time.Millisecond)
	wait:
		for finished[i] < sent[i] {
			select {
			case <-actors[i].done:
				finished[i]++
			case <-blocked:
				break wait
			}
		}
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatal("scheduled transactions did not finish: deadlock?")
	}
	out := make([]error, len(actors))
	for i, a := range actors {
		out[i] = a.err
	}
	return out
}

// The schedules for two transactions of two steps (read, write) plus
// commit: every interleaving in which both read before either commits.
var twoTxnSchedules = [][]int{
	{0, 1, 0, 1, 0, 1},
	{0, 1, 1, 0, 1, 0},
	{0, 1, 0, 0, 1, 1},
	{1, 0, 1, 1, 0, 0},
	{0, 0, 1, 1, 0, 1},
	{0, 1, 1, 0, 0, 1},
}

// testWriteSkew: two doctors on call; each transaction checks both are on
// call and takes one off. Serializably, at least one stays on call.
func testWriteSkew(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := e.table("doctors", cols(col("shift", storage.TypeBigInt)), []storage.ClusteringColumn{ccol("doc", storage.TypeText, storage.Asc)},
		cols(col("on_call", storage.TypeBoolean)))
	key := func(doc string) *storage.Get {
		return &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: V{"shift": i64(1)}, Clustering: V{"doc": txt(doc)}}
	}
	for n, order := range twoTxnSchedules {
		for _, d := range []string{"alice", "bob"} {
			e.put(tb, V{"shift": i64(1)}, V{"doc": txt(d)}, V{"on_call": storage.Bool(true)})
		}
		wrote := make([]bool, 2)
		script := func(i int, me string) []step {
			var bothOn bool
			return []step{
				func(ctx context.Context, tx storage.Txn) error {
					onCall := 0
					for _, d := range []string{"alice", "bob"} {
						row, ok, err := tx.Get(ctx, key(d))
						if err != nil {
							return err
						}
						if ok && row["on_call"].AsBool() {
							onCall++
						}
					}
					bothOn = onCall == 2
					return nil
				},
				func(ctx context.Context, tx storage.Txn) error {
					if !bothOn {
						return nil
					}
					wrote[i] = true
					return tx.Put(ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"shift": i64(1)},
						Clustering: V{"doc": txt(me)}, Values: V{"on_call": storage.Bool(false)}})
				},
			}
		}
		errs := runSchedule(t, e.backend(), [][]step{script(0, "alice"), script(1, "bob")}, order)
		for _, err := range errs {
			if err != nil && !storage.IsRetryable(err) {
				t.Fatalf("schedule %v: unexpected error %v", order, err)
			}
		}
		onCall := 0
		for _, d := range []string{"alice", "bob"} {
			if row, _ := e.get(tb, V{"shift": i64(1)}, V{"doc": txt(d)}); row["on_call"].AsBool() {
				onCall++
			}
		}
		if onCall == 0 || errs[0] == nil && errs[1] == nil && wrote[0] && wrote[1] {
			t.Fatalf("schedule %d %v: write skew: both committed (errors %v), %d on call", n, order, errs, onCall)
		}
	}
}

// testPhantom: each transaction counts the rows in a range and inserts one
// if fewer than two exist. A backend without phantom protection lets both
// insert and the range ends up with three rows.
func testPhantom(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := e.table("slots", cols(col("room", storage.TypeBigInt)), []storage.ClusteringColumn{ccol("slot", storage.TypeBigInt, storage.Asc)},
		cols(col("who", storage.TypeText)))
	rng := &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: V{"room": i64(1)},
		Start: &storage.Bound{Key: V{"slot": i64(10)}, Inclusive: true}, End: &storage.Bound{Key: V{"slot": i64(20)}, Inclusive: true}}
	count := func(ctx context.Context, tx storage.Txn) (int, error) {
		rows, err := tx.Scan(ctx, rng)
		if err != nil {
			return 0, err
		}
		all, err := storage.CollectRows(rows)
		return len(all), err
	}
	for n, order := range twoTxnSchedules {
		for _, s := range e.scan(&storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: V{"room": i64(1)}}) {
			e.ok(e.db.Delete(e.ctx, &storage.Delete{Namespace: e.ns, Table: tb.Name, Partition: V{"room": i64(1)}, Clustering: V{"slot": s["slot"]}}))
		}
		e.put(tb, V{"room": i64(1)}, V{"slot": i64(10)}, V{"who": txt("first")})
		e.put(tb, V{"room": i64(1)}, V{"slot": i64(30)}, V{"who": txt("outside")})
		script := func(slot int64) []step {
			var seen int
			return []step{
				func(ctx context.Context, tx storage.Txn) (err error) { seen, err = count(ctx, tx); return err },
				func(ctx context.Context, tx storage.Txn) error {
					if seen >= 2 {
						return nil
					}
					return tx.Put(ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"room": i64(1)},
						Clustering: V{"slot": i64(slot)}, Values: V{"who": txt("new")}, Condition: storage.IfNotExists()})
				},
			}
		}
		errs := runSchedule(t, e.backend(), [][]step{script(11), script(12)}, order)
		for _, err := range errs {
			if err != nil && !storage.IsRetryable(err) {
				t.Fatalf("schedule %v: unexpected error %v", order, err)
			}
		}
		if got := len(e.scan(rng)); got > 2 || errs[0] == nil && errs[1] == nil && got != 2 {
			t.Fatalf("schedule %d %v: phantom: %d rows in the range (errors %v)", n, order, got, errs)
		}
	}

	// A transaction that scans a range twice sees the same rows both times,
	// even when another transaction inserts into it and commits in between
	// (or it fails with a conflict).
	var first, second int
	errs := runSchedule(t, e.backend(), [][]step{
		{
			func(ctx context.Context, tx storage.Txn) (err error) { first, err = count(ctx, tx); return err },
			func(ctx context.Context, tx storage.Txn) (err error) { second, err = count(ctx, tx); return err },
		},
		{func(ctx context.Context, tx storage.Txn) error {
			return tx.Put(ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"room": i64(1)}, Clustering: V{"slot": i64(15)},
				Values: V{"who": txt("late")}})
		}},
	}, []int{0, 1, 1, 0, 0})
	if errs[1] != nil {
		t.Fatalf("inserting transaction: %v", errs[1])
	}
	if errs[0] == nil && first != second {
		t.Fatalf("phantom within a transaction: scanned %d then %d rows", first, second)
	}
}

// testBank moves money between accounts from 16 goroutines while auditors
// read every balance in one transaction: every committed audit and the
// final state must show the same total, and no balance may go negative.
func testBank(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := e.table("accounts", cols(col("id", storage.TypeBigInt)), nil, cols(col("balance", storage.TypeBigInt)))
	const accounts, initial, workers, transfers = 8, 1000, 16, 25
	for i := range accounts {
		e.put(tb, V{"id": i64(int64(i))}, nil, V{"balance": i64(initial)})
	}
	get := func(id int) *storage.Get {
		return &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: V{"id": i64(int64(id))}}
	}
	var committed, exhausted atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers+2)
	// The first error stops every goroutine.
	ctx, stop := context.WithCancel(e.ctx)
	defer stop()
	fail := func(err error) { errc <- err; stop() }
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range transfers {
				if ctx.Err() != nil {
					return
				}
				from, to := r.IntN(accounts), r.IntN(accounts-1)
				if to >= from {
					to++
				}
				amount := int64(1 + r.IntN(100))
				err := storage.Update(ctx, e.backend(), func(tx storage.Txn) error {
					a, _, err := tx.Get(ctx, get(from))
					if err != nil {
						return err
					}
					b, _, err := tx.Get(ctx, get(to))
					if err != nil {
						return err
					}
					if a["balance"].AsBigInt() < amount {
						return nil
					}
					if err := tx.Put(ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"id": i64(int64(from))},
						Values: V{"balance": i64(a["balance"].AsBigInt() - amount)}}); err != nil {
						return err
					}
					return tx.Put(ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"id": i64(int64(to))},
						Values: V{"balance": i64(b["balance"].AsBigInt() + amount)}})
				})
				switch {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, storage.ErrRetriesExhausted):
					exhausted.Add(1)
				case ctx.Err() != nil:
					return
				default:
					fail(err)
					return
				}
			}
		}()
	}
	var audits atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				if ctx.Err() != nil {
					return
				}
				var total int64
				err := storage.Update(ctx, e.backend(), func(tx storage.Txn) error {
					total = 0
					for i := range accounts {
						row, ok, err := tx.Get(ctx, get(i))
						if err != nil {
							return err
						}
						if !ok || row["balance"].AsBigInt() < 0 {
							return fmt.Errorf("account %d: %v (found %v)", i, row, ok)
						}
						total += row["balance"].AsBigInt()
					}
					return nil
				})
				if err == nil && total != accounts*initial {
					fail(fmt.Errorf("audit saw total %d, want %d", total, accounts*initial))
					return
				}
				if err != nil && !errors.Is(err, storage.ErrRetriesExhausted) && ctx.Err() == nil {
					fail(err)
					return
				}
				audits.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	var total int64
	for i := range accounts {
		row, _ := e.get(tb, V{"id": i64(int64(i))}, nil)
		if row["balance"].AsBigInt() < 0 {
			t.Fatalf("account %d negative: %v", i, row)
		}
		total += row["balance"].AsBigInt()
	}
	if total != accounts*initial {
		t.Fatalf("total %d, want %d", total, accounts*initial)
	}
	if committed.Load() == 0 {
		t.Fatal("no transfer committed")
	}
	t.Logf("%d transfers committed, %d gave up after retries, %d audits", committed.Load(), exhausted.Load(), audits.Load())
}

// testLostUpdate increments one counter from many goroutines, through
// transactions and through compare-and-set Puts; no increment may be lost.
func testLostUpdate(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := e.table("counters", cols(col("name", storage.TypeText)), nil, cols(col("n", storage.TypeBigInt)))
	k := func(name string) V { return V{"name": txt(name)} }
	e.put(tb, k("txn"), nil, V{"n": i64(0)})
	e.put(tb, k("cas"), nil, V{"n": i64(0)})
	const workers, increments = 8, 15
	var ok atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 2*workers)
	for range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range increments {
				err := storage.Update(e.ctx, e.backend(), func(tx storage.Txn) error {
					row, _, err := tx.Get(e.ctx, &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: k("txn")})
					if err != nil {
						return err
					}
					return tx.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: k("txn"),
						Values: V{"n": i64(row["n"].AsBigInt() + 1)}})
				})
				if err == nil {
					ok.Add(1)
				} else if !errors.Is(err, storage.ErrRetriesExhausted) {
					errc <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range increments {
				for try := 0; ; try++ {
					if try == 10000 {
						errc <- errors.New("compare-and-set never succeeded")
						return
					}
					row, _, err := e.db.Get(e.ctx, &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: k("cas")})
					if err != nil {
						errc <- err
						return
					}
					n := row["n"]
					err = e.db.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: k("cas"),
						Values: V{"n": i64(n.AsBigInt() + 1)}, Condition: storage.If(storage.Eq("n", n))})
					if err == nil {
						break
					}
					if !errors.Is(err, storage.ErrConditionNotMet) {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	row, _ := e.get(tb, k("txn"), nil)
	if got := row["n"].AsBigInt(); got != ok.Load() || got == 0 {
		t.Fatalf("transactional counter = %d, %d increments committed", got, ok.Load())
	}
	row, _ = e.get(tb, k("cas"), nil)
	if got := row["n"].AsBigInt(); got != workers*increments {
		t.Fatalf("compare-and-set counter = %d, want %d", got, workers*increments)
	}
}

// testHistory runs a randomized list-append workload over a few hot keys
// in one partition — gets, appends and whole-partition scans — and checks
// the recorded history for strict serializability (history.go).
func testHistory(t *testing.T, open Opener) {
	RunHistory(t, open, HistoryConfig{Keys: 6, Workers: 8, PerWorker: 25})
}

// HistoryConfig shapes a RunHistory workload.
type HistoryConfig struct {
	Keys      int    // the hot keys, clustering keys of one partition
	Workers   int    // concurrent clients
	PerWorker int    // committed transactions each client needs
	Seed      uint64 // varies the clients' random choices
}

// RunHistory runs a randomized list-append workload on a few hot keys
// (gets, appends, which read first, and whole-partition scans, 1 to 4 per
// transaction) from concurrent clients, records every attempt, and checks
// the history for strict serializability (History.Check).
func RunHistory(t *testing.T, open Opener, cfg HistoryConfig) {
	e := newEnv(t, open)
	tb := e.table("lists", cols(col("p", storage.TypeBigInt)), []storage.ClusteringColumn{ccol("k", storage.TypeBigInt, storage.Asc)},
		cols(col("l", storage.TypeText)))
	keys, workers, perWorker := cfg.Keys, cfg.Workers, cfg.PerWorker
	part := V{"p": i64(0)}
	parse := func(row storage.Row, ok bool) []int {
		if !ok || row["l"].AsText() == "" {
			return nil
		}
		var out []int
		for _, f := range strings.Split(row["l"].AsText(), ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				panic(err)
			}
			out = append(out, n)
		}
		return out
	}
	var clock, ids atomic.Int64
	var mu sync.Mutex
	h := &History{Final: map[int][]int{}}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99+cfg.Seed))
			for done, attempts := 0, 0; done < perWorker; attempts++ {
				if attempts > 50*perWorker {
					errc <- fmt.Errorf("worker %d: too many aborts", w)
					return
				}
				txn := &Txn{ID: int(ids.Add(1))}
				nops := 1 + r.IntN(4)
				plan := make([][2]int, nops) // kind (0 get, 1 append, 2 scan), key
				for i := range plan {
					plan[i] = [2]int{r.IntN(10), r.IntN(keys)}
				}
				txn.Begin = clock.Add(1)
				err := func() error {
					tx, err := e.backend().Begin(e.ctx)
					if err != nil {
						return err
					}
					defer tx.Abort(e.ctx)
					for _, op := range plan {
						kind, k := op[0], op[1]
						switch {
						case kind < 8: // get (0-3), or append (4-7), which reads first
							row, ok, err := tx.Get(e.ctx, &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: part, Clustering: V{"k": i64(int64(k))}})
							if err != nil {
								return err
							}
							list := parse(row, ok)
							txn.Ops = append(txn.Ops, Op{Key: k, Read: list, IsRead: true})
							if kind < 4 {
								continue
							}
							elem := txn.ID*64 + len(txn.Ops) // unique: an attempt has at most 24 ops
							s := strconv.Itoa(elem)
							if len(list) > 0 {
								s = row["l"].AsText() + "," + s
							}
							if err := tx.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: part,
								Clustering: V{"k": i64(int64(k))}, Values: V{"l": txt(s)}}); err != nil {
								return err
							}
							txn.Ops = append(txn.Ops, Op{Key: k, Append: elem})
						default: // scan: a read of every key, absent ones included
							rows, err := tx.Scan(e.ctx, &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: part})
							if err != nil {
								return err
							}
							all, err := storage.CollectRows(rows)
							if err != nil {
								return err
							}
							seen := map[int][]int{}
							for _, row := range all {
								seen[int(row["k"].AsBigInt())] = parse(row, true)
							}
							for k := range keys {
								txn.Ops = append(txn.Ops, Op{Key: k, Read: seen[k], IsRead: true})
							}
						}
					}
					return tx.Commit(e.ctx)
				}()
				txn.End = clock.Add(1)
				switch {
				case err == nil:
					txn.Committed = true
					done++
				case errors.Is(err, storage.ErrCommitUnknown):
					txn.Unknown = true
				case storage.IsRetryable(err):
				default:
					errc <- err
					return
				}
				mu.Lock()
				h.Txns = append(h.Txns, txn)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for k := range keys {
		row, ok := e.get(tb, part, V{"k": i64(int64(k))})
		h.Final[k] = parse(row, ok)
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
	committed := 0
	for _, x := range h.Txns {
		if x.Committed {
			committed++
		}
	}
	t.Logf("history of %d attempts, %d committed: strictly serializable", len(h.Txns), committed)
}

// scanRows runs s on r (a Backend or a Txn) and reads and closes its rows.
func (e *env) scanRows(r interface {
	Scan(context.Context, *storage.Scan) (storage.Rows, error)
}, s *storage.Scan) ([]storage.Row, error) {
	rows, err := r.Scan(e.ctx, s)
	if err != nil {
		return nil, err
	}
	if _, ok := rows.(storage.ColumnReader); ok {
		return e.collectByColumn(rows, s)
	}
	return storage.CollectRows(rows)
}

// collectByColumn collects rows that implement storage.ColumnReader,
// checking that Column, asked first, agrees with Row on every column of
// the table: present with the same value, or absent from both.
func (e *env) collectByColumn(rows storage.Rows, s *storage.Scan) ([]storage.Row, error) {
	defer rows.Close()
	tb, err := e.db.DescribeTable(e.ctx, s.Namespace, s.Table)
	if err != nil {
		return nil, err
	}
	names := append(tb.ColumnNames(), "no such column")
	var out []storage.Row
	for rows.Next() {
		got := make(storage.Row)
		for _, n := range names {
			if v, ok := storage.RowColumn(rows, n); ok {
				got[n] = v
			}
		}
		row := rows.Row()
		if len(got) != len(row) {
			e.t.Fatalf("scan %s.%s (projection %v): Column gives %v, Row %v", s.Namespace, s.Table, s.Projection, got, row)
		}
		for n, v := range row {
			if g, ok := got[n]; !ok || !g.Equal(v) || g.Type() != v.Type() {
				e.t.Fatalf("scan %s.%s (projection %v): Column(%q) = %v, %v; Row has %v", s.Namespace, s.Table, s.Projection, n, g, ok, v)
			}
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// testSharedRequests: a backend only reads the requests it is given, so
// one request value may be used by many goroutines at once (the
// Validator's clock shares its scan and counter keys). Under the race
// detector a backend that writes into one fails here; any backend that
// changes one, even from one goroutine, fails the comparison at the end.
func testSharedRequests(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := e.table("shared", cols(col("bucket", storage.TypeText)), []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Asc)},
		cols(col("n", storage.TypeBigInt)))
	part := V{"bucket": txt("b")}
	for c := range int64(4) {
		e.put(tb, part, V{"c": i64(c)}, V{"n": i64(0)})
	}
	requests := func() (*storage.Scan, *storage.Get, *storage.Put, *storage.Put) {
		return &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: V{"bucket": txt("b")}, Projection: []string{"n"}, Limit: 3,
				Start: &storage.Bound{Key: V{"c": i64(0)}, Inclusive: true}},
			&storage.Get{Namespace: e.ns, Table: tb.Name, Partition: V{"bucket": txt("b")}, Clustering: V{"c": i64(1)}, Projection: []string{"n"}},
			&storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"bucket": txt("b")}, Clustering: V{"c": i64(2)}, Values: V{"n": i64(7)}},
			&storage.Put{Namespace: e.ns, Table: tb.Name, Partition: V{"bucket": txt("b")}, Clustering: V{"c": i64(3)}, Values: V{"n": i64(5)},
				Condition: storage.If(storage.Lt("n", i64(5)))}
	}
	scan, get, put, condPut := requests()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				if _, err := e.scanRows(e.db, scan); err != nil {
					t.Error(err)
				}
				if _, _, err := e.db.Get(e.ctx, get); err != nil {
					t.Error(err)
				}
				if err := e.db.Put(e.ctx, put); err != nil {
					t.Error(err)
				}
				if err := e.db.Put(e.ctx, condPut); err != nil && !errors.Is(err, storage.ErrConditionNotMet) {
					t.Error(err)
				}
				if err := storage.Update(e.ctx, e.backend(), func(tx storage.Txn) error {
					if _, err := e.scanRows(tx, scan); err != nil {
						return err
					}
					return tx.Put(e.ctx, put)
				}); err != nil && !errors.Is(err, storage.ErrRetriesExhausted) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	s2, g2, p2, c2 := requests()
	if !reflect.DeepEqual(scan, s2) || !reflect.DeepEqual(get, g2) || !reflect.DeepEqual(put, p2) || !reflect.DeepEqual(condPut, c2) {
		t.Errorf("the backend changed a request it was given:\nscan %+v\nget %+v\nput %+v\nconditional put %+v", scan, get, put, condPut)
	}
	if row, _ := e.get(tb, part, V{"c": i64(3)}, "n"); row["n"].AsBigInt() != 5 {
		t.Errorf("the conditional put left n = %v, want 5", row["n"])
	}
}

// testReusedRequests: a backend keeps no reference to a request once the
// call returns, so a caller may refill the same request and maps for its
// next call (the ledger does, per transaction attempt). Every call below
// is followed by refilling its request for another row; what each call
// wrote, and the rows it returned, must be what it was given when made.
func testReusedRequests(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := e.table("reused", cols(col("p", storage.TypeText)), []storage.ClusteringColumn{ccol("c", storage.TypeBigInt, storage.Asc)},
		cols(col("v", storage.TypeText), col("n", storage.TypeBigInt)))
	part, clus, vals := V{}, V{}, V{}
	fill := func(p string, c int64) {
		part["p"], clus["c"] = txt(p), i64(c)
		vals["v"], vals["n"] = txt(fmt.Sprintf("%s/%d", p, c)), i64(c*10)
	}
	want := func(p string, c int64) V {
		return V{"p": txt(p), "c": i64(c), "v": txt(fmt.Sprintf("%s/%d", p, c)), "n": i64(c * 10)}
	}
	put := &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: part, Clustering: clus, Values: vals}
	get := &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: part, Clustering: clus}
	scan := &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: part, Start: &storage.Bound{Key: V{"c": i64(0)}, Inclusive: true}}

	// Outside a transaction: puts, then a get and a scan whose results are
	// checked after the request is refilled.
	for c := range int64(3) {
		fill("a", c)
		e.ok(e.db.Put(e.ctx, put))
	}
	fill("a", 1)
	row, ok, err := e.db.Get(e.ctx, get)
	e.ok(err)
	fill("a", 2)
	if !ok {
		t.Fatal("get a/1: no row")
	}
	e.rowEq(row, want("a", 1))
	fill("a", 0)
	scan.Start.Key["c"] = i64(1)
	rows, err := e.db.Scan(e.ctx, scan)
	e.ok(err)
	fill("b", 0)
	scan.Start.Key["c"] = i64(0)
	got, err := storage.CollectRows(rows)
	e.ok(err)
	if len(got) != 2 {
		t.Fatalf("scan a from 1: %d rows, want 2", len(got))
	}
	e.rowEq(got[0], want("a", 1))
	e.rowEq(got[1], want("a", 2))

	// In a transaction: puts (one of them Deferred) and reads, each
	// request refilled for the next call before the transaction ends.
	e.ok(storage.Update(e.ctx, e.backend(), func(tx storage.Txn) error {
		for c := range int64(2) {
			fill("b", c)
			if err := tx.Put(e.ctx, put); err != nil {
				return err
			}
		}
		fill("b", 2)
		put.Condition, put.Deferred = storage.IfNotExists(), true
		err := tx.Put(e.ctx, put)
		put.Condition, put.Deferred = nil, false
		if err != nil {
			return err
		}
		fill("b", 0)
		row, ok, err := tx.Get(e.ctx, get)
		if err != nil {
			return err
		}
		fill("a", 9)
		if !ok {
			return fmt.Errorf("get b/0 in the transaction: no row")
		}
		e.rowEq(row, want("b", 0))
		fill("b", 0)
		rows, err := tx.Scan(e.ctx, scan)
		if err != nil {
			return err
		}
		fill("a", 9)
		got, err := storage.CollectRows(rows)
		if err != nil {
			return err
		}
		if len(got) != 3 {
			return fmt.Errorf("scan b in the transaction: %d rows, want 3", len(got))
		}
		fill("c", 5) // refilled again before Commit
		return nil
	}))
	for _, p := range []string{"a", "b"} {
		got := e.scan(&storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: V{"p": txt(p)}})
		if len(got) != 3 {
			t.Fatalf("partition %s: %d rows, want 3", p, len(got))
		}
		for c, r := range got {
			e.rowEq(r, want(p, int64(c)))
		}
	}
	if _, ok := e.get(tb, V{"p": txt("c")}, V{"c": i64(5)}); ok {
		t.Fatal("a row from a refill that was never sent was written")
	}
}
