package ledger

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// Keys whose hashes collide (memory.go, "Collisions"). Integers 2^32
// apart hash alike; so do the tuples of collidingTuples, 200 elements
// each, whose last two are solved for one hash (the interpreter's tuple
// hash is Python's: TestCollidingTuples checks them), and which compare
// equal up to their last two; the 131,072 integers of bucketInts hash
// apart two by two but share their low 16 bits, and with them a bucket of
// any table of up to 2^16 buckets.
const (
	collidingInts   = "ks = [i << 32 for i in range(40000)]\n"
	collidingTuples = "ts = [(0,) * 198 + (a, ((a + 3) * 2503946697 - 3) % 4294967296) for a in range(5000)]\n"
	bucketInts      = "ks = list(range(0, 1 << 33, 1 << 16))\n"
)

// floodCases put many colliding keys in one table, or look them up, in
// one step: each ran for 6 s to minutes within one interpreter step, past
// any time limit.
var floodCases = []struct{ name, body string }{
	{"set()", collidingInts + "x = set(ks)"},
	{"dict()", collidingInts + "x = dict([(k, 1) for k in ks])"},
	{"dict.update", collidingInts + "d = {}\nd.update([(k, 1) for k in ks])"},
	{"set.update", collidingInts + "s = set([1])\ns.update(ks)"},
	{"set.union", collidingInts + "x = set([1]).union(ks)"},
	{"|", collidingInts + "x = set([1]) | set(ks)"},
	{"set ==", collidingInts + "x = set(ks[:20000]) == set(ks[20000:])"},
	{"in a set of colliding tuples", collidingTuples + "s = set(ts)\nx = ts[0] in s"},
	{"tuple keys", collidingTuples + "d = dict([(t, 1) for t in ts])"},
	{"keys sharing a bucket", bucketInts + "x = set(ks)"},
}

// TestCollisionFlooding: each of floodCases, on a real ledger, stops
// within about its time limit — refused for the collisions it would walk
// (ErrStepLimit) or stopped by the time limit between keys — writes
// nothing and records the abort.
func TestCollisionFlooding(t *testing.T) {
	const limit, slack = 500 * time.Millisecond, 3 * time.Second
	f := newFixtureLimits(t, openEngine(t), Limits{MaxExecutionTime: limit})
	for i, c := range floodCases {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			id := fmt.Sprintf("flood%d", i)
			if err := f.register(f.hmac, id, contract(c.body)); err != nil {
				t.Fatal(err)
			}
			f.checkStops(id, limit+slack)
		})
	}
}

// checkStops runs contract id, which must stop within within, refused
// by its step budget or stopped by its time limit, write nothing and
// record its abort. An execution still running then is left running: no
// budget stops it.
func (f *fixture) checkStops(id string, within time.Duration) {
	f.t.Helper()
	ctx := context.Background()
	req := f.request(f.hmac, id, `{}`)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := f.l.Execute(ctx, req)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(within):
		f.t.Errorf("%s: still running after %v", id, within)
		return
	}
	f.t.Logf("%s: stopped after %v: %v", id, time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, ErrStepLimit) && !errors.Is(err, ErrTimeLimit) {
		f.t.Fatalf("%s: %v, want the step or time limit", id, err)
	}
	if latest, err := f.l.Latest(ctx, "s"); err != nil || latest != -1 {
		f.t.Errorf("%s: asset s at age %d (%v): something was written", id, latest, err)
	}
	st, serr := f.l.TxState(ctx, req.Nonce)
	if serr != nil || st.Status != TxAborted || st.Kind != Kind(err) {
		f.t.Errorf("%s: state %+v (%v), want aborted with kind %s", id, st, serr, Kind(err))
	}
}

// TestCollidingTuples: the tuples of collidingTuples all hash alike, as
// integers 2^32 apart do.
func TestCollidingTuples(t *testing.T) {
	for name, src := range map[string]string{"ts": collidingTuples, "ks": collidingInts} {
		g, _, err := runPlain(src)
		if err != nil {
			t.Fatal(err)
		}
		hashes := map[uint32]int{}
		for v := range g[name].(*starlark.List).Elements() {
			h, err := v.Hash()
			if err != nil {
				t.Fatal(err)
			}
			hashes[h]++
		}
		if len(hashes) != 1 {
			t.Errorf("%s: %d distinct hashes, want 1", name, len(hashes))
		}
	}
}

