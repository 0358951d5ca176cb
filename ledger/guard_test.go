package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
)

// guardCases are programs that exercise every construct the rewrite
// touches (guard.go). Each assigns result, or fails.
var guardCases = []struct{ name, src string }{
	{"int ops", `x = 3; y = 4; result = [x + y, x - y, x * y, x // y, x % y, x | y, x & y, x ^ y, x << y, x >> 1, -x, ~x, +x, x / y, -3, 2 - -x]`},
	{"float ops", `x = 2.5; result = [x + 1, x * 2, x // 2, x % 2, -x, x - 1.5]`},
	{"big ints", `x = 1 << 100; result = [x * x, x + 1, x - 3, -x, ~x, x // 3, x % 7, x >> 50, x << 20, abs(-x), str(x), x | 5, x & (x - 1), x ^ 3, int("1" * 40)]`},
	{"strings", `s = "ab"; result = [s + "c", s * 3, 3 * s, 0 * s, s * -1, "%s-%d %r %o %x %c %%" % (s, 5, s, 8, 255, 65), "%(a)s" % {"a": 1}, "{}{}".format(s, 1),
		"{0!r}{0}{1}".format(s, [1]), "{a}".format(a=s), ",".join(["a", "b"]), s.replace("a", "xy"), "aaa".replace("a", "b", 2), "abc".replace("", "-"),
		"a b  c".split(), "a,b".split(","), "a,b,c".rsplit(",", 1), "a b c".split(None, 1), "a b c".rsplit(None, 1), "a\nb\n".splitlines(), "a\nb".splitlines(True),
		s.upper(), "Ab".lower(), "hello world".title(), s.capitalize(), "é".upper(), s[1:], s[::-1], s[::2], b"xy" + b"z", b"ab" * 2, "%s" % b"q"]`},
	{"lists", `xs = [1, 2]; ys = xs; xs += [3]; xs += (4,); xs.extend((5,)); xs += xs; zs = [0]; zs *= 2
result = [xs, ys, zs, xs[1:3], xs[::-1], xs * 2, xs + [9], list(range(3)), list("ab".elems()), sorted([3, 1, 2]), sorted(["b", "a"], key=lambda x: x, reverse=True),
	reversed(xs), enumerate(xs, 1), zip(xs, "abc".elems()), zip(), tuple(xs), tuple((1,)), xs[-1], xs[0], list(), bytes([65, 66]), bytes("x"), str(b"ab"), repr([1, "a"])]`},
	{"dicts", `d = {"a": 1}; e = d; d |= {"b": 2}; d |= d; k = "c"; d2 = {k: 3, "z": 0}; d.update(d2); d.update([("q", 1)], w=2)
result = [d, e, d | d2, d.items(), d.keys(), d.values(), dict(a=1), dict([("x", 1)]), dict({"m": 1}, n=2), d["a"], d[k], {k: 1}, {-1: 2, "x": 3}]`},
	{"sets", `s = set([1, 2]); t = set([2, 3]); u = set(); u.update([1], (2, 3))
result = [s | t, s & t, s - t, s ^ t, s.union([4], [5]), s.intersection([2]), s.difference([1]), s.symmetric_difference([5]), s.issubset([1, 2, 3]), s.issuperset([1]), u]`},
	{"augmented index", `a = [1, [2], {"x": 1}, 7, 8, 9, 10, 11]; a[0] += 5; a[1] += [3]; inner = a[1]; a[2] |= {"y": 2}; a[0] *= 2; a[0] -= 1; a[0] //= 2; a[3] %= 4; a[4] <<= 2; a[5] >>= 1
a[6] &= 3; a[7] ^= 1; a[-1] |= 16; d = {"k": "s"}; d["k"] += "t"; f = [3]; f[0] /= 2
result = [a, inner, d, f]`},
	{"augmented names", `x = 1; x <<= 3; x >>= 1; x |= 8; x &= 7; x ^= 1; x %= 5; x -= 1; x *= 3; x //= 2; x += 1; (x) += 1; y = 4; y /= 2
s = "a"; s += "b"; s *= 2; t = (1,); t += (2,); result = [x, y, s, t]`},
	{"calls", `def f(*args, **kw):
    return (args, sorted(kw.items()))
def g(a, b=[1] + [2], *c, d=3, **e):
    return [a, b, c, d, e]
result = [f(*[1, 2], **{"a": 3}), f(1, *(2,)), f(x=1), f(*range(3)), g(1), g(*[1, 2, 3], **dict(d=4, z=5))]`},
	{"methods as values", `j = ",".join; up = "a".upper; ks = {"a": 1}.keys; ext = [].extend
result = [j(["a", "b"]), up(), getattr("x,y", "split")(","), getattr("x", "upper")(), getattr([], "append"), getattr("x", "nope", 5), str(j), repr(",".join), type(j), ks(), ext([1])]`},
	{"folding", `x = 1; result = ["a" + "b" + "c", [1] + [2] + [y for y in range(3)], ("a",) + ("b",), "x" + str(x) + "y" + "z", b"a" + b"b", "a" + ("b" + "c"), (("p") + "q") + "r", [x] + [x] + [x]]`},
	{"functions", `def g():
    n = 0
    for i in range(10):
        n += i
        n -= 1
        n *= 1
    return n
def h():
    acc = []
    def add(v):
        acc.append(v * 2)
    for v in range(3):
        add(v)
    return acc
result = [g(), h()]`},
	{"slices", `xs = list(range(10)); result = [xs[2:8:3], xs[-3:], xs[:-3], xs[8:2:-2], xs[::], xs[100:], xs[:-100], xs[::-3], xs[-100::-1], "abcdef"[1:5:2], (1, 2, 3)[1:], (1, 2, 3)[::-1], range(10)[2:5], b"abc"[::-1]]`},
	{"comprehensions", `result = [{k: v * 2 for k, v in {"a": 1}.items()}, [x * x for x in range(5) if x % 2], [x + y for x in range(3) for y in range(2)], {str(x): [x] * 2 for x in range(3)}]`},
	{"targets", `a = [0, 0]; d = {}
for a[0] in range(3):
    d["k" + str(a[0])] = a[0] * 2
p, q = 1, 2; [r, s] = [3, 4]; (u, (v, w)) = (5, (6, 7))
result = [a, d, p, q, r, s, u, v, w]`},
	{"while", `n = 0
while n < 100:
    n += 1
result = n`},
	{"lambda", `f = lambda x, y=[1] + [2]: x * 2 + len(y); result = [f(3), (lambda: "a" * 3)()]`},
	{"conditional", `x = 5; result = (x * 2 if x > 3 else x - 1, x % 2 == 1 and "odd" + "!" or "even")`},
	{"print and str", `print("a" * 10, [1] * 3); result = [str(1), str("a"), str([1, "b", (2,)]), repr("q\n\"é\x01"), str({"a": [None, True]}), str(set([1])), str(1.5), str(range(3))]`},
	{"top-level augmented before its binding", `for i in range(3):
    if i > 0:
        A += 1
        B *= 2
    else:
        A = 10
        B = 3
result = [A, B]`},
	{"top-level augmented shadowing", `n = len([1, 2])
def f():
    return len
result = [n, f()]
len = 5
len += 1`},
	// Failures: the same message either way.
	{"+= during iteration", `xs = [1]
for x in xs:
    xs += [2]`},
	{"|= during iteration", `d = {"a": 1}
for k in d:
    d |= {}`},
	{"|= of itself during iteration", `d = {"a": 1}
for k in d:
    d |= d`},
	{"top-level augmented of unassigned", `len += 1`},
	{"top-level augmented of unassigned, unrun", `if len([]) > 0:
    zz += 1
result = 1`},
	{"missing key", `d = {}; k = (1, 2); result = d[k]`},
	{"bad add", `result = "a" + 1`},
	{"index out of range", `result = [1][5]`},
	{"augmented index out of range", `x = [1]; x[5] += 1`},
	{"augmented missing key", `x = {}; x["a"] += 1`},
	{"duplicate key", `k = "a"; result = {k: 1, k: 2}`},
	{"division by zero", `result = 1 // 0`},
	{"bad format", `result = "%d" % "x"`},
	{"short format", `result = "{} {}".format(1)`},
	{"zero step", `result = [1, 2][::0]`},
	{"join of int", `result = "abc".join(1)`},
	{"join of ints", `result = "a".join([1])`},
	{"no such method", `result = "s".nosuch()`},
	{"no guarded method", `result = (1).join([])`},
	{"attr of int", `result = (1).upper`},
	{"frozen list", `result = list.extend`},
	{"bad slice index", `result = [1, 2]["a":]`},
	{"shift too large", `result = 1 << 600`},
	{"negative repeat count", `result = [1] * -2`},
	{"too many args", `result = "a".upper(1)`},
	{"unhashable", `result = {[]: 1}`},
	{"star of int", `def f(*a): return a
result = f(*1)`},
	{"kwargs of list", `def f(**a): return a
result = f(**[])`},
}

