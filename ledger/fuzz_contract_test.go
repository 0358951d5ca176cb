package ledger_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/ledger"
)

// Fuzz targets that drive a real ledger on the embedded engine through its
// exported API, as the server does: contract source at registration, and
// arguments through a Starlark contract's JSON ↔ Starlark conversions.

// fuzzLedger is a ledger on a fresh engine with one HMAC identity, fz.
type fuzzLedger struct {
	l     *ledger.Ledger
	hs    auth.Signer
	seq   atomic.Int64 // for nonces and contract ids: each worker has its own ledger
	limit ledger.Limits
}

func newFuzzLedger(f *testing.F, lim ledger.Limits) *fuzzLedger {
	f.Helper()
	ctx := context.Background()
	db, err := engine.Open(engine.Config{Dir: f.TempDir(), EpochInterval: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	key, err := auth.LoadOrCreateECDSAKey(f.TempDir() + "/proof.pem")
	if err != nil {
		f.Fatal(err)
	}
	signer, _ := auth.NewECDSASigner(key)
	verifier, _ := auth.NewECDSAVerifier(&key.PublicKey)
	box, _ := auth.NewSecretBox(bytes.Repeat([]byte{3}, 32))
	l, err := ledger.Open(ctx, ledger.Config{Backend: db, Signer: signer, ProofVerifier: verifier, Secrets: box, Limits: lim})
	if err != nil {
		f.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, 32)
	if err := l.RegisterSecret(ctx, "fz", 1, secret); err != nil {
		f.Fatal(err)
	}
	hs, _ := auth.NewHMACSigner(secret)
	return &fuzzLedger{l: l, hs: hs, limit: lim}
}

// register registers source under id, signed by fz.
func (fl *fuzzLedger) register(id string, source []byte) error {
	reg := &ledger.ContractRegistration{ID: id, Source: source, Entity: "fz", KeyVersion: 1}
	sig, err := ledger.Sign(fl.hs, reg)
	if err != nil {
		return err
	}
	reg.Signature = sig
	return fl.l.RegisterContract(context.Background(), reg)
}

// execute runs contract on arg under a fresh nonce, signed by fz.
func (fl *fuzzLedger) execute(contract string, arg []byte) (*ledger.Result, error) {
	req := &ledger.Request{Nonce: fmt.Sprintf("n%d", fl.seq.Add(1)), ContractID: contract, Argument: arg, Entity: "fz", KeyVersion: 1}
	sig, err := ledger.Sign(fl.hs, req)
	if err != nil {
		return nil, err
	}
	req.Signature = sig
	return fl.l.Execute(context.Background(), req)
}

// checkCommitted checks what a committed transaction returned and wrote:
// its result and every value it wrote are canonical JSON (Canonical gives
// them back unchanged), and each written version validates — the
// ledger's own re-execution of it gives the same output.
func (fl *fuzzLedger) checkCommitted(t *testing.T, res *ledger.Result) {
	t.Helper()
	ctx := context.Background()
	if c, err := ledger.Canonical(res.Result, ledger.ErrBadValue); err != nil || !bytes.Equal(c, res.Result) {
		t.Fatalf("result %q is not canonical JSON: %q, %v", res.Result, c, err)
	}
	for id, age := range res.Writes {
		v, err := fl.l.Version(ctx, id, age)
		if err != nil {
			t.Fatalf("version %s@%d it wrote: %v", id, age, err)
		}
		if c, err := ledger.Canonical(v.Output, ledger.ErrBadValue); err != nil || !bytes.Equal(c, v.Output) {
			t.Fatalf("stored value %q of %s@%d is not canonical JSON: %v", v.Output, id, age, err)
		}
		val, err := fl.l.ValidateLedger(ctx, id, age, age)
		if err != nil || val.Fault != nil {
			t.Fatalf("version %s@%d does not validate: %+v, %v", id, age, val, err)
		}
	}
}

// FuzzRegisterContract registers arbitrary source, as RegisterContract
// receives it from a client. A refusal is ErrBadContract (it does not
// compile, or defines no invoke(ledger, args)) or ErrTooLarge, never a
// panic or an untyped error; the exported compile (which a Validator uses
// on the sources the ledger lists) gives the same verdict; registering the
// same source again succeeds (a retry). An accepted contract, executed with
// a small step budget, commits or fails with a ledger error kind, and what
// it commits is canonical and re-executes to the same output.
func FuzzRegisterContract(f *testing.F) {
	fl := newFuzzLedger(f, ledger.Limits{MaxSteps: 20_000, MaxSourceBytes: 16 << 10})
	for _, s := range []string{
		"def invoke(ledger, args):\n    return args\n",
		"def invoke(ledger, args):\n    ledger.put('a', {'n': 1, 'l': [1.5, None, True]})\n    return ledger.get('a')\n",
		"def invoke(ledger, args):\n    return [v['age'] for v in ledger.scan('a', limit=3)]\n",
		"def invoke(ledger, args):\n    fail('no')\n",
		"def invoke(ledger, args):\n    return ledger.call('builtin.ycsb_c', {'ids': ['a', 'b']})\n",
		"def invoke(ledger, args):\n    while True:\n        pass\n",
		"def invoke(ledger, args):\n    return 2**60\n",
		"def invoke(ledger, args):\n    return {1: 2}\n",
		"def invoke(ledger, args):\n    return float('nan')\n",
		"def invoke(ledger, args):\n    return 1e16\n",
		"def invoke(ledger, args):\n    return 'é'[0:1]\n",
		"x = [1]\ndef invoke(ledger, args):\n    x.append(2)\n",
		"def f(n):\n    return f(n)\ndef invoke(ledger, args):\n    return f(1)\n",
		"load('x', 'y')\ndef invoke(ledger, args):\n    pass\n",
		"def invoke(ledger):\n    pass\n",
		"invoke = 1\n",
		"for i in range(1000000):\n    pass\ndef invoke(ledger, args):\n    pass\n",
		"def invoke(ledger, args):\n    s = set([1])\n    return list(s)\n",
		"def invoke(ledger, args):\n  return \"\\xff\"\n",
		"",
		"\x00",
		"def invoke(ledger, args):\n\treturn 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		id := fmt.Sprintf("c%d", fl.seq.Add(1))
		err := fl.register(id, src)
		_, cerr := ledger.CompileContract(id, src)
		if err != nil {
			if !errors.Is(err, ledger.ErrBadContract) && !errors.Is(err, ledger.ErrTooLarge) {
				t.Fatalf("source %q refused with %v (kind %q), want bad_contract or too_large", src, err, ledger.Kind(err))
			}
			if errors.Is(err, ledger.ErrBadContract) && cerr == nil {
				t.Fatalf("source %q refused at registration (%v) but compiles", src, err)
			}
			return
		}
		if cerr != nil {
			t.Fatalf("source %q registered but does not compile: %v", src, cerr)
		}
		if err := fl.register(id, src); err != nil {
			t.Fatalf("registering %s again with the same source: %v", id, err)
		}
		res, err := fl.execute(id, []byte(`{"k":"v"}`))
		if err != nil {
			if ledger.Kind(err) == "" {
				t.Fatalf("executing %q failed without a ledger error kind: %v", src, err)
			}
			return
		}
		fl.checkCommitted(t, res)
	})
}

// echo returns its argument; roundTrip stores its argument, reads it back
// and returns what echo makes of that. (It does not compare them in
// Starlark: its == gives up on values nested more than 10 deep.)
const (
	echoSource      = "def invoke(ledger, args):\n    return args\n"
	roundTripSource = `def invoke(ledger, args):
    ledger.put("rt", args)
    return ledger.call("echo", ledger.get("rt")["value"])
`
)

// FuzzStarlarkJSON sends arbitrary arguments through a Starlark contract:
// JSON to Starlark values (the argument, a value read back, a nested
// call's argument and result) and back. The ledger accepts an argument
// exactly when Canonical does: an accepted one comes back (as the result,
// and as the stored value) equal to its canonical form, and the version it
// wrote re-executes to the same output; a refused one fails with
// ErrBadArgument (or ErrTooLarge), as the builtins refuse it.
func FuzzStarlarkJSON(f *testing.F) {
	fl := newFuzzLedger(f, ledger.Limits{MaxArgumentBytes: 8 << 10})
	for id, src := range map[string]string{"echo": echoSource, "rt": roundTripSource} {
		if err := fl.register(id, []byte(src)); err != nil {
			f.Fatal(err)
		}
	}
	for _, s := range []string{
		`{"a":[1,2.5,-0,"x",null,true,false],"b":{"c":{}}}`, `[]`, `null`, `"é\u00e9\ud83d\ude00"`, `1.0`, `1e16`,
		`9007199254740991`, `9007199254740992`, `9007199254740993.0`, `-9007199254740991.0`, `1e21`, `1e-320`, `1E400`,
		`{"b":1,"a":2,"\u0061":3}`, `{"z":1,"é":2,"😀":3,"ｚ":4}`, `"\u2028<>&\u0000\/"`, "\"a\xffb\"", `"\ud800"`, `"\udc00\ud800"`,
		`{"a":1} `, ` [1 , 2 ] `, `[1,]`, `01`, `-`, `"\x"`, "[\"\t\"]", `0.1e-1`, `123456789.123456789e-5`,
		strings.Repeat("[", 64) + strings.Repeat("]", 64), strings.Repeat("[", 65) + strings.Repeat("]", 65),
		strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, arg []byte) {
		canon, cerr := ledger.Canonical(arg, ledger.ErrBadArgument)
		res, err := fl.execute("rt", arg)
		switch {
		case len(arg) > 8<<10:
			if !errors.Is(err, ledger.ErrTooLarge) {
				t.Fatalf("an argument of %d bytes: %v, want ErrTooLarge", len(arg), err)
			}
		case cerr != nil:
			var je *ledger.JSONError
			if !errors.As(cerr, &je) || !errors.Is(cerr, ledger.ErrBadArgument) {
				t.Fatalf("Canonical refused %q with %T %v, want a *JSONError wrapping ErrBadArgument", arg, cerr, cerr)
			}
			if !errors.Is(err, ledger.ErrBadArgument) {
				t.Fatalf("argument %q, which Canonical refuses (%v): %v, want ErrBadArgument", arg, cerr, err)
			}
		case err != nil:
			t.Fatalf("argument %q (canonical %q) failed: %v", arg, canon, err)
		case !bytes.Equal(res.Result, canon):
			t.Fatalf("argument %q came back as %q, want its canonical form %q", arg, res.Result, canon)
		default:
			fl.checkCommitted(t, res)
			v, err := fl.l.Version(context.Background(), "rt", res.Writes["rt"])
			if err != nil || !bytes.Equal(v.Output, canon) {
				t.Fatalf("argument %q was stored as %q (%v), want %q", arg, v.Output, err, canon)
			}
		}
	})
}