// TestCollisionProbe: collisions counts exactly the entries of a table
// whose hash is the probe's, whatever their type — as many as a lookup of
// a key of that hash, absent from the table, compares it with.
func TestCollisionProbe(t *testing.T) {
	s := starlark.NewSet(0)
	d := starlark.NewDict(0)
	for i := range 100 {
		k := starlark.MakeInt64(int64(i) << 32) // hash of 0
		_ = s.Insert(k)
		_ = d.SetKey(k, starlark.None)
		_ = s.Insert(starlark.MakeInt(i + 1)) // other hashes
		_ = d.SetKey(starlark.MakeInt(i+1), starlark.None)
	}
	_ = s.Insert(starlark.Float(0.5)) // a float of integer part 0
	h, _ := starlark.MakeInt(0).Hash()
	for _, c := range []struct {
		table starlark.Value
		want  int
	}{{s, 101}, {d, 100}} {
		table := c.table
		if got := collisions(table, h); got != c.want {
			t.Errorf("%s: %d entries of the hash of 0, want %d", table.Type(), got, c.want)
		}
		h1, _ := starlark.MakeInt(-5).Hash() // no entry of that hash
		if got := collisions(table, h1); got != 0 {
			t.Errorf("%s: %d entries of an absent hash, want 0", table.Type(), got)
		}
	}
	// The table is as it was, and still finds what it holds.
	if found, _ := s.Has(starlark.MakeInt64(99 << 32)); !found || s.Len() != 201 {
		t.Errorf("the set changed: %d keys", s.Len())
	}
}

// Colliding keys for the guards one by one: 2,000 integers of one hash, a
// dict of them filled key by key (a comprehension, whose stores are steps
// of their own), two sets of 1,000 each and two of 700.
const (
	manyKeys  = "ks = [i << 32 for i in range(2000)]\n"
	crowdDict = manyKeys + "d = {k: 1 for k in ks}\ne = {k: 2 for k in ks}\nk = ks[1000]\n"
	halfSets  = "a = set([i << 32 for i in range(0, 2000, 2)])\nb = set([i << 32 for i in range(1, 2000, 2)])\n"
	sets700   = "a = set([i << 32 for i in range(700)])\nb = set([i << 32 for i in range(700)])\n"
)

// TestCollisionRefusals: each guard that looks up or stores keys refuses
// the lookup that would compare a key with more than maxCollisions
// entries of its hash, and an operation whose lookups, so counted, would
// pass its work bound, with ErrStepLimit, naming itself. (Without the
// collisions counted, each ran to its end.)
func TestCollisionRefusals(t *testing.T) {
	crowded := []struct{ name, src string }{
		{"set()", manyKeys + "x = set(ks)"},
		{"set() of a dict", crowdDict + "x = set(d)"},
		{"dict()", manyKeys + "x = dict([(k, 1) for k in ks])"},
		{"dict() of a dict", crowdDict + "x = dict(d)"},
		{"dict.update", manyKeys + "x = {}\nx.update([(k, 1) for k in ks])"},
		{"dict.update of a dict", crowdDict + "x = {}\nx.update(d)"},
		{"set.update", manyKeys + "s = set()\ns.update(ks)"},
		{"set.union", manyKeys + "x = set().union(ks)"},
		{"set.symmetric_difference", halfSets + "x = a.symmetric_difference(b)"},
		{"set |", halfSets + "x = a | b"},
		{"set ^", halfSets + "x = a ^ b"},
		{"set |=", halfSets + "a |= b"},
		{"dict |", crowdDict + "x = {} | d"},
		{"dict |=", crowdDict + "x = {}\nx |= d"},
		{"dict |= by index", crowdDict + "x = [{}]\nx[0] |= d"},
		{"in", crowdDict + "x = k in d"},
		{"not in", crowdDict + "x = k not in d"},
		{"[key]", crowdDict + "x = d[k]"},
		{"[key] +=", crowdDict + "d[k] += 1"},
		{"dict.get", crowdDict + "x = d.get(k)"},
		{"dict.pop", crowdDict + "x = d.pop(k)"},
		{"dict.setdefault", crowdDict + "x = d.setdefault(k)"},
		{"getattr(dict, 'get')", crowdDict + "x = getattr(d, 'get')(k)"},
		{"dict ==", crowdDict + "x = d == e"},
		{"dict !=", crowdDict + "x = d != e"},
		{"dicts in lists", crowdDict + "x = [d] == [e]"},
		{"dicts in tuples", crowdDict + "x = (1, d) < (1, e)"},
		{"dict in a list", crowdDict + "x = d in [e]"},
		{"list.index of a dict", crowdDict + "x = [e].index(d)"},
	}
	for _, c := range crowded {
		_, st, err := runGuarded(c.src, Limits{})
		if !errors.Is(err, ErrStepLimit) || !strings.Contains(st.workRefused, "same hash") {
			t.Errorf("%s: %v, want ErrStepLimit for the entries of one hash", c.name, err)
		}
	}
	// Sets of at most maxCollisions+1 keys of one hash (no guard stores
	// more), whose lookups, counted, pass the work bound of a 4 MiB
	// budget (262,144 units).
	heavy := []struct{ name, src string }{
		{"set ==", sets700 + "x = a == b"},
		{"set <=", sets700 + "x = a <= b"},
		{"set <", sets700 + "x = a < b"},
		{"set >=", sets700 + "x = a >= b"},
		{"set >", sets700 + "x = a > b"},
		{"set -", sets700 + "x = a - b"},
		{"set &", sets700 + "x = a & b"},
		{"set.intersection", sets700 + "x = a.intersection(b)"},
		{"set.difference", sets700 + "x = a.difference(b)"},
		{"set.issubset", sets700 + "x = a.issubset(b)"},
		{"set.issuperset", sets700 + "x = a.issuperset(b)"},
		{"sets in lists", sets700 + "x = [a] == [b]"},
		{"set in a list", sets700 + "x = a in [b]"},
		{"sorted of sets", sets700 + "x = sorted([a, b])"},
		{"max of sets", sets700 + "x = max(a, b)"},
	}
	for _, c := range heavy {
		_, st, err := runGuarded(c.src, Limits{MaxMemoryBytes: 4 << 20})
		if !errors.Is(err, ErrStepLimit) || !strings.Contains(st.workRefused, "units") {
			t.Errorf("%s: %v, want ErrStepLimit for the work of its lookups", c.name, err)
		}
	}
}

