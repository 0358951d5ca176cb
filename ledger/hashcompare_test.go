package ledger

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// TestCompareUnits: the measure of a comparison (memory.go) counts what
// the interpreter's comparison can visit: each value reached, a unit per
// 64 bytes of strings, nothing past an unequal length of an equality, and
// nothing below the interpreter's depth limit.
func TestCompareUnits(t *testing.T) {
	eval := func(src string) starlark.Value {
		v, err := starlark.EvalOptions(fileOptions, &starlark.Thread{}, "t.star", src, nil)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		op   syntax.Token
		x, y string
		want int64
	}{
		{syntax.EQL, "(1, 2)", "(1, 2)", 3},
		{syntax.EQL, "(1, (2, 3))", "(1, (2, 4))", 5},
		{syntax.EQL, "[1, 2]", "[1, 2, 3]", 1},                // unequal lengths: not compared
		{syntax.LT, "[1, 2]", "[1, 2, 3]", 3},                 // ordered: up to the shorter
		{syntax.LT, "[[1, 2]]", "[[1, 2]]", 2 * 4},            // the first differing pair again at each level
		{syntax.EQL, "('x' * 640,)", "('y' * 6400,)", 1 + 11}, // the shorter string, a unit per 64 bytes
		{syntax.EQL, "((1 << 500) * (1 << 499),)", "((1 << 500) * (1 << 499),)", 1 + 1 + 1000/512},
		{syntax.EQL, "((1 << 500) * (1 << 500) * (1 << 500),)", "(1,)", 1 + 1}, // a small integer: one word
		{syntax.EQL, "((1 << 500) * (1 << 500) * (1 << 500),)", "(-(1 << 500) * (1 << 500) * (1 << 500),)", 1 + 1 + maxIntBits/512}, // past 1024 bits: as large as can be
		{syntax.EQL, "{(1, 2): 'a'}", "{(1, 2): 'b'}", 1 + 2*3 - 1 + 1},                                                             // the key hashed, found, the values compared
		{syntax.EQL, "{1: 2}", "{3: 4, 5: 6}", 1},
		{syntax.EQL, "set([(1, 2), 3])", "set([3, (1, 2)])", 1 + 5 + 1},
		{syntax.GT, "set([1, 2])", "set([1])", 1 + 2 + 2 + 1},
		{syntax.EQL, "(1, 'a', None)", "(1, 'a', 2)", 4},
	} {
		if got := compareUnits(c.op, eval(c.x), eval(c.y), 1<<30); got != c.want {
			t.Errorf("%s %s %s: %d units, want %d", c.x, c.op, c.y, got, c.want)
		}
	}
	// A list that holds itself: as deep as the interpreter goes (it then
	// fails), no deeper.
	l := starlark.NewList(nil)
	_ = l.Append(l)
	if got := compareUnits(syntax.EQL, l, l, 1<<30); got != int64(starlark.CompareLimit)+1 {
		t.Errorf("a list holding itself: %d units, want %d", got, starlark.CompareLimit+1)
	}
	// The measure stops once it passes its cap: a tuple of 32^8 leaves.
	w := eval("[w for w in [(1,) * 32] for i in range(7) for w in [(w,) * 32]][-1]")
	if got := compareUnits(syntax.EQL, w, w, 1000); got <= 1000 || got > 1100 {
		t.Errorf("past the cap: %d units, want just past 1000", got)
	}
}

// TestKeyUnits: a tuple hashed as a key may take maxKeyUnits units, and
// not one more; other keys are not bounded (they take time linear in what
// the memory budget holds; their collisions are: collision_test.go).
func TestKeyUnits(t *testing.T) {
	for _, src := range []string{
		"d = {}; d[tuple(range(255))] = 1",           // 256 units
		"d = {tuple(range(255)): 1}",                 // a literal's key
		"x = tuple(range(255)) in set()",             // looked up
		"s = 'x' * 10000000; d = {s: 1}; x = s in d", // a long string
		"d = {}; d[('x' * 16000, 'y' * 255)] = 1",    // 1 + 251 + 4 units
		"x = {}.get(((1 << 500) * (1 << 499), 2))",   // a big integer: 1 + 2 units
	} {
		if _, _, err := runGuarded(src, Limits{}); err != nil {
			t.Errorf("%q: %v", src, err)
		}
	}
	// Unhashable: the interpreter says so, as it did.
	if _, _, err := runGuarded("x = ([1],) in set([1])", Limits{}); err == nil || !strings.Contains(err.Error(), "unhashable") {
		t.Errorf("an unhashable key: %v", err)
	}
	for _, src := range []string{
		"d = {}; d[tuple(range(256))] = 1",
		"d = {tuple(range(256)): 1}",
		"x = tuple(range(256)) in set()",
		"d = {}; d[('x' * 16000, 'y' * 320)] = 1",
		"x = 1 << 500\nd = {}\nd[(x * x * x, 2)] = 1", // past 1024 bits: as large as can be
		"s = set([1]); s.add(tuple(range(300)))",
		"x = dict([(tuple(range(300)), 1)])",
	} {
		if _, st, err := runGuarded(src, Limits{}); !errors.Is(err, ErrStepLimit) || st.workRefused == "" {
			t.Errorf("%q: %v, want ErrStepLimit", src, err)
		}
	}
}

