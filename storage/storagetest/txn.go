package storagetest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

func testTxn(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := itemTable(e)
	p := V{"id": i64(1)}
	for s := int64(1); s <= 3; s++ {
		e.put(tb, p, seq(s*10), V{"i": i64(s * 10)})
	}
	g := func(s int64) *storage.Get {
		return &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Projection: []string{"i"}}
	}
	pt := func(s, v int64) *storage.Put {
		return &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Values: V{"i": i64(v)}}
	}
	dl := func(s int64) *storage.Delete {
		return &storage.Delete{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s)}
	}
	sc := &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: p, Projection: []string{"seq", "i"}}
	scanTx := func(tx storage.Txn) []int64 {
		rows, err := tx.Scan(e.ctx, sc)
		e.ok(err)
		all, err := storage.CollectRows(rows)
		e.ok(err)
		var out []int64
		for _, r := range all {
			out = append(out, r["i"].AsBigInt())
		}
		return out
	}

	// Read your own writes, in Get and Scan; invisible to others until commit.
	tx, err := e.backend().Begin(e.ctx)
	e.ok(err)
	e.ok(tx.Put(e.ctx, pt(15, 15)))
	e.ok(tx.Put(e.ctx, pt(20, 21)))
	e.ok(tx.Delete(e.ctx, dl(30)))
	row, ok, err := tx.Get(e.ctx, g(15))
	e.ok(err)
	if !ok || !row["i"].Equal(i64(15)) {
		t.Fatalf("own insert not visible: %v %v", row, ok)
	}
	if _, ok, err := tx.Get(e.ctx, g(30)); err != nil || ok {
		t.Fatalf("own delete not visible (found %v, err %v)", ok, err)
	}
	if got := scanTx(tx); !slices.Equal(got, []int64{10, 15, 21}) {
		t.Fatalf("scan in txn = %v, want [10 15 21]", got)
	}
	if _, ok := e.get(tb, p, seq(15)); ok {
		t.Fatal("uncommitted insert visible outside the transaction")
	}
	e.ok(tx.Commit(e.ctx))
	if got := e.scan(sc); len(got) != 3 || !got[1]["i"].Equal(i64(15)) || !got[2]["i"].Equal(i64(21)) {
		t.Fatalf("after commit: %v", got)
	}
	// Finished transactions refuse further use; Abort is a no-op.
	_, _, err = tx.Get(e.ctx, g(15))
	e.is(err, storage.ErrTxnDone)
	e.is(tx.Put(e.ctx, pt(1, 1)), storage.ErrTxnDone)
	e.is(tx.Commit(e.ctx), storage.ErrTxnDone)
	e.ok(tx.Abort(e.ctx))

	// Abort discards everything.
	tx, err = e.backend().Begin(e.ctx)
	e.ok(err)
	e.ok(tx.Put(e.ctx, pt(99, 99)))
	e.ok(tx.Delete(e.ctx, dl(10)))
	e.ok(tx.Abort(e.ctx))
	e.ok(tx.Abort(e.ctx))
	if got := e.scan(sc); len(got) != 3 || !got[0]["i"].Equal(i64(10)) {
		t.Fatalf("after abort: %v", got)
	}

	// A failed condition inside a transaction writes nothing and leaves it usable.
	tx, err = e.backend().Begin(e.ctx)
	e.ok(err)
	cond := pt(10, 1000)
	cond.Condition = storage.IfNotExists()
	e.is(tx.Put(e.ctx, cond), storage.ErrConditionNotMet)
	cond = pt(10, 1000)
	cond.Condition = storage.If(storage.Eq("i", i64(10)))
	e.ok(tx.Put(e.ctx, cond))
	del := dl(77)
	del.Condition = storage.IfExists()
	e.is(tx.Delete(e.ctx, del), storage.ErrConditionNotMet)
	e.ok(tx.Put(e.ctx, pt(40, 40)))
	e.ok(tx.Commit(e.ctx))
	if got := e.scan(sc); !slices.Equal(ints(got), []int64{1000, 15, 21, 40}) {
		t.Fatalf("after conditional txn: %v", ints(got))
	}

	// Update: commits on nil, aborts and returns a non-retryable error as is.
	e.ok(storage.Update(e.ctx, e.backend(), func(tx storage.Txn) error { return tx.Put(e.ctx, pt(50, 50)) }))
	boom := errors.New("boom")
	err = storage.Update(e.ctx, e.backend(), func(tx storage.Txn) error {
		if err := tx.Put(e.ctx, pt(60, 60)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want boom", err)
	}
	if got := e.scan(sc); !slices.Equal(ints(got), []int64{1000, 15, 21, 40, 50}) {
		t.Fatalf("after Update: %v", ints(got))
	}
}

func ints(rows []storage.Row) []int64 {
	var out []int64
	for _, r := range rows {
		out = append(out, r["i"].AsBigInt())
	}
	return out
}

// testDeferred: a Deferred IfNotExists put in a transaction inserts a
// missing row like IfNotExists; on a row that exists it fails the
// transaction with ErrConditionNotMet — from the Put, a later call or
// Commit — and none of the transaction's writes commit. A Deferred If or
// IfExists put does the same with its condition. Outside a transaction
// it answers at once; without a condition it is refused.
func testDeferred(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := itemTable(e)
	p := V{"id": i64(7)}
	e.put(tb, p, seq(1), V{"i": i64(1)})
	put := func(s, v int64) *storage.Put {
		return &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Values: V{"i": i64(v)},
			Condition: storage.IfNotExists(), Deferred: true}
	}
	plain := func(s, v int64) *storage.Put {
		return &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Values: V{"i": i64(v)}}
	}
	get := func(s int64) *storage.Get {
		return &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Projection: []string{"i"}}
	}
	// putThen puts p in tx and, if that succeeds, commits, or reads and
	// then commits: the deferred failure may show at either.
	putThen := func(tx storage.Txn, p *storage.Put, then string) error {
		if err := tx.Put(e.ctx, p); err != nil {
			// The transaction is over: a Commit anyway commits nothing.
			if tx.Commit(e.ctx) == nil {
				t.Errorf("Commit after a failed deferred put (%v) succeeded", err)
			}
			return err
		}
		if then == "get" {
			if _, _, err := tx.Get(e.ctx, get(2)); err != nil {
				return err
			}
		}
		return tx.Commit(e.ctx)
	}
	// A missing row is inserted, and the transaction sees it.
	tx, err := e.backend().Begin(e.ctx)
	e.ok(err)
	e.ok(tx.Put(e.ctx, put(2, 20)))
	row, ok, err := tx.Get(e.ctx, get(2))
	e.ok(err)
	if !ok || !row["i"].Equal(i64(20)) {
		t.Fatalf("a deferred insert, read back in its transaction: %v %v", row, ok)
	}
	e.ok(tx.Commit(e.ctx))
	if row, ok := e.get(tb, p, seq(2)); !ok || !row["i"].Equal(i64(20)) {
		t.Fatalf("a committed deferred insert: %v %v", row, ok)
	}
	// A row that exists fails the transaction, wherever the failure shows,
	// and nothing it wrote commits.
	for _, then := range []string{"commit", "get"} {
		tx, err := e.backend().Begin(e.ctx)
		e.ok(err)
		e.ok(tx.Put(e.ctx, plain(3, 30)))
		err = putThen(tx, put(1, 100), then)
		if !errors.Is(err, storage.ErrConditionNotMet) {
			t.Fatalf("%s: a deferred IfNotExists on an existing row gave %v, want ErrConditionNotMet", then, err)
		}
		e.ok(tx.Abort(e.ctx))
		if row, _ := e.get(tb, p, seq(1)); !row["i"].Equal(i64(1)) {
			t.Fatalf("%s: the existing row was overwritten: %v", then, row)
		}
		if _, ok := e.get(tb, p, seq(3)); ok {
			t.Fatalf("%s: a write of the failed transaction committed", then)
		}
	}
	// Outside a transaction: at once, like IfNotExists.
	e.is(e.db.Put(e.ctx, put(1, 100)), storage.ErrConditionNotMet)
	e.ok(e.db.Put(e.ctx, put(4, 40)))
	// If and IfExists: a condition that holds updates the row; one that
	// does not fails the transaction, wherever the failure shows.
	update := func(s, v int64, c *storage.Condition) *storage.Put {
		u := plain(s, v)
		u.Condition, u.Deferred = c, true
		return u
	}
	tx, err = e.backend().Begin(e.ctx)
	e.ok(err)
	e.ok(tx.Put(e.ctx, update(1, 11, storage.If(storage.Eq("i", i64(1))))))
	e.ok(tx.Put(e.ctx, update(2, 21, storage.IfExists())))
	e.ok(tx.Commit(e.ctx))
	for s, want := range map[int64]int64{1: 11, 2: 21} {
		if row, ok := e.get(tb, p, seq(s)); !ok || !row["i"].Equal(i64(want)) {
			t.Fatalf("a committed deferred conditional update of %d: %v %v, want i = %d", s, row, ok, want)
		}
	}
	for _, c := range []struct {
		name string
		put  *storage.Put
	}{
		{"If on a row whose value differs", update(1, 100, storage.If(storage.Eq("i", i64(1))))},
		{"If on a missing row", update(6, 100, storage.If(storage.IsNull("i")))},
		{"IfExists on a missing row", update(6, 100, storage.IfExists())},
	} {
		for _, then := range []string{"commit", "get"} {
			tx, err := e.backend().Begin(e.ctx)
			e.ok(err)
			e.ok(tx.Put(e.ctx, plain(3, 30)))
			e.ok(tx.Put(e.ctx, update(2, 22, storage.If(storage.Eq("i", i64(21))))))
			err = putThen(tx, c.put, then)
			if !errors.Is(err, storage.ErrConditionNotMet) {
				t.Fatalf("%s, %s: a deferred condition that does not hold gave %v, want ErrConditionNotMet", c.name, then, err)
			}
			e.ok(tx.Abort(e.ctx))
			for s, want := range map[int64]int64{1: 11, 2: 21} {
				if row, _ := e.get(tb, p, seq(s)); !row["i"].Equal(i64(want)) {
					t.Fatalf("%s, %s: row %d changed to %v", c.name, then, s, row)
				}
			}
			for _, s := range []int64{3, 6} {
				if _, ok := e.get(tb, p, seq(s)); ok {
					t.Fatalf("%s, %s: a write of the failed transaction committed (row %d)", c.name, then, s)
				}
			}
		}
	}
	e.is(e.db.Put(e.ctx, update(1, 100, storage.If(storage.Eq("i", i64(1))))), storage.ErrConditionNotMet)
	// Only with a condition.
	bad := plain(5, 50)
	bad.Deferred = true
	e.is(e.db.Put(e.ctx, bad), storage.ErrInvalidArgument)
	tx, err = e.backend().Begin(e.ctx)
	e.ok(err)
	e.is(tx.Put(e.ctx, bad), storage.ErrInvalidArgument)
	e.ok(tx.Abort(e.ctx))
}