// plainPredeclared is what a contract saw before the rewrite.
var plainPredeclared = starlark.StringDict{}

func runPlain(src string) (starlark.StringDict, uint64, error) {
	_, prog, err := starlark.SourceProgramOptions(fileOptions, "t.star", src, plainPredeclared.Has)
	if err != nil {
		return nil, 0, err
	}
	th := &starlark.Thread{Print: func(*starlark.Thread, string) {}}
	g, err := prog.Init(th, plainPredeclared)
	return g, th.Steps, err
}

func runGuarded(src string, lim Limits) (starlark.StringDict, *starThread, error) {
	f, err := fileOptions.Parse("t.star", src, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := rewriteContract(f); err != nil {
		return nil, nil, err
	}
	prog, err := starlark.FileProgram(f, predeclared.Has)
	if err != nil {
		return nil, nil, err
	}
	st, stop := newStarThread(context.Background(), lim.withDefaults())
	defer stop()
	g, err := prog.Init(st.thread, predeclared)
	return g, st, err
}

func evalMsg(err error) string {
	if err == nil {
		return "<nil>"
	}
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		return ee.Msg
	}
	return err.Error()
}

// TestRewriteKeepsMeaning: every program gives the same result, or fails
// with the same message, and takes the same number of steps (a failing one
// at most a few more), with and without the rewrite.
func TestRewriteKeepsMeaning(t *testing.T) {
	for _, c := range guardCases {
		t.Run(c.name, func(t *testing.T) {
			want, wantSteps, werr := runPlain(c.src)
			got, st, gerr := runGuarded(c.src, Limits{MaxSteps: 1 << 40})
			if evalMsg(werr) != evalMsg(gerr) {
				t.Fatalf("error %q, want %q", evalMsg(gerr), evalMsg(werr))
			}
			if werr == nil {
				if g, w := got["result"].String(), want["result"].String(); g != w {
					t.Fatalf("result\n%s\nwant\n%s", g, w)
				}
			}
			// A failure can come a few steps later: a guard evaluates its
			// operands before it finds, say, a missing key that the
			// interpreter found before evaluating the rest, and the steps
			// of a binding put before a top-level v op= y are given back
			// by that statement's guard, which a failure can preempt.
			if got := st.thread.Steps; got != wantSteps && (werr == nil || got > wantSteps+5 || got < wantSteps) {
				t.Errorf("%d steps, want %d", got, wantSteps)
			}
		})
	}
}

