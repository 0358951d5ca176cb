package ledger

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTopLevelWithinDefaults: a contract's top level runs within the
// default memory and time limits even where the ledger's are larger, so
// that CompileContract, which assumes the defaults, compiles every
// contract the ledger accepts, to the same globals; a top level that runs
// out of time says so (ErrTimeLimit), which Replay does not take for a
// divergence.
func TestTopLevelWithinDefaults(t *testing.T) {
	big := Limits{MaxMemoryBytes: 256 << 20, MaxTotalMemoryBytes: 1 << 30, MaxExecutionTime: 30 * time.Second}
	f := newFixtureLimits(t, openEngine(t), big)
	for i, top := range []string{
		"x = 'x' * 30000000\n",  // 30 MB: within the default 64 MiB
		"x = 'x' * 100000000\n", // 100 MB: within 256 MiB, not the default
		// Comparisons of 1.8M and 6.1M units: within the work bound of
		// 256 MiB (16M units), the second not within the default's (4M).
		"t = (1,) * 60\nx = [t] * 30000\ny = x == list(x)\n",
		"t = (1,) * 60\nx = [t] * 100000\ny = x == list(x)\n",
	} {
		src := top + "def invoke(ledger, args):\n    return len(x)\n"
		id := "top" + string(rune('a'+i))
		regErr := f.register(f.hmac, id, src)
		_, valErr := CompileContract(id, []byte(src))
		t.Logf("%q: ledger %v, validator %v", top, regErr, valErr)
		if regErr == nil && valErr != nil {
			t.Errorf("%q: the ledger accepted it, CompileContract refuses it: %v", top, valErr)
		}
	}
	if got := topLevelLimits(big); got.MaxMemoryBytes != 64<<20 || got.MaxExecutionTime != 10*time.Second || got.MaxSteps != topLevelSteps {
		t.Errorf("top-level limits %+v", got)
	}
	small := Limits{MaxMemoryBytes: 1 << 20, MaxExecutionTime: time.Second}
	if got := topLevelLimits(small); got.MaxMemoryBytes != 1<<20 || got.MaxExecutionTime != time.Second {
		t.Errorf("top-level limits %+v, want the smaller ones", got)
	}
	_, err := compileStarlark(context.Background(), "slow", []byte("s = 'x' * 50000000\nwhile True:\n    s.find('y')\n"), Limits{MaxExecutionTime: 50 * time.Millisecond})
	if !errors.Is(err, ErrBadContract) || !errors.Is(err, ErrTimeLimit) || Kind(err) != "bad_contract" {
		t.Errorf("a top level out of time: %v (kind %q), want ErrBadContract and ErrTimeLimit, kind bad_contract", err, Kind(err))
	}
}

