package ledger

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// allocated returns the bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// contract makes a contract source whose invoke first puts asset s and
// then runs body.
func contract(body string) string {
	return "def invoke(ledger, args):\n    ledger.put('s', 1)\n" + indent(body) + "    return 0\n"
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

// hangAfter is how long checkRefused waits for an execution that should
// be refused promptly before it calls it stuck: one interpreter step
// running on, which neither the time limit nor a budget stops.
const hangAfter = 30 * time.Second

// checkRefused runs contract id, which must fail with want, allocating at
// most maxAlloc bytes meanwhile, record its abort and write nothing. It
// reports false if the execution was still running after hangAfter (and
// fails the test): it is left running, nothing can stop it.
func (f *fixture) checkRefused(id string, want error, maxAlloc uint64) bool {
	f.t.Helper()
	ctx := context.Background()
	req := f.request(f.hmac, id, `{}`)
	var err error
	hung := false
	took := time.Now()
	n := allocated(func() {
		done := make(chan error, 1)
		go func() {
			_, err := f.l.Execute(ctx, req)
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(hangAfter):
			hung = true
		}
	})
	if hung {
		f.t.Errorf("%s: still running after %v", id, hangAfter)
		return false
	}
	if !errors.Is(err, want) {
		f.t.Fatalf("%s: %v, want %v", id, err, want)
	}
	f.t.Logf("%s: refused after %v, %d MiB allocated: %v", id, time.Since(took).Round(time.Millisecond), n>>20, err)
	if n > maxAlloc {
		f.t.Errorf("%s: the process allocated %d MiB while it ran, want at most %d MiB", id, n>>20, maxAlloc>>20)
	}
	if latest, err := f.l.Latest(ctx, "s"); err != nil || latest != -1 {
		f.t.Errorf("%s: asset s at age %d (%v): something was written", id, latest, err)
	}
	st, err := f.l.TxState(ctx, req.Nonce)
	if err != nil || st.Status != TxAborted || st.Kind != Kind(want) {
		f.t.Errorf("%s: state %+v (%v), want aborted with kind %s", id, st, err, Kind(want))
	}
	return true
}

// TestMemoryLimit: the audit's cases, each of which allocated gigabytes
// (or took the server down) before the memory budget, fail with
// ErrMemoryLimit having allocated no more than about the budget, write
// nothing and record the abort.
func TestMemoryLimit(t *testing.T) {
	f := newFixtureLimits(t, openEngine(t), Limits{}) // the defaults: 64 MiB
	const within = 256 << 20                          // well under every naive size
	cases := []struct{ name, body string }{
		{"list repeat", `x = [0] * 100000000`},                                           // 1.6 GB
		{"string repeat", `x = 'x' * 500000000`},                                         // 500 MB
		{"append repeats", "xs = []\nfor i in range(8):\n    xs.append([i] * 60000000)"}, // 8 × 960 MB
		{"doubling by +", "s = 'x'\nfor i in range(64):\n    s = s + s"},
		{"doubling by +=", "s = ['x']\nfor i in range(64):\n    s += s"},
		{"doubling by *=", "s = 'ab'\nfor i in range(64):\n    s *= 2"},
		{"list of range", `x = list(range(100000000))`},                               // 1.6 GB
		{"str of shared references", "s = 'x' * 1000000\nl = [s] * 1000\nt = str(l)"}, // 1 GB
		{"repr of nested sharing", "t = ('x' * 1000,)\nfor i in range(40):\n    t = (t, t)\nr = repr(t)"},
		{"% doubling", "s = 'x'\nfor i in range(64):\n    s = '%s%s' % (s, s)"},
		{"format doubling", "s = 'x'\nfor i in range(64):\n    s = '{}{}'.format(s, s)"},
		{"replace", "s = 'a' * 20000\nt = s.replace('a', s)"},   // 400 MB
		{"join", "s = 'x' * 1000000\nt = ','.join([s] * 1000)"}, // 1 GB
		{"split", "s = ',' * 20000000\nt = s.split(',')"},       // 20M pieces: ~1 GB
		{"sorted", "x = sorted(range(100000000))"},              //
		// (A tuple key holding many references to one long string, whose
		// text is as long, is refused before it is hashed: TestHashCompareLimit.)
		{"long dict key", "s = 'k' * 30000000\nd = {}\nd[s]"}, // the KeyError message: 30 MB
		{"duplicate dict-literal keys", "s = 'k' * 40000000\nd = {s: 1, s: 2}"},
		{"big int squaring", "x = 3\nfor i in range(40):\n    x = x * x"},
		{"put of shared references", "s = 'x' * 1000000\nledger.put('t', [s] * 1000)"},
		{"call argument of shared references", "s = 'x' * 1000000\nledger.call('sink', [s] * 1000)"},
		{"nested calls share the budget", "x = 'x' * 40000000\nledger.call('alloc40', {})"},
		{"*args of a range", "def f(*a):\n    return len(a)\nf(*range(100000000))"},
		{"set of a range", `x = set(range(100000000))`},
		{"enumerate of a range", `x = enumerate(range(100000000))`},
		{"dict items kept", "d = {i: i for i in range(50000)}\nxs = []\nfor i in range(1000):\n    xs.append(d.items())"},
		{"slices kept", "l = list(range(100000))\nxs = []\nfor i in range(1000):\n    xs.append(l[1:])"},
	}
	for _, id := range []string{"sink", "alloc40"} {
		src := "def invoke(ledger, args):\n    return len(args)\n"
		if id == "alloc40" {
			src = "def invoke(ledger, args):\n    y = 'y' * 40000000\n    return 1\n"
		}
		if err := f.register(f.hmac, id, src); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			id := fmt.Sprintf("mem%d", i)
			if err := f.register(f.hmac, id, contract(c.body)); err != nil {
				t.Fatal(err)
			}
			want := ErrMemoryLimit
			switch c.name {
			case "put of shared references":
				want = ErrTooLarge // the value could not be stored anyway
			case "long dict key":
				want = ErrContractFailed // the key error, its message short
			}
			f.checkRefused(id, want, within)
		})
	}
}