func TestReservedNames(t *testing.T) {
	for _, src := range []string{
		"__kiroku_plus = 1\ndef invoke(ledger, args):\n    return 1 + 2\n",
		"def invoke(ledger, args):\n    return __kiroku_none\n",
		"def __kiroku_x(ledger, args):\n    return 1\ninvoke = __kiroku_x\n",
	} {
		if _, err := compileStarlark(context.Background(), "c", []byte(src), Limits{}.withDefaults()); !errors.Is(err, ErrBadContract) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("%q: %v, want ErrBadContract for a reserved name", src, err)
		}
	}
}

// BenchmarkGuards runs a contract-like loop (arithmetic, indexing, dict
// literals, str, slices, join) as the interpreter would without the
// rewrite and with it: the cost of the guards.
func BenchmarkGuards(b *testing.B) {
	const src = `
def work(n):
    total = 0
    xs = []
    for i in range(n):
        row = {"id": i, "v": i * 2}
        total += row["v"] + i % 7
        xs.append(str(i))
        if i % 10 == 0:
            s = ",".join(xs[-5:])
    return total
result = work(1000)
`
	b.Run("plain", func(b *testing.B) {
		_, prog, err := starlark.SourceProgramOptions(fileOptions, "b.star", src, plainPredeclared.Has)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := prog.Init(&starlark.Thread{}, plainPredeclared); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		f, err := fileOptions.Parse("b.star", src, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := rewriteContract(f); err != nil {
			b.Fatal(err)
		}
		prog, err := starlark.FileProgram(f, predeclared.Has)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			st, stop := newStarThread(context.Background(), Limits{}.withDefaults())
			if _, err := prog.Init(st.thread, predeclared); err != nil {
				b.Fatal(err)
			}
			stop()
		}
	})
}