// TestHashCompareCharges: hashing and comparing beyond freeUnits units is
// charged steps, so that the step budget, not the time limit, stops a
// contract that compares large values over and over.
func TestHashCompareCharges(t *testing.T) {
	// 100,001 units a comparison: 3125 steps.
	_, st, err := runGuarded("x = [1] * 100000\ny = [1] * 100000\nz = x == y", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(100_001-freeUnits) / unitsPerStep; st.charged != want {
		t.Errorf("%d steps charged, want %d", st.charged, want)
	}
	// A second of work a step at this size without the charge: a million
	// steps would take days.
	lim := Limits{MaxExecutionTime: time.Minute}
	start := time.Now()
	_, st, err = runGuarded("x = [1] * 100000\ny = [1] * 100000\nwhile True:\n    z = x == y", lim)
	if !errors.Is(err, ErrStepLimit) && !st.outOfGas {
		t.Fatalf("%v, want the step limit", err)
	}
	t.Logf("stopped by the step limit after %v, %d of %d steps charged", time.Since(start), st.charged, st.thread.Steps)
	// The same with a contract on a ledger: ErrStepLimit, recorded.
	f := newFixtureLimits(t, openEngine(t), lim)
	if err := f.register(f.hmac, "cmp", contract("x = [(1, 2)] * 20000\ny = [(1, 2)] * 20000\nwhile True:\n    z = x in [y]")); err != nil {
		t.Fatal(err)
	}
	f.checkRefused("cmp", ErrStepLimit, 64<<20)
}

// TestHashCompareLegitimate: large operations on values without sharing —
// as large as the default budgets let a contract make — are neither
// refused nor changed; they are charged steps for what goes beyond
// freeUnits an elementary comparison.
func TestHashCompareLegitimate(t *testing.T) {
	for _, src := range []string{
		"xs = [(i % 97, str(i)) for i in range(20000)]\nresult = sorted(xs)[:3] + sorted(xs, reverse=True)[:3]",
		"xs = list(range(200000))\nresult = [199999 in xs, -1 in xs, xs.index(150000)]",
		"d = {(i, i % 7, 'k'): i for i in range(20000)}\nresult = [d[(5, 5, 'k')], (7, 0, 'k') in d, len(set(d.keys()))]",
		"x = [[i, str(i)] for i in range(30000)]\ny = [[i, str(i)] for i in range(30000)]\nresult = [x == y, x < y, x != y]",
		"s = set([(i, 'a') for i in range(20000)])\nt = set([(i, 'a') for i in range(10000, 30000)])\nresult = [len(s | t), len(s & t), len(s - t), len(s ^ t), s >= t]",
		"rows = [{'id': i, 'tags': ['a', 'b']} for i in range(5000)]\nresult = [rows == [dict(r) for r in rows], max(rows, key=lambda r: r['id'])['id'], min([(r['id'], r['tags']) for r in rows])]",
	} {
		want, _, werr := runPlain(src)
		got, st, gerr := runGuarded(src, Limits{})
		if werr != nil || gerr != nil {
			t.Fatalf("%q: %v, plain %v", src, gerr, werr)
		}
		if g, w := got["result"].String(), want["result"].String(); g != w {
			t.Errorf("%q: %s, want %s", src, g, w)
		}
		t.Logf("%d steps, %d charged: %.40q", st.thread.Steps, st.charged, src)
	}
}

// TestOrdinaryComparisons: a contract that compares, looks up and sorts
// ordinary values on a real ledger returns what it did, charged nothing.
func TestOrdinaryComparisons(t *testing.T) {
	f := newFixtureLimits(t, openEngine(t), Limits{})
	src := `def invoke(ledger, args):
    seen = {}
    out = []
    for i in range(200):
        k = (i % 7, "abc"[i % 3])
        if k not in seen:
            seen[k] = i
        elif seen[k] < i and k in seen and seen.get(k) != None:
            out.append(k)
    v = ledger.get("nothing")
    tags = set([k[1] for k in seen])
    return {"n": len(out), "first": sorted(seen.keys())[0][0], "max": max(seen.values()), "tags": sorted(tags),
            "none": v == None, "eq": {"a": [1, 2]} == {"a": [1, 2]}, "lt": (1, "b") < (1, "c")}
`
	if err := f.register(f.hmac, "ordinary", src); err != nil {
		t.Fatal(err)
	}
	res := f.mustExec(f.hmac, "ordinary", `{}`)
	if want := `{"eq":true,"first":0,"lt":true,"max":20,"n":179,"none":true,"tags":["a","b","c"]}`; string(res.Result) != want {
		t.Fatalf("result %s, want %s", res.Result, want)
	}
}

// TestWorkRefusalNamesItself: the refusal says what it refused, through
// Starlark's error wrapping.
func TestWorkRefusalNamesItself(t *testing.T) {
	_, st, err := runGuarded(deep+"x = {t: 1}", Limits{})
	if !errors.Is(err, ErrStepLimit) || !strings.Contains(st.limitError("c", Limits{}).Error(), "dict or set key") {
		t.Fatalf("%v, want ErrStepLimit naming the key", err)
	}
	_, st, _ = runGuarded("x = 1", Limits{})
	if err := st.limitError("c", Limits{}); err != nil {
		t.Fatalf("a limit error without a limit: %v", err)
	}
}