// testExpect: an Expect whose condition holds lets the transaction commit
// its writes and writes nothing itself; one that does not hold fails the
// transaction with ErrConditionNotMet — from Expect, a later call or
// Commit — and none of its writes commit. It sees the transaction's own
// writes, and it is a read: two transactions that each expect what the
// other overwrites cannot both commit (write skew). Without a condition
// it is refused.
func testExpect(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := itemTable(e)
	p := V{"id": i64(8)}
	e.put(tb, p, seq(1), V{"i": i64(1)})
	expect := func(s int64, c *storage.Condition) *storage.Expect {
		return &storage.Expect{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Condition: c}
	}
	plain := func(s, v int64) *storage.Put {
		return &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Values: V{"i": i64(v)}}
	}
	get := &storage.Get{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(1)}
	// run expects x in a transaction that writes row 3, then reads row 1
	// and commits, or commits at once: a failure may show at any of them.
	run := func(x *storage.Expect, then string) error {
		tx, err := e.backend().Begin(e.ctx)
		e.ok(err)
		defer tx.Abort(e.ctx)
		e.ok(tx.Put(e.ctx, plain(3, 30)))
		if err := tx.Expect(e.ctx, x); err != nil {
			// The transaction is over: a Commit anyway commits nothing.
			if tx.Commit(e.ctx) == nil {
				t.Errorf("Commit after a failed Expect (%v) succeeded", err)
			}
			return err
		}
		if then == "get" {
			if _, _, err := tx.Get(e.ctx, get); err != nil {
				return err
			}
		}
		return tx.Commit(e.ctx)
	}
	for _, c := range []struct {
		name string
		x    *storage.Expect
		ok   bool
	}{
		{"If that holds", expect(1, storage.If(storage.Eq("i", i64(1)), storage.Lt("i", i64(2)))), true},
		{"IfExists on a row", expect(1, storage.IfExists()), true},
		{"IfNotExists on a missing row", expect(5, storage.IfNotExists()), true},
		{"its own write", expect(3, storage.If(storage.Eq("i", i64(30)))), true},
		{"If on a row whose value differs", expect(1, storage.If(storage.Gt("i", i64(1)))), false},
		{"If on a missing row", expect(5, storage.If(storage.IsNull("i"))), false},
		{"IfExists on a missing row", expect(5, storage.IfExists()), false},
		{"IfNotExists on a row", expect(1, storage.IfNotExists()), false},
	} {
		for _, then := range []string{"commit", "get"} {
			e.ok(e.db.Delete(e.ctx, &storage.Delete{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(3)}))
			err := run(c.x, then)
			_, wrote := e.get(tb, p, seq(3))
			if c.ok && (err != nil || !wrote) {
				t.Fatalf("%s, %s: %v, row written %v; want a commit", c.name, then, err, wrote)
			}
			if !c.ok && (!errors.Is(err, storage.ErrConditionNotMet) || wrote) {
				t.Fatalf("%s, %s: %v, row written %v; want ErrConditionNotMet and nothing written", c.name, then, err, wrote)
			}
			if row, _ := e.get(tb, p, seq(1)); !row["i"].Equal(i64(1)) {
				t.Fatalf("%s, %s: the expected row changed: %v", c.name, then, row)
			}
			if _, ok := e.get(tb, p, seq(5)); ok {
				t.Fatalf("%s, %s: Expect wrote a row", c.name, then)
			}
		}
	}
	// Bad input is refused at once and leaves the transaction usable.
	tx, err := e.backend().Begin(e.ctx)
	e.ok(err)
	e.is(tx.Expect(e.ctx, expect(1, nil)), storage.ErrInvalidArgument)
	e.is(tx.Expect(e.ctx, expect(1, storage.If(storage.Eq("nope", i64(1))))), storage.ErrUnknownColumn)
	e.is(tx.Expect(e.ctx, expect(1, storage.If(storage.Eq("i", txt("1"))))), storage.ErrTypeMismatch)
	e.is(tx.Expect(e.ctx, &storage.Expect{Namespace: e.ns, Table: tb.Name, Partition: p, Condition: storage.IfExists()}), storage.ErrInvalidKey)
	e.is(tx.Expect(e.ctx, &storage.Expect{Namespace: e.ns, Table: "nope", Partition: p, Clustering: seq(1), Condition: storage.IfExists()}), storage.ErrTableNotFound)
	e.ok(tx.Put(e.ctx, plain(4, 40)))
	e.ok(tx.Commit(e.ctx))
	e.is(tx.Expect(e.ctx, expect(1, storage.IfExists())), storage.ErrTxnDone)
	if _, ok := e.get(tb, p, seq(4)); !ok {
		t.Fatal("a transaction after refused Expects did not commit")
	}

	// Write skew: each takes itself off call if the other is on call, as
	// an Expect says. Serializably, at least one stays on call.
	doc := func(d string) V { return V{"seq": i64(map[string]int64{"alice": 10, "bob": 11}[d])} }
	for n, order := range twoTxnSchedules {
		for _, d := range []string{"alice", "bob"} {
			e.put(tb, p, doc(d), V{"i": i64(1)})
		}
		script := func(me, other string) []step {
			return []step{
				func(ctx context.Context, tx storage.Txn) error {
					// A read first, so the transaction has begun on its
					// server before the other commits.
					if _, _, err := tx.Get(ctx, get); err != nil {
						return err
					}
					return tx.Expect(ctx, &storage.Expect{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: doc(other),
						Condition: storage.If(storage.Eq("i", i64(1)))})
				},
				func(ctx context.Context, tx storage.Txn) error {
					return tx.Put(ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: doc(me), Values: V{"i": i64(0)}})
				},
			}
		}
		errs := runSchedule(t, e.backend(), [][]step{script("alice", "bob"), script("bob", "alice")}, order)
		for _, err := range errs {
			if err != nil && !storage.IsRetryable(err) && !errors.Is(err, storage.ErrConditionNotMet) {
				t.Fatalf("schedule %v: unexpected error %v", order, err)
			}
		}
		onCall := 0
		for _, d := range []string{"alice", "bob"} {
			if row, _ := e.get(tb, p, doc(d)); row["i"].Equal(i64(1)) {
				onCall++
			}
		}
		if onCall == 0 {
			t.Fatalf("schedule %d %v: write skew through Expect: both committed (errors %v)", n, order, errs)
		}
	}
}