// TestTimeLimit: a contract that runs within its step and memory budgets
// stops at the server's time limit, whatever the client's deadline, and
// fails with ErrTimeLimit, writing nothing.
func TestTimeLimit(t *testing.T) {
	t.Run("scans", func(t *testing.T) {
		// Each step searches a 50 MB string: within the default budget,
		// and a million steps would take an hour.
		f := newFixtureLimits(t, openEngine(t), Limits{MaxExecutionTime: 300 * time.Millisecond})
		body := "s = 'x' * 50000000\nn = 0\nwhile True:\n    n += s.find('y')"
		if err := f.register(f.hmac, "scan", contract(body)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		f.checkRefused("scan", ErrTimeLimit, 256<<20)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("stopped after %v, want about 300 ms", took)
		}
	})
	t.Run("100 MB copy per step", func(t *testing.T) {
		// The audit's case: with a memory budget large enough to let it
		// copy 100 MB a step, the time limit still stops it.
		f := newFixtureLimits(t, openEngine(t), Limits{MaxExecutionTime: 500 * time.Millisecond, MaxMemoryBytes: 1 << 50, MaxTotalMemoryBytes: 1 << 50})
		body := "s = 'x' * 100000000\nwhile True:\n    t = s + 'y'"
		if err := f.register(f.hmac, "copy", contract(body)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		req := f.request(f.hmac, "copy", `{}`)
		if _, err := f.l.Execute(context.Background(), req); !errors.Is(err, ErrTimeLimit) {
			t.Fatalf("%v, want ErrTimeLimit", err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("stopped after %v, want about 500 ms", took)
		}
		if latest, _ := f.l.Latest(context.Background(), "s"); latest != -1 {
			t.Errorf("asset s written")
		}
		if st, _ := f.l.TxState(context.Background(), req.Nonce); st.Status != TxAborted || st.Kind != "time_limit" {
			t.Errorf("state %+v, want aborted with kind time_limit", st)
		}
	})
}

// TestLegitimateWork: contracts that allocate in moderation, in every way
// the guards watch, run as before.
func TestLegitimateWork(t *testing.T) {
	f := newFixtureLimits(t, openEngine(t), Limits{})
	src := `def invoke(ledger, args):
    rows = []
    for i in range(2000):
        rows.append({"id": "r" + str(i), "n": i * 3, "tags": ["a", "b"] + [str(i % 7)]})
    text = ",".join([r["id"] for r in rows])
    parts = text.split(",")
    table = {r["id"]: r for r in rows}
    total = 0
    for p in parts[:100]:
        total += table[p]["n"]
    s = "%s:%d" % ("total", total)
    t = "{}-{}".format(s, len(str(rows[:10])))
    ledger.put("out", {"s": s, "t": t, "upper": t.upper(), "keys": sorted(table.keys())[:5], "set": len(set(parts))})
    return {"total": total}
`
	if err := f.register(f.hmac, "work", src); err != nil {
		t.Fatal(err)
	}
	res := f.mustExec(f.hmac, "work", `{}`)
	if string(res.Result) != `{"total":14850}` {
		t.Fatalf("result %s", res.Result)
	}
}

// TestServerWideBound: more executions than the gate allows at once wait
// for one another; none runs beside more than the bound; a request that
// finds no room within MaxExecutionTime fails with ErrOverloaded, records
// nothing and can be sent again; built-in contracts are not bounded.
func TestServerWideBound(t *testing.T) {
	// 16 MiB budgets from 32 MiB: two at once.
	lim := Limits{MaxMemoryBytes: 16 << 20, MaxTotalMemoryBytes: 32 << 20, MaxExecutionTime: 30 * time.Second}
	f := newFixtureLimits(t, openEngine(t), lim)
	if got := cap(f.l.gate.slots); got != 2 {
		t.Fatalf("gate of %d slots, want 2", got)
	}
	src := "def invoke(ledger, args):\n    x = 'x' * 8000000\n    n = 0\n    for i in range(50000):\n        n += i\n    ledger.put(args['id'], n)\n    return n\n"
	if err := f.register(f.hmac, "busy", src); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		req := f.request(f.hmac, "busy", fmt.Sprintf(`{"id":"b%d"}`, i))
		wg.Go(func() {
			_, err := f.l.Execute(context.Background(), req)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if p := f.l.gate.peak.Load(); p > 2 || p < 1 {
		t.Fatalf("%d executions ran at once, want at most 2", p)
	}
	t.Logf("at most %d at once", f.l.gate.peak.Load())

	// With every slot taken, a request waits MaxExecutionTime, then fails.
	f2 := newFixtureLimits(t, openEngine(t), Limits{MaxConcurrentExecutions: 1, MaxExecutionTime: 100 * time.Millisecond})
	if err := f2.register(f2.hmac, "busy", "def invoke(ledger, args):\n    ledger.put(args['id'], 1)\n"); err != nil {
		t.Fatal(err)
	}
	leave, err := f2.l.gate.enter(context.Background(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	req := f2.request(f2.hmac, "busy", `{"id":"o"}`)
	if _, err := f2.l.Execute(context.Background(), req); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("%v, want ErrOverloaded", err)
	}
	if st, err := f2.l.TxState(context.Background(), req.Nonce); err != nil || st.Status != TxUnknown {
		t.Fatalf("state %+v (%v), want nothing recorded", st, err)
	}
	if latest, _ := f2.l.Latest(context.Background(), "o"); latest != -1 {
		t.Fatal("asset o written")
	}
	// A client deadline shorter than the wait ends it first, as its own.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	_, err = f2.l.Execute(ctx, req)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || Kind(err) != "" {
		t.Fatalf("%v, want the context's deadline", err)
	}
	// Built-in contracts do not take a slot.
	if _, err := f2.exec(f2.hmac, "builtin.ycsb_c", `{"ids":["o"]}`); err != nil {
		t.Fatalf("a built-in contract beside a full gate: %v", err)
	}
	leave()
	if _, err := f2.l.Execute(context.Background(), req); err != nil {
		t.Fatalf("the same request once there is room: %v", err)
	}
}

func TestLimitsCheck(t *testing.T) {
	if err := (Limits{MaxMemoryBytes: 2 << 30, MaxTotalMemoryBytes: 1 << 30}).withDefaults().check(); err == nil {
		t.Fatal("a total below one budget accepted")
	}
	if got := gateSlots(Limits{}.withDefaults()); got != 16 {
		t.Fatalf("%d slots by default, want 16 (1 GiB / 64 MiB)", got)
	}
}

// TestPerStepAllocation: what the guards do not charge is bounded per
// step. Contracts that keep something new at every step they can, until
// the step limit (or the budget) stops them, allocate in all at most the
// budget plus a few dozen bytes a step.
func TestPerStepAllocation(t *testing.T) {
	f := newFixtureLimits(t, openEngine(t), Limits{})
	const steps, budget, perStep = 1_000_000, 64 << 20, 32
	for i, body := range []string{
		"xs = []\nfor i in range(1000000):\n    xs.append({})",
		"xs = [set() for i in range(1000000)]",
		"xs = [[] for i in range(1000000)]",
		"xs = [(i, i) for i in range(1000000)]",
		"xs = [lambda: 0 for i in range(1000000)]",
		"xs = ['x'.find for i in range(1000000)]",
		"d = {}\nfor i in range(1000000):\n    d[i] = i",
		"xs = [str(i) for i in range(1000000)]",
		"xs = [i * 1000000000000 for i in range(1000000)]",
		"xs = [[i] for i in range(1000000)]",
	} {
		id := fmt.Sprintf("step%d", i)
		if err := f.register(f.hmac, id, contract(body)); err != nil {
			t.Fatal(err)
		}
		var err error
		n := allocated(func() { _, err = f.l.Execute(context.Background(), f.request(f.hmac, id, `{}`)) })
		if !errors.Is(err, ErrStepLimit) && !errors.Is(err, ErrMemoryLimit) {
			t.Fatalf("%q: %v, want the step or memory limit", body, err)
		}
		t.Logf("%q: %d MiB, %v", body, n>>20, Kind(err))
		if n > budget+steps*perStep {
			t.Errorf("%q: %d MiB allocated, want at most %d MiB", body, n>>20, (budget+steps*perStep)>>20)
		}
	}
}

// TestTopLevelLimits: a contract's top level, run when it registers, is
// held to the same memory and time limits; the registration fails with
// ErrBadContract and says which.
func TestTopLevelLimits(t *testing.T) {
	f := newFixtureLimits(t, openEngine(t), Limits{MaxExecutionTime: 300 * time.Millisecond})
	for _, c := range []struct{ src, why string }{
		{"x = 'x' * 500000000\ndef invoke(ledger, args):\n    return 1\n", "memory limit"},
		{"s = 'x' * 50000000\nwhile True:\n    s.find('y')\n", "time limit"},
	} {
		var err error
		n := allocated(func() { err = f.register(f.hmac, "top", c.src) })
		if !errors.Is(err, ErrBadContract) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%q: %v, want ErrBadContract for its %s", c.src, err, c.why)
		}
		if n > 256<<20 {
			t.Errorf("%q: %d MiB allocated", c.src, n>>20)
		}
	}
}

// TestInterpreterPanics: set methods the interpreter panics on when called
// without their argument — which took the whole server down — fail the
// contract instead.
func TestInterpreterPanics(t *testing.T) {
	f := newFixture(t, openEngine(t))
	for i, call := range []string{"s.intersection()", "s.difference()", "s.issubset()", "s.issuperset()",
		"s.symmetric_difference()", "getattr(s, 'intersection')()", "[s.difference][0]()"} {
		id := fmt.Sprintf("p%d", i)
		if err := f.register(f.hmac, id, contract("s = set([1])\nx = "+call)); err != nil {
			t.Fatal(err)
		}
		f.checkRefused(id, ErrContractFailed, 64<<20)
	}
}

// Values that hash or compare in exponential time without allocating:
// deep is a tuple of 2^40 nodes (each level holds the one below twice),
// whose hash visits every one of them; wide and wider are equal, distinct
// tuples of 32^8 leaves nested within the interpreter's comparison depth
// limit, whose comparison visits every one.
const (
	deep = "t = (1, 1)\nfor i in range(40):\n    t = (t, t)\n"
	wide = "w = (1,) * 32\nv = (1,) * 32\nfor i in range(7):\n    w = (w,) * 32\n    v = (v,) * 32\n"
)

// hashCompareCases are the ways of hashing or comparing such a value:
// every kind of site the guards cover (guard.go).
var hashCompareCases = []struct{ name, body string }{
	{"dict literal key", deep + "d = {t: 1}"},
	{"dict literal keys", deep + "d = {t: 1, 2: 3}"},
	{"dict comprehension key", deep + "d = {k: 1 for k in [t]}"},
	{"stored key", deep + "d = {}\nd[t] = 1"},
	{"stored key in a loop target", deep + "d = {}\nfor d[t] in [1]:\n    pass"},
	{"looked-up key", deep + "d = {1: 2}\nx = d[t]"},
	{"augmented key", deep + "d = {1: 2}\nd[t] += 1"},
	{"in dict", deep + "d = {1: 2}\nx = t in d"},
	{"not in set", deep + "s = set([1])\nx = t not in s"},
	{"set()", deep + "s = set([t])"},
	{"dict()", deep + "d = dict([(t, 1)])"},
	{"dict.get", deep + "x = {1: 2}.get(t)"},
	{"dict.pop", deep + "x = {1: 2}.pop(t, 0)"},
	{"dict.setdefault", deep + "x = {1: 2}.setdefault(t)"},
	{"dict.update", deep + "d = {1: 2}\nd.update([(t, 1)])"},
	{"getattr(dict, 'get')", deep + "x = getattr({1: 2}, 'get')(t)"},
	{"set.add", deep + "s = set([1])\ns.add(t)"},
	{"set.discard", deep + "s = set([1])\ns.discard(t)"},
	{"set.remove", deep + "s = set([1])\ns.remove(t)"},
	{"set.union", deep + "s = set([1]).union([t])"},
	{"set.issuperset", deep + "x = set([1]).issuperset([t])"},
	{"tuple of shared strings as a key", "s = 'k' * 1000000\nd = {1: 2}\nx = (s,) * 1000 in d"}, // hashes 1 GB
	{"==", wide + "x = w == v"},
	{"!=", wide + "x = w != v"},
	{"<", wide + "x = w < v"},
	{"<=", wide + "x = w <= v"},
	{">", wide + "x = w > v"},
	{">=", wide + "x = w >= v"},
	{"== in a condition", wide + "if w == v:\n    pass"},
	{"lists", wide + "x = [w] == [v]"},
	{"dict values", wide + "x = {1: w} == {1: v}"},
	{"in list", wide + "x = w in [v]"},
	{"not in tuple", wide + "x = w not in (v,)"},
	{"not in as a condition", wide + "if w not in [v]:\n    pass"},
	{"list.index", wide + "x = [v].index(w)"},
	{"list.remove", wide + "l = [v]\nl.remove(w)"},
	{"sorted", wide + "x = sorted([w, v])"},
	{"sorted by key", wide + "x = sorted([1, 2], key=lambda i: w if i == 1 else v)"},
	{"max", wide + "x = max(w, v)"},
	{"min", wide + "x = min([w, v])"},
	{"min by key", wide + "x = min([1, 2], key=lambda i: [w, v][i - 1])"},
	// Names that usually hold constants or return numbers, rebound.
	{"None rebound", wide + "None = w\nx = v == None"},
	{"True as a parameter", wide + "def f(True):\n    return True == v\nx = f(w)"},
	{"len rebound", wide + "len = lambda x: w\nx = len(1) == v"},
	{"len rebound in a function", wide + "def f(len):\n    return len(1) in [v]\nx = f(lambda x: w)"},
}

// TestHashCompareLimit: hashing or comparing a value whose expanded size
// (shared parts counted each time they are reached) is exponential in its
// memory, which ran for hours within one step, whatever the time limit, is
// refused at once with ErrStepLimit — well before a short time limit,
// which could not have stopped it — writes nothing and records the abort;
// the same at the top level of a contract being registered.
func TestHashCompareLimit(t *testing.T) {
	f := newFixtureLimits(t, openEngine(t), Limits{MaxExecutionTime: 500 * time.Millisecond})
	for i, c := range hashCompareCases {
		hung := false
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			id := fmt.Sprintf("hc%d", i)
			if err := f.register(f.hmac, id, contract(c.body)); err != nil {
				t.Fatal(err)
			}
			hung = !f.checkRefused(id, ErrStepLimit, 64<<20)
		})
		if hung {
			// Its execution is still running: the rest would only add
			// to it.
			t.Fatalf("stopped at %s", c.name)
		}
	}
	t.Run("top level", func(t *testing.T) {
		for _, top := range []string{deep + "d = {t: 1}\n", wide + "x = w == v\n"} {
			done := make(chan error, 1)
			go func() { done <- f.register(f.hmac, "top", top+"def invoke(ledger, args):\n    return 1\n") }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrBadContract) || !strings.Contains(err.Error(), "step limit") {
					t.Errorf("%v, want ErrBadContract for the step limit", err)
				}
			case <-time.After(hangAfter):
				t.Fatalf("registration still compiling after %v", hangAfter)
			}
		}
	})
}