// TestCollisionCharges: the comparisons of a lookup with the entries of
// its key's hash are charged as steps, as any work past freeUnits is:
// set() of 100 integers of one hash compares its i-th key with i others,
// the 17th on beyond freeUnits; one lookup among them, 1 + 100 - 1 units,
// 84 past freeUnits, is two steps. Distinct keys cost nothing, nor does a
// single lookup of a long string (its hash is linear in bytes the memory
// budget counted), however many.
func TestCollisionCharges(t *testing.T) {
	var excess uint64
	for i := 17; i < 100; i++ {
		excess += uint64(i - freeUnits)
	}
	const crowd = "d = {i << 32: i for i in range(100)}\nk = 5 << 32\n"
	for _, c := range []struct {
		src  string
		want uint64
	}{
		{"x = set([i << 32 for i in range(100)])", excess / unitsPerStep},
		{"x = set([i for i in range(100)])", 0},
		{"x = dict([(i << 32, i) for i in range(100)])", excess / unitsPerStep},
		{crowd + "x = d[k]", 2},
		{crowd + "x = d.get(k)", 2},
		{crowd + "x = k in d", 2},
		{crowd + "x = [k in d for i in range(10)]", 20},
		{"s = 'k' * 1000000\nd = {s: 1, 'x': 2, 'y': 3, 'z': 4, 'w': 5, 'v': 6}\nx = [d[s], s in d, d.get(s)] * 1000", 0},
	} {
		_, st, err := runGuarded(c.src, Limits{})
		if err != nil {
			t.Fatalf("%q: %v", c.src, err)
		}
		if st.charged != c.want {
			t.Errorf("%q: %d steps charged, want %d", c.src, st.charged, c.want)
		}
	}
}

// TestHonestCollisions: keys that collide without malice — floats of one
// integer part — are as the interpreter has them, charged for their
// comparisons, below maxCollisions of one hash.
func TestHonestCollisions(t *testing.T) {
	src := `xs = [i / 1000.0 for i in range(1, 1000)]
s = set(xs)
d = dict([(x, 1) for x in xs])
result = [len(s), len(d), 0.5 in s, d[0.25], len(s | set([0.5, 2.5])), len(s & set([0.001])), s == set(xs), d == dict(d)]`
	want, _, werr := runPlain(src)
	got, st, gerr := runGuarded(src, Limits{})
	if werr != nil || gerr != nil {
		t.Fatalf("%v, plain %v", gerr, werr)
	}
	if g, w := got["result"].String(), want["result"].String(); g != w {
		t.Errorf("%s, want %s", g, w)
	}
	t.Logf("%d steps charged for the collisions", st.charged)
}

