package ledger

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/internal/testenv"
	"github.com/kiroku-db/kiroku/storage"
	storagebackends "github.com/kiroku-db/kiroku/storage/backends"
	"github.com/kiroku-db/kiroku/storage/coordinator"
	"github.com/kiroku-db/kiroku/storage/postgres"
)

// fixture is a ledger on a real backend with one HMAC and one ECDSA client.
type fixture struct {
	t       testing.TB
	b       storage.Backend
	l       *Ledger
	hmac    client
	ecdsa   client
	bobCert []byte // bob's registered certificate
	nonceNo int
}

type client struct {
	entity string
	signer auth.Signer
}

func openEngine(t testing.TB) storage.Backend {
	db, err := engine.Open(engine.Config{Dir: t.TempDir(), EpochInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func openPostgres(t *testing.T) storage.Backend {
	b, err := postgres.Open(context.Background(), postgres.Config{DSN: testenv.PostgresDSN(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// openCoordinated is the embedded engine's single operations with the
// transactions of storage/coordinator, as a store without transactions
// of its own (Cassandra) gets them.
func openCoordinated(t *testing.T) storage.Backend {
	type storeOnly struct{ storage.Store }
	c, err := coordinator.Open(context.Background(), storeOnly{openEngine(t)}, coordinator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// backends runs f on the embedded engine, on PostgreSQL, on the generic
// transaction coordinator over the engine's single operations, and on
// Cassandra (whose transactions are the coordinator's).
func backends(t *testing.T, f func(t *testing.T, b storage.Backend)) {
	t.Run("engine", func(t *testing.T) { f(t, openEngine(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, openPostgres(t)) })
	t.Run("coordinator", func(t *testing.T) { f(t, openCoordinated(t)) })
	t.Run("cassandra", func(t *testing.T) { f(t, openCassandra(t)) })
}

// openCassandra is Cassandra with the coordinator's transactions.
func openCassandra(t *testing.T) storage.Backend {
	b, err := storagebackends.Open(context.Background(), "cassandra", storagebackends.Config{Contacts: testenv.CassandraContacts(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

var nsCounter struct {
	sync.Mutex
	n int
}

func newFixture(t *testing.T, b storage.Backend) *fixture {
	t.Helper()
	return newFixtureLimits(t, b, Limits{MaxSteps: 100_000, MaxValueBytes: 4096, MaxArgumentBytes: 4096, MaxWrites: 1000,
		MaxReadBytes: 64 << 10})
}

func newFixtureLimits(t *testing.T, b storage.Backend, lim Limits) *fixture {
	t.Helper()
	ctx := context.Background()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := auth.NewECDSASigner(key)
	verifier, _ := auth.NewECDSAVerifier(&key.PublicKey)
	boxKey := make([]byte, 32)
	rand.Read(boxKey)
	box, err := auth.NewSecretBox(boxKey)
	if err != nil {
		t.Fatal(err)
	}
	nsCounter.Lock()
	nsCounter.n++
	ns := fmt.Sprintf("lt%d_%d", time.Now().UnixNano()%1e9, nsCounter.n)
	nsCounter.Unlock()
	l, err := Open(ctx, Config{Backend: b, Namespace: ns, Signer: signer, ProofVerifier: verifier, Secrets: box, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, b: b, l: l}
	secret := bytes.Repeat([]byte("s"), 32)
	if err := l.RegisterSecret(ctx, "alice", 1, secret); err != nil {
		t.Fatal(err)
	}
	hs, _ := auth.NewHMACSigner(secret)
	f.hmac = client{"alice", hs}
	keyPEM, certPEM, err := auth.GenerateIdentity("bob", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RegisterCertificate(ctx, "bob", 1, certPEM); err != nil {
		t.Fatal(err)
	}
	bk, _ := auth.ParsePrivateKeyPEM(keyPEM)
	es, _ := auth.NewECDSASigner(bk)
	f.ecdsa = client{"bob", es}
	f.bobCert = certPEM
	return f
}

func (f *fixture) register(c client, id, src string) error {
	reg := &ContractRegistration{ID: id, Source: []byte(src), Entity: c.entity, KeyVersion: 1}
	reg.Signature, _ = c.signer.Sign(reg.SigningBytes())
	return f.l.RegisterContract(context.Background(), reg)
}

func (f *fixture) request(c client, contract, args string) *Request {
	f.nonceNo++
	r := &Request{Nonce: fmt.Sprintf("n-%d", f.nonceNo), ContractID: contract, Argument: []byte(args), Entity: c.entity, KeyVersion: 1}
	r.Signature, _ = c.signer.Sign(r.SigningBytes())
	return r
}

func (f *fixture) exec(c client, contract, args string) (*Result, error) {
	return f.l.Execute(context.Background(), f.request(c, contract, args))
}

func (f *fixture) mustExec(c client, contract, args string) *Result {
	f.t.Helper()
	r, err := f.exec(c, contract, args)
	if err != nil {
		f.t.Fatalf("execute %s %s: %v", contract, args, err)
	}
	return r
}

const inspection = `
def invoke(ledger, args):
    cur = ledger.get(args["site"])
    count = 0
    if cur != None:
        count = cur["value"]["count"]
    if args["result"] not in ("pass", "fail"):
        fail("result must be pass or fail")
    ledger.put(args["site"], {"count": count + 1, "last": args["result"], "by": args["inspector"]})
    return {"site": args["site"], "inspections": count + 1}
`

func TestExecuteChainsAndValidates(t *testing.T) {
	backends(t, func(t *testing.T, b storage.Backend) {
		ctx := context.Background()
		f := newFixture(t, b)
		if err := f.register(f.ecdsa, "inspect", inspection); err != nil {
			t.Fatal(err)
		}
		for i, c := range []client{f.hmac, f.ecdsa, f.hmac} {
			res := f.mustExec(c, "inspect", fmt.Sprintf(`{"site":"plant-7","result":"pass","inspector":"i%d"}`, i))
			if want := fmt.Sprintf(`{"inspections":%d,"site":"plant-7"}`, i+1); string(res.Result) != want {
				t.Fatalf("result %s, want %s", res.Result, want)
			}
			if len(res.Proofs) != 1 || res.Proofs[0].ID != "plant-7" || res.Proofs[0].Age != int64(i) {
				t.Fatalf("proofs %+v", res.Proofs)
			}
			p := res.Proofs[0]
			if err := f.l.VerifyProof(&p); err != nil {
				t.Fatal(err)
			}
			if p.Input["plant-7"] != int64(i)-1 {
				t.Fatalf("input %v, want plant-7 → %d", p.Input, i-1)
			}
			st, err := f.l.TxState(ctx, res.Nonce)
			if err != nil || st.Status != TxCommitted || st.Writes["plant-7"] != int64(i) || !bytes.Equal(st.Result, res.Result) {
				t.Fatalf("tx state %+v, %v", st, err)
			}
		}
		page, err := f.l.History(ctx, "plant-7", ScanRange{End: -1, Ascending: true})
		if err != nil || len(page.Versions) != 3 || page.Truncated {
			t.Fatalf("history %+v, %v", page, err)
		}
		hist := page.Versions
		for i, v := range hist {
			if !bytes.Equal(v.Hash, v.ComputeHash()) || (i > 0 && !bytes.Equal(v.PrevHash, hist[i-1].Hash)) {
				t.Fatalf("version %d does not chain", i)
			}
		}
		if !strings.Contains(string(hist[2].Output), `"count":3`) {
			t.Fatalf("latest output %s", hist[2].Output)
		}
		val, err := f.l.ValidateLedger(ctx, "plant-7", 0, -1)
		if err != nil || val.Fault != nil || val.Checked != 3 {
			t.Fatalf("validate: %+v %v", val, err)
		}
		// A sub-range links to the version before it.
		if val, err := f.l.ValidateLedger(ctx, "plant-7", 1, 1); err != nil || val.Fault != nil || val.Checked != 1 {
			t.Fatalf("validate [1,1]: %+v %v", val, err)
		}
		// One call checks at most MaxValidateVersions versions and says
		// where it stopped.
		f.l.lim.MaxValidateVersions = 2
		val, err = f.l.ValidateLedger(ctx, "plant-7", 0, -1)
		if err != nil || val.Fault != nil || val.Checked != 2 || val.End != 1 || !val.Truncated {
			t.Fatalf("bounded validate [0,-1]: %+v %v", val, err)
		}
		val, err = f.l.ValidateLedger(ctx, "plant-7", val.End+1, -1)
		if err != nil || val.Fault != nil || val.Checked != 1 || val.Start != 2 || val.End != 2 || val.Truncated {
			t.Fatalf("bounded validate [2,-1]: %+v %v", val, err)
		}
	})
}

// TestBadInputWritesNothing sends every kind of bad request the issue
// names and checks the typed error, that no asset changed, and what was
// recorded for the nonce, on both backends (a reused nonce is refused at
// commit on PostgreSQL, requests.statePut).
func TestBadInputWritesNothing(t *testing.T) { backends(t, testBadInputWritesNothing) }

func testBadInputWritesNothing(t *testing.T, b storage.Backend) {
	ctx := context.Background()
	f := newFixture(t, b)
	if err := f.register(f.hmac, "inspect", inspection); err != nil {
		t.Fatal(err)
	}
	f.mustExec(f.hmac, "inspect", `{"site":"s","result":"pass","inspector":"x"}`)
	must := []struct{ id, src string }{
		{"spin", "def invoke(ledger, args):\n    while True:\n        ledger.put('s', 1)\n"},
		{"recurse", "def invoke(ledger, args):\n    ledger.put('s', 1)\n    return ledger.call('recurse', args)\n"},
		{"huge", "def invoke(ledger, args):\n    ledger.put('s', 'x' * 10000)\n"},
		{"hugeresult", "def invoke(ledger, args):\n    return 'x' * 10000\n"},
		{"badvalue", "def invoke(ledger, args):\n    ledger.put('s', {1: 2})\n"},
		{"bigint", "def invoke(ledger, args):\n    ledger.put('s', 1 << 60)\n"},
		{"crash", "def invoke(ledger, args):\n    ledger.put('s', 1)\n    return 1 // 0\n"},
		{"many", "def invoke(ledger, args):\n    for i in range(1500):\n        ledger.put('a%d' % i, 1)\n"},
		// A scan of s returns its two versions, 34 bytes each: 2,500 of
		// them pass the fixture's 64 KiB budget. The same budget counts
		// gets: 2,500 of s's latest version.
		{"hoard", "def invoke(ledger, args):\n    ledger.put('a0', 1)\n    kept = []\n    for i in range(2500):\n        kept.append(ledger.scan('s'))\n"},
		{"hoardget", "def invoke(ledger, args):\n    ledger.put('a0', 1)\n    kept = []\n    for i in range(2500):\n        kept.append(ledger.get('s'))\n"},
	}
	for _, c := range must {
		if err := f.register(f.hmac, c.id, c.src); err != nil {
			t.Fatalf("register %s: %v", c.id, err)
		}
	}
	replay := f.request(f.hmac, "inspect", `{"site":"s","result":"pass","inspector":"x"}`)
	if _, err := f.l.Execute(ctx, replay); err != nil {
		t.Fatal(err)
	}
	wrongSig := f.request(f.hmac, "inspect", `{"site":"s","result":"pass","inspector":"x"}`)
	wrongSig.Argument = []byte(`{"site":"s","result":"pass","inspector":"mallory"}`)
	unknownEntity := f.request(f.hmac, "inspect", `{}`)
	unknownEntity.Entity = "carol"
	otherKeyVersion := f.request(f.hmac, "inspect", `{}`)
	otherKeyVersion.KeyVersion = 2
	bigArg := f.request(f.hmac, "inspect", `"`+strings.Repeat("x", 5000)+`"`)
	cases := []struct {
		name     string
		req      *Request
		want     error
		recorded TxStatus
	}{
		{"malformed JSON", f.request(f.hmac, "inspect", `{"site":`), ErrBadArgument, TxAborted},
		{"duplicate key", f.request(f.hmac, "inspect", `{"a":1,"a":2}`), ErrBadArgument, TxAborted},
		{"unknown contract", f.request(f.hmac, "nope", `{}`), ErrUnknownContract, TxAborted},
		{"fail", f.request(f.hmac, "inspect", `{"site":"s","result":"maybe","inspector":"x"}`), ErrContractFailed, TxAborted},
		{"step limit", f.request(f.hmac, "spin", `{}`), ErrStepLimit, TxAborted},
		{"unbounded recursion", f.request(f.hmac, "recurse", `{}`), ErrCallDepth, TxAborted},
		{"oversized value", f.request(f.hmac, "huge", `{}`), ErrTooLarge, TxAborted},
		{"oversized result", f.request(f.hmac, "hugeresult", `{}`), ErrTooLarge, TxAborted},
		{"value with int keys", f.request(f.hmac, "badvalue", `{}`), ErrBadValue, TxAborted},
		{"unsafe integer", f.request(f.hmac, "bigint", `{}`), ErrBadValue, TxAborted},
		{"runtime error", f.request(f.hmac, "crash", `{}`), ErrContractFailed, TxAborted},
		{"too many writes", f.request(f.hmac, "many", `{}`), ErrTooLarge, TxAborted},
		{"too many bytes scanned", f.request(f.hmac, "hoard", `{}`), ErrTooLarge, TxAborted},
		{"too many bytes got", f.request(f.hmac, "hoardget", `{}`), ErrTooLarge, TxAborted},
		{"wrong signature", wrongSig, ErrBadSignature, TxUnknown},
		{"unknown entity", unknownEntity, ErrUnknownEntity, TxUnknown},
		{"unknown key version", otherKeyVersion, ErrUnknownEntity, TxUnknown},
		{"replayed nonce", replay, ErrNonceReused, TxCommitted},
		{"oversized argument", bigArg, ErrTooLarge, TxUnknown},
		{"empty nonce", &Request{ContractID: "inspect", Argument: []byte("{}"), Entity: "alice", KeyVersion: 1, Signature: []byte{1}}, ErrBadRequest, TxUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.l.Execute(ctx, c.req)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if Kind(err) == "" {
				t.Fatalf("error %v has no kind", err)
			}
			if latest, _ := f.l.Latest(ctx, "s"); latest != 1 {
				t.Fatalf("asset s is at age %d after a rejected request; want 1", latest)
			}
			if latest, _ := f.l.Latest(ctx, "a0"); latest != -1 {
				t.Fatalf("asset a0 was written")
			}
			if c.req.Nonce == "" {
				return
			}
			st, err := f.l.TxState(ctx, c.req.Nonce)
			if err != nil || st.Status != c.recorded {
				t.Fatalf("tx state %+v (%v), want %s", st, err, c.recorded)
			}
			if c.recorded == TxAborted && st.Reason == "" {
				t.Fatal("abort recorded without a reason")
			}
			if c.recorded == TxAborted {
				// An aborted nonce cannot be used again either.
				if _, err := f.l.Execute(ctx, c.req); !errors.Is(err, ErrNonceReused) {
					t.Fatalf("retry of an aborted nonce: %v", err)
				}
			}
		})
	}
	if val, err := f.l.ValidateLedger(ctx, "s", 0, -1); err != nil || val.Fault != nil || val.Checked != 2 {
		t.Fatalf("validate after bad input: %+v %v", val, err)
	}
}

func TestRegistrationRejects(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, openEngine(t))
	cases := []struct {
		name string
		reg  func() error
		want error
	}{
		{"syntax error", func() error { return f.register(f.hmac, "bad", "def invoke(ledger, args)\n  return 1\n") }, ErrBadContract},
		{"no invoke", func() error { return f.register(f.hmac, "noinvoke", "x = 1\n") }, ErrBadContract},
		{"invoke of one parameter", func() error { return f.register(f.hmac, "oneparam", "def invoke(args):\n  return 1\n") }, ErrBadContract},
		{"load", func() error {
			return f.register(f.hmac, "load", "load('x.star', 'y')\ndef invoke(ledger, args):\n  return 1\n")
		}, ErrBadContract},
		{"builtin prefix", func() error { return f.register(f.hmac, "builtin.x", "def invoke(ledger, args):\n  return 1\n") }, ErrBadRequest},
		{"wrong signature", func() error {
			reg := &ContractRegistration{ID: "c", Source: []byte("def invoke(ledger, args):\n  return 1\n"), Entity: "alice", KeyVersion: 1, Signature: []byte("forged")}
			return f.l.RegisterContract(ctx, reg)
		}, ErrBadSignature},
		{"duplicate id", func() error {
			if err := f.register(f.hmac, "dup", "def invoke(ledger, args):\n  return 1\n"); err != nil {
				return err
			}
			return f.register(f.ecdsa, "dup", "def invoke(ledger, args):\n  return 2\n")
		}, ErrContractExists},
		// Repeating a registration (a retry whose reply was lost) succeeds;
		// the same id or identity with anything else changed does not.
		{"same contract again", func() error {
			src := "def invoke(ledger, args):\n  return 3\n"
			if err := f.register(f.ecdsa, "again", src); err != nil {
				return err
			}
			return f.register(f.ecdsa, "again", src) // ECDSA: a second, different signature
		}, nil},
		{"same source from another entity", func() error { return f.register(f.hmac, "again", "def invoke(ledger, args):\n  return 3\n") }, ErrContractExists},
		{"identity twice", func() error { return f.l.RegisterSecret(ctx, "alice", 1, bytes.Repeat([]byte("t"), 32)) }, ErrIdentityExists},
		{"same secret again", func() error { return f.l.RegisterSecret(ctx, "alice", 1, bytes.Repeat([]byte("s"), 32)) }, nil},
		{"same certificate again", func() error { return f.l.RegisterCertificate(ctx, "bob", 1, f.bobCert) }, nil},
		{"a certificate where a secret is", func() error { return f.l.RegisterCertificate(ctx, "alice", 1, f.bobCert) }, ErrIdentityExists},
		{"short secret", func() error { return f.l.RegisterSecret(ctx, "dave", 1, []byte("short")) }, ErrBadRequest},
		{"not a certificate", func() error { return f.l.RegisterCertificate(ctx, "erin", 1, []byte("hello")) }, ErrBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.reg(); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	list, err := f.l.ListContracts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	if got := strings.Join(ids, ","); got != "builtin.bulk_load,builtin.ycsb_c,builtin.ycsb_f,again,dup" {
		t.Fatalf("contracts %s", got)
	}
}

// TestDeterministicReexecution runs the same requests on two independent
// ledgers: with HMAC signatures (deterministic) every version must come out
// byte-identical, hashes included.
func TestDeterministicReexecution(t *testing.T) {
	const src = `
def invoke(ledger, args):
    acc = {}
    for k in sorted(args.keys(), reverse=True):
        acc[k] = [args[k], len(str(args[k])), hash(str(k))]
    s = set([3, 1, 2])
    prev = ledger.get("d")
    n = 0 if prev == None else prev["value"]["n"]
    hist = ledger.scan("d", start_age=0, end_age=-1, ascending=False, limit=2)
    ledger.put("d", {"n": n + 1, "acc": acc, "set": list(s), "f": 1.0 / 3, "hist": [h["age"] for h in hist], "nested": ledger.call("helper", {"x": n})})
    ledger.put("e", {"d_age": ledger.get("d")["age"]})
    return {"dict_order": list(acc.keys())}
`
	const helper = "def invoke(ledger, args):\n    return {'y': args['x'] * 2, 'z': [1.5, 'é', None, True]}\n"
	var runs [2][]*Version
	for i := range runs {
		f := newFixture(t, openEngine(t))
		if err := f.register(f.hmac, "det", src); err != nil {
			t.Fatal(err)
		}
		if err := f.register(f.hmac, "helper", helper); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 4; j++ {
			f.mustExec(f.hmac, "det", fmt.Sprintf(`{"b": %d, "a": "x", "c": [1,2,{"z":0.1,"y":1e21}]}`, j))
		}
		h, err := f.l.History(context.Background(), "d", ScanRange{End: -1, Ascending: true})
		if err != nil {
			t.Fatal(err)
		}
		runs[i] = h.Versions
		for _, id := range []string{"d", "e"} {
			if val, err := f.l.ValidateLedger(context.Background(), id, 0, -1); err != nil || val.Fault != nil || val.Checked != 4 {
				t.Fatalf("validate %s: %+v %v", id, val, err)
			}
		}
	}
	for j := range runs[0] {
		a, b := runs[0][j], runs[1][j]
		if !bytes.Equal(a.Output, b.Output) || !bytes.Equal(a.Hash, b.Hash) {
			t.Fatalf("version %d differs:\n%s\n%s", j, a.Output, b.Output)
		}
	}
}

// TestTamperingIsNamed edits stored rows behind the ledger's back and
// checks that validate-ledger names the version and the check.
func TestTamperingIsNamed(t *testing.T) {
	ctx := context.Background()
	type edit struct {
		name  string
		age   int64
		check string
		apply func(f *fixture, v *Version) // nil: delete the version
	}
	edits := []edit{
		{"output", 1, CheckHash, func(f *fixture, v *Version) { v.Output = []byte(`{"by":"x","count":99,"last":"pass"}`) }},
		{"output with rehash", 1, CheckProofSignature, func(f *fixture, v *Version) {
			v.Output = []byte(`{"by":"x","count":99,"last":"pass"}`)
			v.Hash = v.ComputeHash()
		}},
		{"argument re-signed by nobody", 2, CheckHash, func(f *fixture, v *Version) { v.Argument = []byte(`{}`) }},
		{"prev_hash", 2, CheckHash, func(f *fixture, v *Version) { v.PrevHash = bytes.Repeat([]byte{1}, 32) }},
		{"prev_hash, rehashed and re-signed", 2, CheckPrevHash, func(f *fixture, v *Version) {
			v.PrevHash = bytes.Repeat([]byte{1}, 32)
			f.resign(v)
		}},
		{"argument, rehashed and re-signed by the ledger only", 2, CheckClientSignature, func(f *fixture, v *Version) {
			v.Argument = []byte(`{"site":"s","result":"fail","inspector":"i1"}`)
			f.resign(v)
		}},
		{"wrong output, re-signed by the ledger", 1, CheckOutput, func(f *fixture, v *Version) {
			// A ledger that executes wrongly signs what it wrote: only
			// re-execution catches it. The next version's link is fixed too.
			v.Output = []byte(`{"by":"x","count":99,"last":"pass"}`)
			f.resign(v)
			next, _ := f.l.Version(ctx, v.ID, v.Age+1)
			next.PrevHash = v.Hash
			f.resign(next)
			f.store(next)
		}},
		{"request replayed", 2, CheckNonce, func(f *fixture, v *Version) {
			// The ledger replays version 1's signed request as version 2.
			prev, _ := f.l.Version(ctx, v.ID, v.Age-1)
			v.Nonce, v.Argument, v.Signature, v.Contract = prev.Nonce, prev.Argument, prev.Signature, prev.Contract
			f.resign(v)
		}},
		{"version deleted", 2, CheckChain, nil},
	}
	for _, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, openEngine(t))
			if err := f.register(f.hmac, "inspect", inspection); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 4; i++ {
				f.mustExec(f.hmac, "inspect", fmt.Sprintf(`{"site":"s","result":"pass","inspector":"i%d"}`, i))
			}
			v, err := f.l.Version(ctx, "s", e.age)
			if err != nil {
				t.Fatal(err)
			}
			if e.apply != nil {
				e.apply(f, v)
				f.store(v)
			} else if err := f.b.Delete(ctx, &storage.Delete{Namespace: f.l.ns, Table: AssetsTable,
				Partition: storage.Values{"id": storage.Text(v.ID)}, Clustering: storage.Values{"age": storage.BigInt(v.Age)}}); err != nil {
				t.Fatal(err)
			}
			val, err := f.l.ValidateLedger(ctx, "s", 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			if val.Fault == nil || val.Fault.Age != e.age || val.Fault.Check != e.check {
				t.Fatalf("validation %+v, fault %+v; want age %d check %s", val, val.Fault, e.age, e.check)
			}
			if val.Checked != int(e.age) {
				t.Fatalf("checked %d versions before the fault, want %d", val.Checked, e.age)
			}
		})
	}
}

// resign makes v internally consistent as a lying ledger would: hash and
// proof signature recomputed.
func (f *fixture) resign(v *Version) {
	v.Hash = v.ComputeHash()
	p := v.Proof()
	v.ProofSignature, _ = f.l.cfg.Signer.Sign(p.SigningBytes())
}

func (f *fixture) store(v *Version) {
	f.t.Helper()
	if err := f.b.Put(context.Background(), newRequests(f.l.ns).versionPut(v)); err != nil {
		f.t.Fatal(err)
	}
}

// TestConcurrentChains runs YCSB-F from many goroutines on a few assets and
// checks that every chain is gapless and valid, and that every committed
// transaction's write is in its chain exactly once.
func TestConcurrentChains(t *testing.T) {
	backends(t, func(t *testing.T, b storage.Backend) {
		ctx := context.Background()
		f := newFixture(t, b)
		f.mustExec(f.hmac, "builtin.bulk_load", `{"prefix":"k","first":0,"count":4,"payload":"p"}`)
		const workers, each = 8, 15
		var mu sync.Mutex
		committed := map[string]int64{}
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < each; i++ {
					id := fmt.Sprintf("k%d", (w+i)%4)
					r := &Request{Nonce: fmt.Sprintf("w%d-%d", w, i), ContractID: "builtin.ycsb_f",
						Argument: []byte(fmt.Sprintf(`{"id":%q,"payload":"w%d-%d"}`, id, w, i)), Entity: "alice", KeyVersion: 1}
					r.Signature, _ = f.hmac.signer.Sign(r.SigningBytes())
					res, err := f.l.Execute(ctx, r)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					committed[r.Nonce] = res.Proofs[0].Age
					mu.Unlock()
				}
			}(w)
		}
		wg.Wait()
		total := 0
		for k := 0; k < 4; k++ {
			id := fmt.Sprintf("k%d", k)
			val, err := f.l.ValidateLedger(ctx, id, 0, -1)
			if err != nil || val.Fault != nil {
				t.Fatalf("validate %s: %+v %v", id, val.Fault, err)
			}
			total += val.Checked - 1
			hist, err := f.l.History(ctx, id, ScanRange{End: -1, Ascending: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range hist.Versions[1:] {
				if committed[v.Nonce] != v.Age {
					t.Fatalf("%s age %d written by %s, which was acknowledged at age %d", id, v.Age, v.Nonce, committed[v.Nonce])
				}
			}
		}
		if total != workers*each {
			t.Fatalf("%d versions after the load, want %d", total, workers*each)
		}
	})
}

// flakyBackend fails the next n reads of the heads table inside
// transactions with a retryable conflict.
type flakyBackend struct {
	storage.Backend
	n atomic.Int32
}

func (b *flakyBackend) Begin(ctx context.Context) (storage.Txn, error) {
	tx, err := b.Backend.Begin(ctx)
	return &flakyTxn{Txn: tx, b: b}, err
}

type flakyTxn struct {
	storage.Txn
	b *flakyBackend
}

func (t *flakyTxn) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	if g.Table == tHeads && t.b.n.Add(-1) >= 0 {
		return nil, false, fmt.Errorf("%w: injected", storage.ErrConflict)
	}
	return t.Txn.Get(ctx, g)
}

// TestStoreFailureInsideContract: a storage conflict met by a Starlark
// contract's get is the store's failure, not the contract's. The
// transaction is retried and commits; nothing is recorded as aborted. A
// failure that does not clear reaches the caller as the storage error and
// leaves the nonce unused.
func TestStoreFailureInsideContract(t *testing.T) {
	fb := &flakyBackend{Backend: openEngine(t)}
	f := newFixture(t, fb)
	ctx := context.Background()
	const src = "def invoke(ledger, args):\n    cur = ledger.get('k')\n    ledger.put('k', 1 if cur == None else cur['value'] + 1)\n    return 0\n"
	if err := f.register(f.hmac, "inc", src); err != nil {
		t.Fatal(err)
	}
	fb.n.Store(2)
	res, err := f.exec(f.hmac, "inc", `{}`)
	if err != nil {
		t.Fatalf("a transient conflict inside a contract must be retried: %v", err)
	}
	if st, _ := f.l.TxState(ctx, res.Nonce); st.Status != TxCommitted {
		t.Fatalf("state %+v", st)
	}
	fb.n.Store(1 << 20) // never clears
	r := f.request(f.hmac, "inc", `{}`)
	_, err = f.l.Execute(ctx, r)
	if !errors.Is(err, storage.ErrConflict) || errors.Is(err, ErrContractFailed) {
		t.Fatalf("a lasting storage failure must surface as itself: %v", err)
	}
	fb.n.Store(0)
	if st, _ := f.l.TxState(ctx, r.Nonce); st.Status != TxUnknown {
		t.Fatalf("nothing may be recorded for a request storage failed: %+v", st)
	}
	if _, err := f.l.Execute(ctx, r); err != nil {
		t.Fatalf("the nonce must still be usable: %v", err)
	}
}

// tearBackend runs interleave once, the first time a transaction reads the
// head of asset "b": a commit that lands between a contract's reads.
type tearBackend struct {
	storage.Backend
	interleave atomic.Pointer[func()]
}

func (b *tearBackend) Begin(ctx context.Context) (storage.Txn, error) {
	tx, err := b.Backend.Begin(ctx)
	return &tearTxn{Txn: tx, b: b}, err
}

type tearTxn struct {
	storage.Txn
	b *tearBackend
}

func (t *tearTxn) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	if g.Table == tHeads && g.Partition["id"].AsText() == "b" {
		if f := t.b.interleave.Swap(nil); f != nil {
			(*f)()
		}
	}
	return t.Txn.Get(ctx, g)
}

// TestFailureOnTornReadIsRetried: a contract that fails because it read
// a and b from different commits (a state that never existed) must not
// have that failure recorded: the abort commits in the transaction that
// read, so the torn read is caught as a conflict, and the retry sees a
// consistent state and commits.
func TestFailureOnTornReadIsRetried(t *testing.T) {
	tb := &tearBackend{Backend: openEngine(t)}
	f := newFixture(t, tb)
	ctx := context.Background()
	for id, src := range map[string]string{
		"set":   "def invoke(ledger, args):\n    ledger.put('a', args)\n    ledger.put('b', args)\n    return 0\n",
		"check": "def invoke(ledger, args):\n    a = ledger.get('a')['value']\n    b = ledger.get('b')['value']\n    if a != b:\n        fail('torn: a=%d b=%d' % (a, b))\n    ledger.put('c', a)\n    return a\n",
	} {
		if err := f.register(f.hmac, id, src); err != nil {
			t.Fatal(err)
		}
	}
	f.mustExec(f.hmac, "set", `1`)
	interleave := func() { f.mustExec(f.hmac, "set", `2`) }
	tb.interleave.Store(&interleave)
	r := f.request(f.hmac, "check", `{}`)
	res, err := f.l.Execute(ctx, r)
	if tb.interleave.Load() != nil {
		t.Fatal("the interleaving commit never ran")
	}
	if err != nil {
		t.Fatalf("a failure decided on a torn read was reported: %v", err)
	}
	if string(res.Result) != "2" {
		t.Fatalf("result %s, want 2", res.Result)
	}
	if st, _ := f.l.TxState(ctx, r.Nonce); st.Status != TxCommitted {
		t.Fatalf("state %+v, want committed", st)
	}
}

// TestNullStoredColumn: a stored row with a NULL column is reported as an
// error, not a crash.
func TestNullStoredColumn(t *testing.T) {
	f := newFixture(t, openEngine(t))
	ctx := context.Background()
	res := f.mustExec(f.hmac, "builtin.bulk_load", `{"prefix":"k","first":0,"count":1,"payload":"x"}`)
	if err := f.b.Put(ctx, &storage.Put{Namespace: f.l.ns, Table: tTxStates, Partition: storage.Values{"nonce": storage.Text(res.Nonce)},
		Values: storage.Values{"signature": storage.Null()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.l.TxState(ctx, res.Nonce); err == nil || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("NULL column: %v", err)
	}
	if err := f.b.Put(ctx, &storage.Put{Namespace: f.l.ns, Table: tHeads, Partition: storage.Values{"id": storage.Text("k0")},
		Values: storage.Values{"hash": storage.Null()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.exec(f.hmac, "builtin.ycsb_f", `{"id":"k0","payload":"y"}`); err == nil || errors.Is(err, ErrContractFailed) {
		t.Fatalf("a NULL head column must fail the request as a storage fault: %v", err)
	}
}

// TestStarlarkGlobalsFrozen: top-level values are shared by every
// execution, read-only; mutating one fails the contract (deterministically)
// instead of leaking state into the next transaction.
func TestStarlarkGlobalsFrozen(t *testing.T) {
	f := newFixture(t, openEngine(t))
	const src = "seen = []\nLIMIT = 3\ndef invoke(ledger, args):\n    if args.get('mutate'):\n        seen.append(1)\n    return LIMIT + len(seen)\n"
	if err := f.register(f.hmac, "g", src); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if res := f.mustExec(f.hmac, "g", `{}`); string(res.Result) != "3" {
			t.Fatalf("result %s", res.Result)
		}
	}
	if _, err := f.exec(f.hmac, "g", `{"mutate":true}`); !errors.Is(err, ErrContractFailed) || !strings.Contains(err.Error(), "frozen") {
		t.Fatalf("mutating a global: %v", err)
	}
}

// loadFailBackend fails one read of contract "inner"'s source with the
// error it is armed with, as a storage hiccup would.
type loadFailBackend struct {
	storage.Backend
	fail atomic.Pointer[error]
}

func (b *loadFailBackend) Get(ctx context.Context, g *storage.Get) (storage.Row, bool, error) {
	if g.Table == tContracts && g.Clustering["id"].AsText() == "inner" {
		if err := b.fail.Swap(nil); err != nil {
			return nil, false, *err
		}
	}
	return b.Backend.Get(ctx, g)
}

// TestNestedLoadFailureIsNotAnAbort: a storage failure while loading a
// contract that another calls is the store's fault, not the contract's. A
// retryable one is retried; another reaches the caller as it is. Neither
// is recorded as the nonce's abort, so the request can be sent again.
func TestNestedLoadFailureIsNotAnAbort(t *testing.T) {
	b := &loadFailBackend{Backend: openEngine(t)}
	f := newFixture(t, b)
	ctx := context.Background()
	for id, src := range map[string]string{
		"inner": "def invoke(ledger, args):\n    ledger.put('n', args)\n    return args\n",
		"outer": "def invoke(ledger, args):\n    return ledger.call('inner', args)\n",
	} {
		if err := f.register(f.hmac, id, src); err != nil {
			t.Fatal(err)
		}
	}
	var retryable error = &storage.Error{Kind: storage.ErrUnavailable, Op: "get", Detail: "injected"}
	b.fail.Store(&retryable)
	res, err := f.l.Execute(ctx, f.request(f.hmac, "outer", `7`))
	if b.fail.Load() != nil {
		t.Fatal("the contract's source was never read")
	}
	if err != nil || string(res.Result) != "7" {
		t.Fatalf("a retryable failure loading the nested contract: %v, %v; want it retried and committed", res, err)
	}

	f.l.contracts.Delete("inner") // read the source again
	hard := errors.New("injected read failure")
	b.fail.Store(&hard)
	r := f.request(f.hmac, "outer", `8`)
	if _, err := f.l.Execute(ctx, r); !errors.Is(err, hard) || errors.Is(err, ErrContractFailed) {
		t.Fatalf("Execute with the nested load failing: %v, want the storage failure itself", err)
	}
	if st, err := f.l.TxState(ctx, r.Nonce); err == nil && st.Status == TxAborted {
		t.Fatalf("the storage failure was recorded as an abort: %+v", st)
	}
	if res, err := f.l.Execute(ctx, r); err != nil || string(res.Result) != "8" {
		t.Fatalf("the same request sent again: %v, %v", res, err)
	}
}

// TestBuiltinArgumentsAreStrict: a built-in reads its argument under the
// rules a Starlark contract's argument meets, so one signed argument has
// one reading: duplicate keys, keys in another case and unknown keys are
// refused, and nothing is written.
func TestBuiltinArgumentsAreStrict(t *testing.T) {
	f := newFixture(t, openEngine(t))
	ctx := context.Background()
	f.mustExec(f.hmac, "builtin.bulk_load", `{"prefix":"k","first":0,"count":1,"payload":"x"}`)
	for _, args := range []string{
		`{"id":"k0","id":"k1","payload":"y"}`,
		`{"ID":"k0","payload":"y"}`,
		`{"id":"k0","payload":"y","extra":1}`,
		`{"id":"k0","payload":"y"} {}`,
		`["k0"]`,
		`{"id":"k0","payload":"y","payload":"z"}`,
		`{"id":"k0","payload":"y","x":{"id":"k1"}}`,
		`{"i\"d":"k0","id":"k0","payload":"y"}`,
	} {
		if _, err := f.exec(f.hmac, "builtin.ycsb_f", args); !errors.Is(err, ErrBadArgument) {
			t.Errorf("ycsb_f %s: %v, want ErrBadArgument", args, err)
		}
	}
	for _, args := range []string{`{"ids":["k0"],"ids":["k1"]}`, `{"Ids":["k0"]}`} {
		if _, err := f.exec(f.hmac, "builtin.ycsb_c", args); !errors.Is(err, ErrBadArgument) {
			t.Errorf("ycsb_c %s: %v, want ErrBadArgument", args, err)
		}
	}
	if _, err := f.exec(f.hmac, "builtin.bulk_load", `{"prefix":"k","first":5,"count":1,"count":2,"payload":"x"}`); !errors.Is(err, ErrBadArgument) {
		t.Errorf("bulk_load with two counts: %v, want ErrBadArgument", err)
	}
	if latest, err := f.l.Latest(ctx, "k0"); err != nil || latest != 0 {
		t.Fatalf("k0 at age %d (%v) after refused requests; want 0", latest, err)
	}
	if latest, err := f.l.Latest(ctx, "k5"); err != nil || latest != -1 {
		t.Fatalf("k5 at age %d (%v) after a refused bulk load; want none", latest, err)
	}
	f.mustExec(f.hmac, "builtin.ycsb_f", `{"id":"k0","payload":"y"}`)
}

func TestUnknownKey(t *testing.T) {
	for _, c := range []struct {
		in, key string
	}{
		{`{"ids":[{"zz":1},"a,\"b"],"n":{"q":[1]}}`, ""},
		{`{}`, ""},
		{`{"a\"b":1,"ids":2}`, `"a\"b"`},
		{`{"ids":{"x":1},"zz":[]}`, `"zz"`},
	} {
		key, ok := unknownKey([]byte(c.in), []string{"ids", "n"})
		if ok != (c.key == "") || key != c.key {
			t.Errorf("unknownKey(%s) = %q, %v; want %q", c.in, key, ok, c.key)
		}
	}
}

// TestRolledBackHead: the latest version of an asset is deleted and its
// head rolled back to the version before, as an operator editing the
// database would. The transaction that wrote it is still recorded as
// committed, and it wrote another asset too: validating that other asset
// names the missing write, without a Validator. (Validating the rolled-back
// asset alone finds a consistent, shorter chain: a write that left no trace
// on any other asset is for the Validator's cross-check to find.)
func TestRolledBackHead(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, openEngine(t))
	const transfer = `def invoke(ledger, args):
    for id in ("a", "b"):
        cur = ledger.get(id)
        n = 0
        if cur != None:
            n = cur["value"]
        ledger.put(id, n + args["d"])
    return None
`
	if err := f.register(f.hmac, "transfer", transfer); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		f.mustExec(f.hmac, "transfer", fmt.Sprintf(`{"d":%d}`, i))
	}
	// Roll asset b back to age 1: its version 2 is deleted, its head points
	// at version 1 again.
	v1, err := f.l.Version(ctx, "b", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.b.Delete(ctx, &storage.Delete{Namespace: f.l.ns, Table: AssetsTable,
		Partition: storage.Values{"id": storage.Text("b")}, Clustering: storage.Values{"age": storage.BigInt(2)}}); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Put(ctx, newRequests(f.l.ns).headPut(v1)); err != nil {
		t.Fatal(err)
	}
	val, err := f.l.ValidateLedger(ctx, "a", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if val.Fault == nil || val.Fault.Age != 2 || val.Fault.Check != CheckNonce || !strings.Contains(val.Fault.Detail, "b@2") ||
		strings.Contains(val.Fault.Detail, "map[") {
		t.Fatalf("validating a: %+v, fault %+v; want a nonce fault at age 2 naming b@2 for people", val, val.Fault)
	}
}
