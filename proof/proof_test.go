package proof_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/proof"
)

// TestKinds: every kind names one sentinel, which names it back, also
// wrapped; names are unique; an unknown name or error has no kind.
func TestKinds(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range proof.Kinds() {
		if k == "" || seen[k] {
			t.Fatalf("kind %q is empty or repeated", k)
		}
		seen[k] = true
		s := proof.KindError(k)
		if s == nil {
			t.Fatalf("KindError(%q) = nil", k)
		}
		if got := proof.Kind(fmt.Errorf("context: %w", s)); got != k {
			t.Errorf("Kind of wrapped %v = %q, want %q", s, got, k)
		}
	}
	if proof.KindError("no_such_kind") != nil || proof.Kind(errors.New("other")) != "" || proof.Kind(nil) != "" {
		t.Error("an unknown kind or error has a sentinel")
	}
	if !errors.Is(proof.ErrBadSignature, auth.ErrBadSignature) {
		t.Error("ErrBadSignature is not auth's")
	}
}

// TestSignVerify: what Sign signs Verify accepts, and nothing else: not a
// record with a field changed, and not a record of another kind with the
// same field values (each kind's bytes start with its own domain tag).
func TestSignVerify(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, 32)
	s, err := auth.NewHMACSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewHMACVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	req := &proof.Request{Nonce: "n", ContractID: "c", Argument: []byte(`{}`), Entity: "e", KeyVersion: 1}
	reg := &proof.ContractRegistration{ID: "n", Source: []byte("c"), Entity: "e", KeyVersion: 1}
	sig, err := proof.Sign(s, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.Verify(v, req, sig); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if m, _ := s.Sign(req.SigningBytes()); !bytes.Equal(m, sig) {
		t.Error("Sign does not sign SigningBytes")
	}
	changed := *req
	changed.KeyVersion = 2
	for _, x := range []proof.Signed{&changed, reg, &proof.Proof{ID: "n"}, &proof.Receipt{Nonce: "n", Contract: "c"}} {
		if err := proof.Verify(v, x, sig); !errors.Is(err, proof.ErrBadSignature) {
			t.Errorf("a request's signature verifies for %#v: %v", x, err)
		}
	}

	// A version's proof, and a committed state's receipt, carry what was
	// signed.
	ver := &proof.Version{ID: "a", Age: 1, Input: map[string]int64{"b": -1}, Output: []byte(`1`), Contract: "c",
		Nonce: "n", Entity: "e", KeyVersion: 1, Signature: sig, PrevHash: bytes.Repeat([]byte{1}, 32)}
	ver.Hash = ver.ComputeHash()
	p := ver.Proof()
	if ver.ProofSignature, err = proof.Sign(s, &p); err != nil {
		t.Fatal(err)
	}
	if p := ver.Proof(); proof.Verify(v, &p, p.Signature) != nil || !bytes.Equal(p.Hash, ver.Hash) {
		t.Error("a version's proof does not verify")
	}
	rc := proof.Receipt{Nonce: "n", Contract: "c", Input: ver.Input, Writes: map[string]int64{"a": 1}, Result: []byte(`null`)}
	if rc.Signature, err = proof.Sign(s, &rc); err != nil {
		t.Fatal(err)
	}
	st := &proof.TxState{Nonce: rc.Nonce, Status: proof.TxCommitted, Contract: rc.Contract, Result: rc.Result,
		Writes: rc.Writes, Input: rc.Input, Signature: rc.Signature}
	if got := st.Receipt(); proof.Verify(v, &got, got.Signature) != nil {
		t.Error("a committed state's receipt does not verify")
	}
}

// TestAuditorRecords: an order token, an approval and an abort verify,
// name exactly the request, receipt or nonce they were made for, and
// cannot pass for each other or for the ledger's records.
func TestAuditorRecords(t *testing.T) {
	s, _ := auth.NewHMACSigner(bytes.Repeat([]byte{9}, 32))
	v, _ := auth.NewHMACVerifier(bytes.Repeat([]byte{9}, 32))
	req := &proof.Request{Nonce: "n", ContractID: "c", Argument: []byte(`{}`), Entity: "e", KeyVersion: 1, Signature: []byte("sig")}
	other := *req
	other.Argument = []byte(`{"x":1}`)
	resigned := *req
	resigned.Signature = []byte("gis")
	d := proof.RequestDigest(req)
	if bytes.Equal(d, proof.RequestDigest(&other)) || bytes.Equal(d, proof.RequestDigest(&resigned)) {
		t.Fatal("two requests have one digest")
	}
	tok := &proof.OrderToken{Nonce: "n", Digest: d, Deadline: 1234}
	sig, err := proof.Sign(s, tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.Verify(v, tok, sig); err != nil {
		t.Fatal(err)
	}
	later := *tok
	later.Deadline++
	rc := &proof.Receipt{Nonce: "n", Contract: "c", Result: []byte(`1`), Signature: []byte("ledger")}
	ap := &proof.Approval{Nonce: "n", Digest: proof.ReceiptDigest(rc)}
	ab := &proof.AbortRequest{Nonce: "n", Deadline: 1234}
	for _, x := range []proof.Signed{&later, ap, req, rc, ab} {
		if err := proof.Verify(v, x, sig); !errors.Is(err, proof.ErrBadSignature) {
			t.Errorf("a token's signature verifies for %#v: %v", x, err)
		}
	}
	// An abort binds its nonce, reason and deadline.
	asig, err := proof.Sign(s, ab)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []*proof.AbortRequest{{Nonce: "m", Deadline: 1234}, {Nonce: "n", Reason: "r", Deadline: 1234}, {Nonce: "n", Deadline: 1235}} {
		if err := proof.Verify(v, x, asig); !errors.Is(err, proof.ErrBadSignature) {
			t.Errorf("an abort's signature verifies for %+v: %v", x, err)
		}
	}
	if err := proof.Verify(v, ab, asig); err != nil {
		t.Fatal(err)
	}
	forged := *rc
	forged.Result = []byte(`2`)
	if bytes.Equal(ap.Digest, proof.ReceiptDigest(&forged)) {
		t.Fatal("an approval's digest names a receipt with another result")
	}
}