// TestBulkStopsWhenCancelled: each guard that looks up or stores many
// keys stops at its next key, with the interpreter's cancellation, once
// the thread is cancelled (its time limit or the request's context),
// whatever the walk of the table's buckets left to do.
func TestBulkStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st, stop := newStarThread(ctx, Limits{}.withDefaults())
	defer stop()
	keys := starlark.NewList(nil)
	set := starlark.NewSet(0)
	dict := starlark.NewDict(0)
	for i := range 100 {
		k := starlark.MakeInt(i << 16)
		_ = keys.Append(k)
		_ = set.Insert(k)
		_ = dict.SetKey(k, k)
	}
	pairs, _ := starlark.Call(st.thread, starlark.Universe["zip"], starlark.Tuple{keys, keys}, nil)
	call := func(f starlark.Value, args ...starlark.Value) error {
		_, err := starlark.Call(st.thread, f, args, nil)
		return err
	}
	method := func(recv starlark.Value, name string) starlark.Value {
		return boundGuards[name].BindReceiver(recv)
	}
	for name, err := range map[string]error{
		"set()":           call(predeclared["set"], keys),
		"dict()":          call(predeclared["dict"], pairs),
		"dict.update":     call(method(starlark.NewDict(0), "update"), dict),
		"set.union":       call(method(set, "union"), keys),
		"set.issuperset":  call(method(set, "issuperset"), keys),
		"set |":           call(predeclared[binopGuards[syntax.PIPE]], set, set),
		"dict |":          call(predeclared[binopGuards[syntax.PIPE]], dict, dict),
		"set ==":          call(predeclared[compareGuards[syntax.EQL]], set, set),
		"dict ==":         call(predeclared[compareGuards[syntax.EQL]], dict, dict),
		"set >= in lists": call(predeclared[compareGuards[syntax.GE]], starlark.NewList([]starlark.Value{set}), starlark.NewList([]starlark.Value{set})),
	} {
		if !errors.Is(err, errCancelled) {
			t.Errorf("%s: %v, want it cancelled", name, err)
		}
	}
}