// FuzzRewriteKeepsMeaning: for any program, the rewritten one does what
// the interpreter did with the original — the same result or error
// message and the same steps — unless it runs out of its (small) memory
// budget, in which case the original is not run: it could take gigabytes.
func FuzzRewriteKeepsMeaning(f *testing.F) {
	for _, c := range guardCases {
		f.Add(c.src)
	}
	lim := Limits{MaxSteps: 20_000, MaxMemoryBytes: 1 << 20, MaxExecutionTime: 2 * time.Second}
	f.Fuzz(func(t *testing.T, src string) {
		got, st, gerr := runGuarded(src, lim)
		_, prog, err := starlark.SourceProgramOptions(fileOptions, "t.star", src, plainPredeclared.Has)
		if st == nil { // not compiled
			if err == nil && !strings.Contains(src, guardPrefix) {
				t.Fatalf("compiles only as it is: %v", gerr)
			}
			return
		}
		if err != nil {
			// The one program the rewrite accepts and the resolver did
			// not: the first top-level v op= y whose y uses v, which
			// now reads the global v (unassigned: a run-time error)
			// where it was undefined.
			if strings.Contains(err.Error(), "undefined: ") {
				return
			}
			t.Fatalf("compiles only rewritten: %v", err)
		}
		if gerr != nil && (st.mem.refused != "" || st.outOfGas || errors.Is(gerr, ErrMemoryLimit) || strings.Contains(gerr.Error(), "cancelled")) {
			return // stopped by a limit the original lacks
		}
		th := &starlark.Thread{Print: func(*starlark.Thread, string) {}}
		th.SetMaxExecutionSteps(lim.MaxSteps)
		var want starlark.StringDict
		werr := safely(func() (err error) {
			want, err = prog.Init(th, plainPredeclared)
			return err
		})
		if werr != nil && strings.HasPrefix(werr.Error(), "the interpreter failed") {
			// The interpreter panics on some calls the guards refuse.
			if gerr == nil {
				t.Fatalf("the interpreter panics (%v) where the rewritten program does not", werr)
			}
			return
		}
		if evalMsg(werr) != evalMsg(gerr) {
			t.Fatalf("error %q, want %q", evalMsg(gerr), evalMsg(werr))
		}
		if werr == nil {
			for name, v := range want {
				if g := got[name]; g == nil || g.String() != v.String() {
					t.Fatalf("%s = %v, want %v", name, g, v)
				}
			}
			if st.thread.Steps != th.Steps {
				t.Fatalf("%d steps, want %d", st.thread.Steps, th.Steps)
			}
		}
	})
}

// TestRewriteFrozen: operations on frozen values (a contract's globals,
// once its top level ran) fail as they did.
func TestRewriteFrozen(t *testing.T) {
	const src = `G = [1]
D = {"a": 1}
def add():
    x = G
    x += [2]
def pipe():
    d = D
    d |= {"b": 2}
def pipe_empty():
    d = D
    d |= {}
def item():
    x = [G]
    x[0] += [3]
`
	for _, fn := range []string{"add", "pipe", "pipe_empty", "item"} {
		want, _, err := runPlain(src)
		if err != nil {
			t.Fatal(err)
		}
		want.Freeze()
		_, werr := starlark.Call(&starlark.Thread{}, want[fn], nil, nil)
		got, st, err := runGuarded(src, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		got.Freeze()
		_, gerr := starlark.Call(st.thread, got[fn], nil, nil)
		if werr == nil || evalMsg(gerr) != evalMsg(werr) {
			t.Errorf("%s: error %q, want %q", fn, evalMsg(gerr), evalMsg(werr))
		}
	}
}

func TestSafely(t *testing.T) {
	if err := safely(func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("a panic came back as %v", err)
	}
}
