package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/wire"
)

const putContract = "def invoke(ledger, args):\n    ledger.put(args['id'], args['v'])\n    return args['v']\n"

// auditorKey returns a new ECDSA key, its signer and its public key PEM.
func auditorKey(t *testing.T) (auth.Signer, []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := auth.NewECDSASigner(k)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auth.MarshalPublicKeyPEM(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return s, pub
}

// signedToken is the token signer gives req, expiring in a minute.
func signedToken(t *testing.T, signer auth.Signer, req *proof.Request) *proof.OrderToken {
	t.Helper()
	tok := &proof.OrderToken{Nonce: req.Nonce, Digest: proof.RequestDigest(req), Deadline: time.Now().Add(time.Minute).UnixMilli()}
	var err error
	if tok.Signature, err = proof.Sign(signer, tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestLedgerWithAuditorOverTheWire: a server started with an Auditor's
// key refuses, over both the stream and unary calls, a request without
// that Auditor's token for it (order_token, PERMISSION_DENIED, nothing
// recorded) and runs one with it; AbortNonce is the Auditor's alone
// (not_auditor), and the Auditor's aborts a nonce so that its request can
// no longer run.
func TestLedgerWithAuditorOverTheWire(t *testing.T) {
	ctx := context.Background()
	aud, pub := auditorKey(t)
	other, _ := auditorKey(t)
	srv := startServer(t, Options{AdminToken: "admin-token", AuditorKeyPEM: pub})
	for _, unary := range []bool{false, true} {
		c, err := client.Dial(client.Config{Server: srv.Addr(), Entity: "ann", Secret: make([]byte, 32), AdminToken: "admin-token", UnaryCalls: unary})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !unary {
			if err := c.RegisterSecret(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.RegisterContract(ctx, "put", []byte(putContract)); err != nil {
				t.Fatal(err)
			}
		}
		req, err := c.NewRequest("put", []byte(`{"id":"k","v":1}`))
		if err != nil {
			t.Fatal(err)
		}
		for name, tok := range map[string]*proof.OrderToken{"none": nil, "another key's": signedToken(t, other, req)} {
			_, err := c.ExecuteOrdered(ctx, req, tok)
			var ce *client.Error
			if !errors.Is(err, proof.ErrOrderToken) || !errors.As(err, &ce) || ce.Code != codes.PermissionDenied {
				t.Fatalf("unary=%v, %s token: %v, want order_token", unary, name, err)
			}
		}
		if st, err := c.TxState(ctx, req.Nonce); err != nil || st.Status != proof.TxUnknown {
			t.Fatalf("a refused request left state %v (%v)", st, err)
		}
		if _, err := c.ExecuteOrdered(ctx, req, signedToken(t, aud, req)); err != nil {
			t.Fatalf("unary=%v, with the Auditor's token: %v", unary, err)
		}
	}

	c, err := client.Dial(client.Config{Server: srv.Addr(), Entity: "ann", Secret: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	abort := func(signer auth.Signer, nonce string, deadline time.Time) (*proof.TxState, error) {
		r := &proof.AbortRequest{Nonce: nonce, Reason: "its lease ran out", Deadline: deadline.UnixMilli()}
		if r.Signature, err = proof.Sign(signer, r); err != nil {
			t.Fatal(err)
		}
		return c.AbortNonce(ctx, r)
	}
	req, _ := c.NewRequest("put", []byte(`{"id":"k","v":2}`))
	if _, err := abort(other, req.Nonce, time.Now().Add(time.Minute)); !errors.Is(err, proof.ErrNotAuditor) {
		t.Fatalf("an abort signed with another key: %v, want not_auditor", err)
	}
	if _, err := abort(aud, req.Nonce, time.Now().Add(-time.Second)); !errors.Is(err, proof.ErrNotAuditor) {
		t.Fatalf("an expired abort: %v, want not_auditor", err)
	}
	// Raw, to see the code and the trailer the SDK turns into the sentinel.
	conn := rawConn(t, srv)
	var trailer metadata.MD
	_, err = api.NewLedgerClient(conn).AbortNonce(ctx, &api.AbortNonceRequest{Nonce: req.Nonce, DeadlineMillis: time.Now().Add(time.Minute).UnixMilli(),
		Signature: []byte("not a signature")}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.PermissionDenied || trailer.Get(wire.ErrorKindKey)[0] != "not_auditor" {
		t.Fatalf("an unsigned abort: %v, trailer %v", err, trailer)
	}
	if st, _ := c.TxState(ctx, req.Nonce); st.Status != proof.TxUnknown {
		t.Fatalf("a refused abort left state %s", st.Status)
	}
	st, err := abort(aud, req.Nonce, time.Now().Add(time.Minute))
	if err != nil || st.Status != proof.TxAborted {
		t.Fatalf("the Auditor's abort: %+v, %v", st, err)
	}
	if _, err := c.ExecuteOrdered(ctx, req, signedToken(t, aud, req)); !errors.Is(err, proof.ErrNonceReused) {
		t.Fatalf("a request whose nonce the Auditor aborted: %v, want nonce_reused", err)
	}
}

// TestAbortNeedsAnAuditor: a server without an Auditor refuses every
// abort, and runs requests without tokens.
func TestAbortNeedsAnAuditor(t *testing.T) {
	ctx := context.Background()
	aud, _ := auditorKey(t)
	srv := startServer(t, Options{})
	c, err := client.Dial(client.Config{Server: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &proof.AbortRequest{Nonce: "n1", Deadline: time.Now().Add(time.Minute).UnixMilli()}
	r.Signature, _ = proof.Sign(aud, r)
	if _, err := c.AbortNonce(ctx, r); !errors.Is(err, ledger.ErrNotAuditor) {
		t.Fatalf("an abort on a ledger without an Auditor: %v", err)
	}
}