// TestTablesMatchInterpreter: the guards' dict and set operations and
// their comparisons, done a key at a time, give what the interpreter's
// give — the same value or the same error — on random values: numbers
// (some of one hash, some NaN), strings, tuples, lists, dicts and sets,
// nested; receivers frozen or not.
func TestTablesMatchInterpreter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var value func(depth int, hashable bool) starlark.Value
	leaf := func() starlark.Value {
		switch rng.IntN(7) {
		case 0:
			return starlark.MakeInt(rng.IntN(4))
		case 1:
			return starlark.MakeInt64(int64(rng.IntN(4)) << 32) // hash of 0
		case 2:
			return starlark.Float([]float64{0.5, 1, 0.25, math.NaN()}[rng.IntN(4)])
		case 3:
			return starlark.String([]string{"a", "b", ""}[rng.IntN(3)])
		case 4:
			return starlark.Bool(rng.IntN(2) == 0)
		case 5:
			return starlark.None
		}
		return starlark.MakeInt(1)
	}
	value = func(depth int, hashable bool) starlark.Value {
		if depth == 0 || rng.IntN(3) == 0 {
			return leaf()
		}
		n := rng.IntN(4)
		kind := rng.IntN(4)
		if hashable {
			kind = 0
		}
		switch kind {
		case 0:
			t := make(starlark.Tuple, n)
			for i := range t {
				t[i] = value(depth-1, hashable)
			}
			return t
		case 1:
			l := starlark.NewList(nil)
			for range n {
				_ = l.Append(value(depth-1, false))
			}
			return l
		case 2:
			d := starlark.NewDict(n)
			for range n {
				_ = d.SetKey(value(depth-1, true), value(depth-1, false))
			}
			return d
		}
		s := starlark.NewSet(n)
		for range n {
			_ = s.Insert(value(depth-1, true))
		}
		return s
	}
	table := func() starlark.Value {
		if rng.IntN(2) == 0 {
			d := starlark.NewDict(0)
			for range rng.IntN(6) {
				_ = d.SetKey(value(1, true), value(1, false))
			}
			return d
		}
		s := starlark.NewSet(0)
		for range rng.IntN(6) {
			_ = s.Insert(value(1, true))
		}
		return s
	}
	// An argument: a table, a list or tuple of keys (sometimes not all
	// hashable, or pairs), or something not iterable.
	arg := func() starlark.Value {
		switch rng.IntN(5) {
		case 0, 1:
			return table()
		case 2:
			l := starlark.NewList(nil)
			for range rng.IntN(6) {
				if rng.IntN(8) == 0 {
					_ = l.Append(starlark.NewList(nil))
				} else {
					_ = l.Append(starlark.Tuple{value(1, true), value(1, false)})
				}
			}
			return l
		case 3:
			tu := make(starlark.Tuple, rng.IntN(6))
			for i := range tu {
				tu[i] = value(1, rng.IntN(8) != 0)
			}
			return tu
		}
		return starlark.MakeInt(7)
	}
	show := func(v starlark.Value, err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		return v.String()
	}
	// The interpreter's and the guards' operations act on copies of the
	// same values (the updates change their receiver).
	copyOf := func(v starlark.Value) starlark.Value {
		switch v := v.(type) {
		case *starlark.Dict:
			c := starlark.NewDict(v.Len())
			for k, x := range v.Entries() {
				_ = c.SetKey(k, x)
			}
			return c
		case *starlark.Set:
			c := starlark.NewSet(v.Len())
			for k := range v.Elements() {
				_ = c.Insert(k)
			}
			return c
		}
		return v
	}
	st, stop := newStarThread(context.Background(), Limits{}.withDefaults())
	defer stop()
	plain := &starlark.Thread{}
	ops := []syntax.Token{syntax.EQL, syntax.NEQ, syntax.LT, syntax.LE, syntax.GT, syntax.GE}
	binops := []syntax.Token{syntax.PIPE, syntax.AMP, syntax.CIRCUMFLEX, syntax.MINUS}
	methods := []string{"update", "union", "intersection", "difference", "symmetric_difference", "issuperset", "issubset"}
	for i := range 20000 {
		x, y := value(3, false), value(3, false)
		if rng.IntN(2) == 0 {
			x, y = table(), table()
		}
		op := ops[rng.IntN(len(ops))]
		want, werr := starlark.Compare(op, x, y)
		got, gerr := st.compare(op, x, y)
		if show(starlark.Bool(got), gerr) != show(starlark.Bool(want), werr) {
			t.Fatalf("#%d %s %s %s: %s, want %s", i, x, op, y, show(starlark.Bool(got), gerr), show(starlark.Bool(want), werr))
		}

		x, y = table(), table()
		bop := binops[rng.IntN(len(binops))]
		wz, werr := starlark.Binary(bop, x, y)
		w := st.meter(bop.String(), x, y)
		gz, ok, gerr := tableBinop(&w, bop, x, y)
		if !ok {
			gz, gerr = starlark.Binary(bop, x, y)
		}
		if show(gz, gerr) != show(wz, werr) {
			t.Fatalf("#%d %s %s %s: %s, want %s", i, x, bop, y, show(gz, gerr), show(wz, werr))
		}

		recv := table()
		name := methods[rng.IntN(len(methods))]
		args := starlark.Tuple{}
		for range rng.IntN(3) {
			args = append(args, arg())
		}
		if name != "update" && name != "union" && len(args) == 0 {
			continue // the interpreter panics
		}
		wrecv, grecv := copyOf(recv), copyOf(recv)
		if rng.IntN(4) == 0 {
			wrecv.Freeze()
			grecv.Freeze()
		}
		wm, err := wrecv.(starlark.HasAttrs).Attr(name)
		if err != nil || wm == nil {
			continue // no such method of a dict
		}
		wv, werr := starlark.Call(plain, wm, args, nil)
		gv, gerr := callMethod(st.thread, st, grecv, name, args, nil)
		if show(gv, gerr) != show(wv, unwrapEval(werr)) || wrecv.String() != grecv.String() {
			t.Fatalf("#%d %s.%s%s: %s (receiver %s), want %s (receiver %s)", i, recv, name, args, show(gv, gerr), grecv, show(wv, werr), wrecv)
		}
	}
	// And the universe's set and dict.
	for i := range 5000 {
		a := arg()
		for _, name := range []string{"set", "dict"} {
			wv, werr := starlark.Call(plain, starlark.Universe[name], starlark.Tuple{a}, nil)
			gv, gerr := starlark.Call(st.thread, predeclared[name], starlark.Tuple{a}, nil)
			if show(gv, unwrapEval(gerr)) != show(wv, unwrapEval(werr)) {
				t.Fatalf("#%d %s(%s): %s, want %s", i, name, a, show(gv, gerr), show(wv, werr))
			}
		}
	}
}