// TestPreparedContract: a contract prepared (prepareStarlark), as a stored
// contract loaded by an execution is to be, runs its top level at its
// first call, within the gate like a registration's compile — in the
// execution's own slot for its first contract, in a second one for a
// nested call — and only once; a top level that fails, fails the
// execution with ErrBadContract, every time.
func TestPreparedContract(t *testing.T) {
	const top = "T = {str(i): i for i in range(100)}\n"
	prepared := func(t *testing.T, f *fixture, id, src string) *starContract {
		t.Helper()
		if err := f.register(f.hmac, id, src); err != nil {
			t.Fatal(err)
		}
		c, err := prepareStarlark(id, []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		f.l.contracts.Store(id, c) // what the load of a stored contract would cache
		return c
	}
	t.Run("first call", func(t *testing.T) {
		f := newFixtureLimits(t, openEngine(t), Limits{MaxConcurrentExecutions: 1, MaxExecutionTime: 200 * time.Millisecond})
		c := prepared(t, f, "lazy", top+"def invoke(ledger, args):\n    ledger.put('a', T['7'])\n    return len(T)\n")
		leave, err := f.l.gate.enter(context.Background(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		req := f.request(f.hmac, "lazy", `{}`)
		if _, err := f.l.Execute(context.Background(), req); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("%v, want ErrOverloaded", err)
		}
		if c.fn.Load() != nil {
			t.Fatal("the top level ran outside the gate")
		}
		leave()
		for range 3 {
			if res := f.mustExec(f.hmac, "lazy", `{}`); string(res.Result) != "100" {
				t.Fatalf("result %s", res.Result)
			}
		}
		if f.l.gate.peak.Load() != 1 {
			t.Fatalf("%d slots taken at once, want 1", f.l.gate.peak.Load())
		}
	})
	t.Run("nested call", func(t *testing.T) {
		f := newFixtureLimits(t, openEngine(t), Limits{MaxConcurrentExecutions: 1, MaxExecutionTime: 300 * time.Millisecond})
		if err := f.register(f.hmac, "outer", "def invoke(ledger, args):\n    return ledger.call('inner', {})\n"); err != nil {
			t.Fatal(err)
		}
		c := prepared(t, f, "inner", top+"def invoke(ledger, args):\n    return T['9']\n")
		// One slot, the outer execution's: no room for the top level.
		req := f.request(f.hmac, "outer", `{}`)
		start := time.Now()
		if _, err := f.l.Execute(context.Background(), req); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("%v, want ErrOverloaded", err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("waited %v for a slot", took)
		}
		if st, err := f.l.TxState(context.Background(), req.Nonce); err != nil || st.Status != TxUnknown {
			t.Fatalf("state %+v (%v), want nothing recorded", st, err)
		}
		if c.fn.Load() != nil {
			t.Fatal("the top level ran outside the gate")
		}
		// With two slots, it runs in the second.
		f2 := newFixtureLimits(t, openEngine(t), Limits{MaxConcurrentExecutions: 2})
		if err := f2.register(f2.hmac, "outer", "def invoke(ledger, args):\n    return ledger.call('inner', {})\n"); err != nil {
			t.Fatal(err)
		}
		prepared(t, f2, "inner", top+"def invoke(ledger, args):\n    return T['9']\n")
		if res := f2.mustExec(f2.hmac, "outer", `{}`); string(res.Result) != "9" {
			t.Fatalf("result %s", res.Result)
		}
		if p := f2.l.gate.peak.Load(); p != 2 {
			t.Fatalf("%d slots taken at once, want 2", p)
		}
	})
	t.Run("concurrent first calls", func(t *testing.T) {
		f := newFixtureLimits(t, openEngine(t), Limits{})
		c := prepared(t, f, "lazy", top+"def invoke(ledger, args):\n    return T['3']\n")
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			req := f.request(f.hmac, "lazy", `{}`)
			_ = i
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
		if c.fn.Load() == nil {
			t.Fatal("invoke not kept")
		}
	})
	t.Run("failing top level", func(t *testing.T) {
		f := newFixtureLimits(t, openEngine(t), Limits{})
		// Registered as it compiled then; its top level fails now (a
		// stored contract under limits lowered since, say).
		if err := f.register(f.hmac, "bad", "def invoke(ledger, args):\n    return 1\n"); err != nil {
			t.Fatal(err)
		}
		c, err := prepareStarlark("bad", []byte("x = 'x' * 100000000\ndef invoke(ledger, args):\n    return 1\n"))
		if err != nil {
			t.Fatal(err)
		}
		f.l.contracts.Store("bad", c)
		for range 2 {
			req := f.request(f.hmac, "bad", `{}`)
			_, err := f.l.Execute(context.Background(), req)
			if !errors.Is(err, ErrBadContract) || !strings.Contains(err.Error(), "memory limit") {
				t.Fatalf("%v, want ErrBadContract for the memory limit", err)
			}
			if st, _ := f.l.TxState(context.Background(), req.Nonce); st.Status != TxAborted || st.Kind != "bad_contract" {
				t.Fatalf("state %+v, want aborted with kind bad_contract", st)
			}
		}
		if c.failed == nil {
			t.Fatal("the failure is not kept")
		}
	})
}

// TestFreezeGlobals: freezing a contract's globals, when its top level has
// run, walks shared tuples exponentially and a function that captures
// itself without end (the process died of a stack overflow); such a
// contract does not compile. Ordinary globals — closures over lists,
// bound methods, nested containers — are frozen as before.
func TestFreezeGlobals(t *testing.T) {
	for _, src := range []string{
		"def outer():\n    def inner():\n        return inner\n    return inner\nf = outer()\n",
		"def outer():\n    def a():\n        return b\n    def b():\n        return a\n    return [a]\nf = outer()\n",
		deep + "g = [t]\n",
		deep,
		deep + "def f(x=t):\n    return x\n",
	} {
		done := make(chan error, 1)
		go func() {
			_, err := compileStarlark(context.Background(), "c", []byte(src+"def invoke(ledger, args):\n    return 1\n"), Limits{MaxExecutionTime: time.Second})
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrBadContract) || !errors.Is(err, ErrStepLimit) || !strings.Contains(err.Error(), "freezing") {
				t.Errorf("%q: %v, want ErrBadContract for freezing", src, err)
			}
		case <-time.After(hangAfter):
			t.Fatalf("%q: still compiling after %v", src, hangAfter)
		}
	}
	src := `def counter():
    seen = []
    def add(x):
        seen.append(x)
        return len(seen)
    return add
add = counter()
app = [].append
T = (1, (2, [3]), {"k": [4]})
def invoke(ledger, args):
    return add(1)
`
	c, err := compileStarlark(context.Background(), "ok", []byte(src), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, openEngine(t))
	f.l.contracts.Store("ok", c)
	if err := f.register(f.hmac, "ok", src); err != nil {
		t.Fatal(err)
	}
	if _, err := f.exec(f.hmac, "ok", `{}`); !errors.Is(err, ErrContractFailed) || !strings.Contains(err.Error(), "frozen") {
		t.Fatalf("%v, want the frozen list refusing the append", err)
	}
}
