package auditor

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
)

const transfer = `
def invoke(ledger, args):
    a = ledger.get(args["from"])
    b = ledger.get(args["to"])
    av = 100 if a == None else a["value"]
    bv = 100 if b == None else b["value"]
    ledger.put(args["from"], av - args["n"])
    ledger.put(args["to"], bv + args["n"])
    return {"from": av - args["n"], "to": bv + args["n"]}
`

// domains is a ledger and an Auditor, each on its own engine with its own
// key, and one HMAC client enrolled in both.
type domains struct {
	t         *testing.T
	ledger    *ledger.Ledger
	ledgerKey auth.Signer
	aud       *Auditor
	audKey    auth.Verifier
	cfg       Config
	client    auth.Signer
	now       time.Time
	seq       int
}

func newDomains(t *testing.T) *domains {
	t.Helper()
	ctx := context.Background()
	var d *domains
	var db *engine.DB
	open := func(signer auth.Signer, verifier, auditor auth.Verifier) *ledger.Ledger {
		edb, err := engine.Open(engine.Config{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { edb.Close() })
		db = edb
		box, _ := auth.NewSecretBox(bytes.Repeat([]byte{3}, 32))
		l, err := ledger.Open(ctx, ledger.Config{Backend: edb, Signer: signer, ProofVerifier: verifier, Secrets: box,
			Auditor: auditor, Now: func() time.Time { return d.now }})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	key := func() (auth.Signer, auth.Verifier) {
		k := make([]byte, 32)
		rand.Read(k)
		s, _ := auth.NewHMACSigner(k)
		v, _ := auth.NewHMACVerifier(k)
		return s, v
	}
	ls, lv := key()
	as, av := key()
	d = &domains{t: t, ledgerKey: ls, audKey: av, now: time.Unix(1_000_000, 0)}
	d.ledger = open(ls, lv, av)
	replica := open(ls, lv, nil) // the replica holds the ledger's versions: its proofs verify with the ledger's key
	d.cfg = Config{Replica: replica, DB: db, Signer: as, LedgerKey: lv, Ledger: d.ledger, Lease: 5 * time.Second,
		Now: func() time.Time { return d.now }}
	var err error
	d.aud, err = Open(ctx, d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, 32)
	d.client, _ = auth.NewHMACSigner(secret)
	for _, l := range []*ledger.Ledger{d.ledger, replica} {
		if err := l.RegisterSecret(ctx, "alice", 1, secret); err != nil {
			t.Fatal(err)
		}
		reg := &ledger.ContractRegistration{ID: "transfer", Source: []byte(transfer), Entity: "alice", KeyVersion: 1}
		reg.Signature, _ = d.client.Sign(reg.SigningBytes())
		if err := l.RegisterContract(ctx, reg); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func (d *domains) request(from, to string, n int) *proof.Request {
	d.seq++
	r := &proof.Request{Nonce: fmt.Sprintf("n%d", d.seq), ContractID: "transfer", Entity: "alice", KeyVersion: 1,
		Argument: []byte(fmt.Sprintf(`{"from":%q,"n":%d,"to":%q}`, from, n, to))}
	r.Signature, _ = d.client.Sign(r.SigningBytes())
	return r
}

// run takes req through the three phases and returns the approval.
func (d *domains) run(req *proof.Request) (*proof.Approval, *proof.Result, error) {
	ctx := context.Background()
	tok, err := d.aud.Order(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	if err := proof.Verify(d.audKey, tok, tok.Signature); err != nil || !bytes.Equal(tok.Digest, proof.RequestDigest(req)) {
		d.t.Fatalf("token does not verify or name the request: %v", err)
	}
	res, err := d.ledger.ExecuteOrdered(ctx, req, tok)
	if err != nil {
		return nil, nil, err
	}
	ap, err := d.aud.Validate(ctx, req, res)
	return ap, res, err
}

// TestHonest: requests taken through the three phases are approved, the
// approvals verify with the Auditor's key and name the receipts, and the
// replica ends with the ledger's history.
func TestHonest(t *testing.T) {
	d := newDomains(t)
	for i := range 10 {
		req := d.request(fmt.Sprintf("a%d", i%3), fmt.Sprintf("a%d", (i+1)%3), i)
		ap, res, err := d.run(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := proof.Verify(d.audKey, ap, ap.Signature); err != nil || !bytes.Equal(ap.Digest, proof.ReceiptDigest(&res.Receipt)) {
			t.Fatalf("approval: %v", err)
		}
	}
	ctx := context.Background()
	for i := range 3 {
		id := fmt.Sprintf("a%d", i)
		want, err := d.ledger.Latest(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.aud.cfg.Replica.Latest(ctx, id)
		if err != nil || got != want {
			t.Fatalf("replica %s at %d (%v), ledger at %d", id, got, err, want)
		}
		v, err := d.aud.cfg.Replica.ValidateLedger(ctx, id, 0, -1)
		if err != nil || v.Fault != nil {
			t.Fatalf("validate-ledger on the replica: %+v %v", v, err)
		}
	}
	if d.aud.Pending() != 0 || d.aud.locks.size() != 0 {
		t.Fatalf("%d orders, %d lock holders left", d.aud.Pending(), d.aud.locks.size())
	}
}

// TestOrdering: a request that conflicts with an ordered one waits for its
// validation; one on other assets does not.
func TestOrdering(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	first := d.request("x", "y", 1)
	tok1, err := d.aud.Order(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := d.aud.Order(short, d.request("y", "z", 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a conflicting request was ordered beside the first: %v", err)
	}
	if _, err := d.aud.Order(ctx, d.request("p", "q", 1)); err != nil {
		t.Fatalf("a request on other assets: %v", err)
	}
	waiting := make(chan error, 1)
	second := d.request("y", "z", 2)
	var tok2 *proof.OrderToken
	go func() {
		var err error
		tok2, err = d.aud.Order(ctx, second)
		waiting <- err
	}()
	res, err := d.ledger.ExecuteOrdered(ctx, first, tok1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.aud.Validate(ctx, first, res); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	// The second ran on the first's outcome: y was 101 before it.
	res, err = d.ledger.ExecuteOrdered(ctx, second, tok2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.aud.Validate(ctx, second, res); err != nil {
		t.Fatalf("second: %v", err)
	}
	if string(res.Result) != `{"from":99,"to":102}` {
		t.Fatalf("second's result %s", res.Result)
	}
}

// TestFaults: a ledger that signs another result, other reads or writes,
// or another contract is caught at Validation, with the check named, and
// the replica does not take its versions.
func TestFaults(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		check  string
		tamper func(d *domains, res *proof.Result)
	}{
		{"result", func(d *domains, res *proof.Result) { res.Result = []byte(`{"from":0,"to":0}`) }},
		{"input", func(d *domains, res *proof.Result) { res.Input["x"] = 5 }},
		{"hash", func(d *domains, res *proof.Result) { res.Proofs[0].Hash = bytes.Repeat([]byte{1}, 32) }},
		{"version", func(d *domains, res *proof.Result) { res.Proofs[0].Age++; res.Writes[res.Proofs[0].ID]++ }},
		{"receipt", func(d *domains, res *proof.Result) { res.Contract = "other" }},
	} {
		t.Run(c.check, func(t *testing.T) {
			d := newDomains(t)
			req := d.request("x", "y", 1)
			tok, err := d.aud.Order(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			res, err := d.ledger.ExecuteOrdered(ctx, req, tok)
			if err != nil {
				t.Fatal(err)
			}
			c.tamper(d, res)
			// A Byzantine ledger signs what it returns.
			for i := range res.Proofs {
				res.Proofs[i].Signature, _ = proof.Sign(d.ledgerKey, &res.Proofs[i])
			}
			res.Signature, _ = proof.Sign(d.ledgerKey, &res.Receipt)
			_, err = d.aud.Validate(ctx, req, res)
			var f *ByzantineFault
			if !errors.As(err, &f) || f.Check != c.check || !errors.Is(err, ErrByzantineFault) {
				t.Fatalf("validation of a tampered result: %v, want a %s fault", err, c.check)
			}
			if age, _ := d.aud.cfg.Replica.Latest(ctx, "x"); age != -1 {
				t.Fatalf("the replica took a version of a faulty transaction: x@%d", age)
			}
		})
	}
}

// TestLeaseRecovery: an ordered request whose client vanished is settled
// when its lease runs out — aborted on the ledger if it never ran there,
// so that it never can, or validated from the ledger if it committed —
// and the locks go to the next request.
func TestLeaseRecovery(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	lost := d.request("x", "y", 1) // ordered, never sent to the ledger
	lostTok, err := d.aud.Order(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}
	committed := d.request("p", "q", 1) // ordered and committed, never validated
	tok, err := d.aud.Order(ctx, committed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.ledger.ExecuteOrdered(ctx, committed, tok); err != nil {
		t.Fatal(err)
	}
	if n, err := d.aud.Recover(ctx); n != 0 || err != nil {
		t.Fatalf("recovered %d (%v) before any lease ran out", n, err)
	}
	d.now = d.now.Add(6 * time.Second)
	if n, err := d.aud.Recover(ctx); n != 2 || err != nil {
		t.Fatalf("recovered %d: %v", n, err)
	}
	// Its token has expired; and were the ledger's clock behind, the
	// nonce is recorded as aborted.
	if _, err := d.ledger.ExecuteOrdered(ctx, lost, lostTok); !errors.Is(err, ledger.ErrOrderToken) {
		t.Fatalf("the lost request ran on the ledger with an expired token: %v", err)
	}
	d.now = d.now.Add(-6 * time.Second)
	if _, err := d.ledger.ExecuteOrdered(ctx, lost, lostTok); !errors.Is(err, ledger.ErrNonceReused) {
		t.Fatalf("the lost request ran on the ledger after its order was settled: %v", err)
	}
	d.now = d.now.Add(6 * time.Second)
	if age, _ := d.aud.cfg.Replica.Latest(ctx, "q"); age != 0 {
		t.Fatalf("the committed request was not validated into the replica: q@%d", age)
	}
	if _, _, err := d.run(d.request("y", "q", 1)); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

// TestTokens: a ledger with an Auditor runs nothing without the Auditor's
// token for exactly that request, signed with its key and unexpired.
func TestTokens(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	req := d.request("x", "y", 1)
	tok, err := d.aud.Order(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	other := d.request("x", "y", 2)
	forged := *tok
	forged.Signature, _ = proof.Sign(d.ledgerKey, &forged)
	late := *tok
	late.Deadline = d.now.UnixMilli() - 1
	late.Signature, _ = proof.Sign(d.aud.cfg.Signer, &late)
	for name, c := range map[string]struct {
		req *proof.Request
		tok *proof.OrderToken
	}{"none": {req, nil}, "another request's": {other, tok}, "forged": {req, &forged}, "expired": {req, &late}} {
		if _, err := d.ledger.ExecuteOrdered(ctx, c.req, c.tok); !errors.Is(err, ledger.ErrOrderToken) {
			t.Errorf("%s token: %v, want ErrOrderToken", name, err)
		}
	}
	if _, err := d.ledger.Execute(ctx, req); !errors.Is(err, ledger.ErrOrderToken) {
		t.Errorf("Execute on a ledger with an Auditor: %v", err)
	}
	if st, _ := d.ledger.TxState(ctx, req.Nonce); st.Status != ledger.TxUnknown {
		t.Fatalf("a refused request left state %s", st.Status)
	}
	if _, err := d.ledger.ExecuteOrdered(ctx, req, tok); err != nil {
		t.Fatalf("with its token: %v", err)
	}
}

// TestRestart: an Auditor opened again takes up the orders it gave and
// did not settle — their locks hold, their tokens still run on the ledger
// and validate — and forgets the ones it settled.
func TestRestart(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	done := d.request("a", "b", 1)
	if _, _, err := d.run(done); err != nil {
		t.Fatal(err)
	}
	open := d.request("b", "c", 1)
	tok, err := d.aud.Order(ctx, open)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Open(ctx, d.cfg) // the same database: a restart
	if err != nil {
		t.Fatal(err)
	}
	if again.Pending() != 1 || !again.locks.holds(open.Nonce) {
		t.Fatalf("after a restart: %d orders, locks held %v", again.Pending(), again.locks.holds(open.Nonce))
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := again.Order(short, d.request("c", "d", 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request conflicting with a reloaded order was ordered: %v", err)
	}
	res, err := d.ledger.ExecuteOrdered(ctx, open, tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Validate(ctx, open, res); err != nil {
		t.Fatalf("validating a reloaded order: %v", err)
	}
	if third, err := Open(ctx, d.cfg); err != nil || third.Pending() != 0 {
		t.Fatalf("after everything was settled a restart finds %d orders (%v)", third.Pending(), err)
	}
}

// TestValidateAgain: a transaction validated already — its Validate's
// reply lost, or settled by recovery before its client came back — is
// approved again for exactly its receipt, and for nothing else.
func TestValidateAgain(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	req := d.request("x", "y", 1)
	first, res, err := d.run(req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := d.aud.Validate(ctx, req, res)
	if err != nil || !bytes.Equal(again.Digest, first.Digest) || proof.Verify(d.audKey, again, again.Signature) != nil {
		t.Fatalf("validating again: %+v, %v", again, err)
	}
	other := *res
	other.Result = []byte(`{"from":0,"to":0}`)
	if _, err := d.aud.Validate(ctx, req, &other); !errors.Is(err, ErrNotOrdered) {
		t.Fatalf("another receipt for a validated nonce: %v, want ErrNotOrdered", err)
	}
	if _, err := d.aud.Validate(ctx, d.request("x", "y", 2), res); !errors.Is(err, ErrNotOrdered) {
		t.Fatalf("a request never ordered: %v, want ErrNotOrdered", err)
	}

	// Committed on the ledger, settled by recovery, then brought.
	late := d.request("p", "q", 1)
	tok, err := d.aud.Order(ctx, late)
	if err != nil {
		t.Fatal(err)
	}
	res, err = d.ledger.ExecuteOrdered(ctx, late, tok)
	if err != nil {
		t.Fatal(err)
	}
	d.now = d.now.Add(6 * time.Second)
	if n, err := d.aud.Recover(ctx); n != 1 || err != nil {
		t.Fatalf("recovered %d: %v", n, err)
	}
	if ap, err := d.aud.Validate(ctx, late, res); err != nil || !bytes.Equal(ap.Digest, proof.ReceiptDigest(&res.Receipt)) {
		t.Fatalf("a recovered transaction brought late: %+v, %v", ap, err)
	}
}

// TestAbortNeedsTheAuditor: the ledger aborts a nonce only at its
// Auditor's signed, unexpired word, and a ledger without an Auditor at
// nobody's.
func TestAbortNeedsTheAuditor(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	sign := func(s auth.Signer, deadline time.Time) *proof.AbortRequest {
		r := &proof.AbortRequest{Nonce: "n1", Reason: "lease", Deadline: deadline.UnixMilli()}
		r.Signature, _ = proof.Sign(s, r)
		return r
	}
	for name, r := range map[string]*proof.AbortRequest{"signed with the ledger's key": sign(d.ledgerKey, d.now.Add(time.Minute)),
		"past its deadline": sign(d.aud.cfg.Signer, d.now.Add(-time.Millisecond))} {
		if _, err := d.ledger.AbortOrdered(ctx, r); !errors.Is(err, ledger.ErrNotAuditor) {
			t.Errorf("an abort %s: %v", name, err)
		}
	}
	if _, err := d.cfg.Replica.AbortOrdered(ctx, sign(d.aud.cfg.Signer, d.now.Add(time.Minute))); !errors.Is(err, ledger.ErrNotAuditor) {
		t.Errorf("an abort on a ledger without an Auditor: %v", err)
	}
	if st, _ := d.ledger.TxState(ctx, "n1"); st.Status != ledger.TxUnknown {
		t.Fatalf("a refused abort recorded %s", st.Status)
	}
	st, err := d.ledger.AbortOrdered(ctx, sign(d.aud.cfg.Signer, d.now.Add(time.Minute)))
	if err != nil || st.Status != ledger.TxAborted || st.Reason != "lease" {
		t.Fatalf("the Auditor's abort: %+v, %v", st, err)
	}
}

// TestUnsignedReplies: a reply the ledger did not sign — altered without
// its key, or the receipt of another transaction — is refused without a
// fault and leaves the order as it was: the real reply then validates.
func TestUnsignedReplies(t *testing.T) {
	ctx := context.Background()
	otherKey, _ := auth.NewHMACSigner(bytes.Repeat([]byte{9}, 32))
	d := newDomains(t)
	req := d.request("x", "y", 1)
	tok, err := d.aud.Order(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.ledger.ExecuteOrdered(ctx, req, tok)
	if err != nil {
		t.Fatal(err)
	}
	otherRes := *res
	otherRes.Nonce = "n2"
	otherRes.Signature, _ = proof.Sign(d.ledgerKey, &otherRes.Receipt)
	for name, tamper := range map[string]func(r *proof.Result){
		"result altered":        func(r *proof.Result) { r.Result = []byte(`{"from":0,"to":0}`) },
		"signed with another":   func(r *proof.Result) { r.Signature, _ = proof.Sign(otherKey, &r.Receipt) },
		"a proof altered":       func(r *proof.Result) { r.Proofs = slices.Clone(r.Proofs); r.Proofs[0].Hash = []byte{1} },
		"another transaction's": func(r *proof.Result) { *r = otherRes },
	} {
		bad := *res
		tamper(&bad)
		_, err := d.aud.Validate(ctx, req, &bad)
		if err == nil || errors.Is(err, ErrByzantineFault) || (!errors.Is(err, ledger.ErrBadSignature) && !errors.Is(err, ledger.ErrBadRequest)) {
			t.Fatalf("%s: %v, want a refusal that is no fault", name, err)
		}
		if d.aud.Pending() != 1 || !d.aud.locks.holds(req.Nonce) {
			t.Fatalf("%s: the order was dropped", name)
		}
	}
	if _, err := d.aud.Validate(ctx, req, res); err != nil {
		t.Fatalf("the real reply after refused ones: %v", err)
	}
}

// TestValidateRacesRecovery: a validation that arrives as recovery
// settles the same order gets its approval either way: the two never
// settle it at once.
func TestValidateRacesRecovery(t *testing.T) {
	d := newDomains(t)
	ctx := context.Background()
	for i := range 20 {
		req := d.request(fmt.Sprintf("x%d", i), fmt.Sprintf("y%d", i), 1)
		tok, err := d.aud.Order(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		res, err := d.ledger.ExecuteOrdered(ctx, req, tok)
		if err != nil {
			t.Fatal(err)
		}
		d.now = d.now.Add(6 * time.Second) // the lease has run out
		recovered := make(chan error, 1)
		go func() { _, err := d.aud.Recover(ctx); recovered <- err }()
		if _, err := d.aud.Validate(ctx, req, res); err != nil {
			t.Fatalf("round %d: a validation racing recovery: %v", i, err)
		}
		if err := <-recovered; err != nil {
			t.Fatalf("round %d: recovery racing a validation: %v", i, err)
		}
	}
}