// testSkippable: a Skippable put whose condition holds writes as the
// conditional put would; one whose condition does not hold writes nothing
// and returns nil — alone, in Mutate, and in a transaction, which goes on
// and commits its other writes. Reads in the transaction see exactly the
// writes that held. Without a condition, or with Deferred, it is refused.
func testSkippable(t *testing.T, open Opener) {
	e := newEnv(t, open)
	tb := itemTable(e)
	p := V{"id": i64(8)}
	put := func(s, v int64, c *storage.Condition) *storage.Put {
		return &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(s), Values: V{"i": i64(v)},
			Condition: c, Skippable: true}
	}
	// want checks every row of the partition: seq → i.
	want := func(step string, rows map[int64]int64) {
		t.Helper()
		for s := range int64(8) {
			row, ok := e.get(tb, p, seq(s))
			v, present := rows[s]
			if ok != present || ok && !row["i"].Equal(i64(v)) {
				t.Fatalf("%s: row %d is %v (present %v), want %d (present %v)", step, s, row, ok, v, present)
			}
		}
	}
	e.put(tb, p, seq(1), V{"i": i64(1)})
	e.put(tb, p, seq(2), V{"i": i64(2)})
	lt := func(v int64) *storage.Condition { return storage.If(storage.Lt("i", i64(v))) }

	// Alone: each answers nil, and only the ones that hold write.
	for _, c := range []struct {
		name string
		put  *storage.Put
	}{
		{"IfNotExists on an existing row", put(1, 100, storage.IfNotExists())},
		{"IfNotExists on a missing row", put(3, 3, storage.IfNotExists())},
		{"If that holds", put(2, 20, lt(5))},
		{"If that does not hold", put(1, 100, lt(1))},
		{"If on a missing row", put(4, 100, storage.If(storage.IsNull("i")))},
		{"IfExists on a missing row", put(4, 100, storage.IfExists())},
	} {
		if err := e.db.Put(e.ctx, c.put); err != nil {
			t.Fatalf("%s: Put gave %v, want nil", c.name, err)
		}
	}
	want("alone", map[int64]int64{1: 1, 2: 20, 3: 3})

	// In Mutate, a skipped put does not fail the others.
	e.ok(e.db.Mutate(e.ctx, []storage.Mutation{put(1, 100, lt(1)), put(2, 21, lt(21)), put(5, 5, storage.IfNotExists())}))
	want("mutate", map[int64]int64{1: 1, 2: 21, 3: 3, 5: 5})

	// In a transaction: the skipped ones leave it usable, its reads see
	// the writes that held and not the others, and its plain writes commit.
	tx, err := e.backend().Begin(e.ctx)
	e.ok(err)
	e.ok(tx.Put(e.ctx, put(1, 100, lt(1))))
	e.ok(tx.Put(e.ctx, put(2, 22, lt(100))))
	e.ok(tx.Put(e.ctx, put(6, 100, storage.IfExists())))
	e.ok(tx.Put(e.ctx, put(3, 30, storage.IfExists())))
	e.ok(tx.Put(e.ctx, &storage.Put{Namespace: e.ns, Table: tb.Name, Partition: p, Clustering: seq(7), Values: V{"i": i64(7)}}))
	// A condition on the transaction's own writes: row 7 exists now.
	e.ok(tx.Put(e.ctx, put(7, 70, storage.IfExists())))
	rows, err := tx.Scan(e.ctx, &storage.Scan{Namespace: e.ns, Table: tb.Name, Partition: p, Projection: []string{"seq", "i"}})
	e.ok(err)
	got, err := storage.CollectRows(rows)
	e.ok(err)
	inTx := map[int64]int64{}
	for _, r := range got {
		inTx[r["seq"].AsBigInt()] = r["i"].AsBigInt()
	}
	if wantTx := map[int64]int64{1: 1, 2: 22, 3: 30, 5: 5, 7: 70}; !maps.Equal(inTx, wantTx) {
		t.Fatalf("in the transaction: %v, want %v", inTx, wantTx)
	}
	e.ok(tx.Put(e.ctx, put(5, 50, lt(5))))
	e.ok(tx.Commit(e.ctx))
	want("transaction", map[int64]int64{1: 1, 2: 22, 3: 30, 5: 5, 7: 70})

	// Refused, alone and in a transaction, and nothing written.
	bare := put(4, 4, nil)
	both := put(4, 4, storage.IfNotExists())
	both.Deferred = true
	for _, bad := range []*storage.Put{bare, both} {
		e.is(e.db.Put(e.ctx, bad), storage.ErrInvalidArgument)
		tx, err := e.backend().Begin(e.ctx)
		e.ok(err)
		e.is(tx.Put(e.ctx, bad), storage.ErrInvalidArgument)
		e.ok(tx.Abort(e.ctx))
	}
	want("refused", map[int64]int64{1: 1, 2: 22, 3: 30, 5: 5, 7: 70})
}
