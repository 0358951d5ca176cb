package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
)

const token = "0123456789abcdef0123"

func startServer(t *testing.T, o server.Options) *server.Running {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	o.Listen = "127.0.0.1:0"
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Engine.EpochInterval = 5 * time.Millisecond
	r, err := server.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(time.Second) })
	return r
}

func dial(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	c, err := client.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const counter = "def invoke(ledger, args):\n    cur = ledger.get(args['id'])\n    n = 0 if cur == None else cur['value']\n    if n >= args.get('max', 100):\n        fail('counter is full')\n    ledger.put(args['id'], n + 1)\n    return n + 1\n"

func TestEndToEnd(t *testing.T) {
	ctx := context.Background()
	// Two versions per ValidateLedger call: the SDK must ask again.
	srv := startServer(t, server.Options{AdminToken: token, Limits: ledger.Limits{MaxValidateVersions: 2}})
	secret := bytes.Repeat([]byte{7}, 32)
	hc := dial(t, client.Config{Server: srv.Addr(), Entity: "alice", Secret: secret, AdminToken: token})
	keyPEM, certPEM, _ := auth.GenerateIdentity("bob", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	ec := dial(t, client.Config{Server: srv.Addr(), Entity: "bob", PrivateKeyPEM: keyPEM, CertificatePEM: certPEM, AdminToken: token})
	if err := hc.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ec.RegisterCertificate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hc.RegisterContract(ctx, "counter", []byte(counter)); err != nil {
		t.Fatal(err)
	}
	for i, c := range []*client.Client{hc, ec, hc} {
		res, err := c.Execute(ctx, "counter", []byte(`{"id":"c1"}`))
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Result) != fmt.Sprint(i+1) || len(res.Proofs) != 1 || res.Proofs[0].Age != int64(i) {
			t.Fatalf("execute %d: %s %+v", i, res.Result, res.Proofs)
		}
		if err := srv.Ledger.VerifyProof(&res.Proofs[0]); err != nil {
			t.Fatalf("proof from the wire: %v", err)
		}
	}
	hist, err := ec.History(ctx, "c1", proof.ScanRange{End: -1, Ascending: false})
	if err != nil || len(hist) != 3 || hist[0].Age != 2 || string(hist[0].Output) != "3" {
		t.Fatalf("history: %v %v", hist, err)
	}
	for _, v := range hist {
		if !bytes.Equal(v.Hash, v.ComputeHash()) {
			t.Fatalf("version %d: hash does not recompute from the wire form", v.Age)
		}
	}
	p, err := hc.Proof(ctx, "c1", 1)
	if err != nil || srv.Ledger.VerifyProof(p) != nil {
		t.Fatalf("get proof: %+v %v", p, err)
	}
	st, err := hc.TxState(ctx, hist[0].Nonce)
	if err != nil || st.Status != proof.TxCommitted || len(st.Writes) != 1 || st.Writes["c1"] != 2 || srv.Ledger.VerifyReceipt(&proof.Receipt{Nonce: st.Nonce, Contract: st.Contract, Input: st.Input, Writes: st.Writes, Result: st.Result, Signature: st.Signature}) != nil {
		t.Fatalf("tx state: %+v %v", st, err)
	}
	v, err := hc.ValidateLedger(ctx, "c1", 0, -1)
	if err != nil || !v.Ok || v.Checked != 3 || v.StartAge != 0 || v.EndAge != 2 || v.Truncated {
		t.Fatalf("validate: %+v %v", v, err)
	}
	key, err := hc.LedgerKey(ctx)
	if err != nil || key.Scheme != "ecdsa" || key.Fingerprint == "" || key.PublicKeyPem == "" {
		t.Fatalf("ledger key: %+v %v", key, err)
	}
	cs, err := hc.ListContracts(ctx)
	if err != nil || len(cs) != 4 || cs[3].ContractId != "counter" || cs[3].Builtin {
		t.Fatalf("contracts: %v %v", cs, err)
	}

	// Errors keep their kind over the wire.
	replay, _ := hc.NewRequest("counter", []byte(`{"id":"c2"}`))
	if _, err := hc.ExecuteRequest(ctx, replay); err != nil {
		t.Fatal(err)
	}
	forged, _ := hc.NewRequest("counter", []byte(`{"id":"c2"}`))
	forged.Argument = []byte(`{"id":"c3"}`)
	stranger := dial(t, client.Config{Server: srv.Addr(), Entity: "carol", Secret: secret})
	noToken := dial(t, client.Config{Server: srv.Addr(), Entity: "dave", Secret: secret, AdminToken: "wrong-token-0000000"})
	cases := []struct {
		name string
		call func() error
		want error
		code codes.Code
	}{
		{"replayed nonce", func() error { _, err := hc.ExecuteRequest(ctx, replay); return err }, proof.ErrNonceReused, codes.AlreadyExists},
		{"forged argument", func() error { _, err := hc.ExecuteRequest(ctx, forged); return err }, proof.ErrBadSignature, codes.Unauthenticated},
		{"unknown entity", func() error { _, err := stranger.Execute(ctx, "counter", []byte(`{"id":"c2"}`)); return err }, proof.ErrUnknownEntity, codes.Unauthenticated},
		{"malformed argument", func() error { _, err := hc.Execute(ctx, "counter", []byte(`{"id":`)); return err }, proof.ErrBadArgument, codes.InvalidArgument},
		{"unknown contract", func() error { _, err := hc.Execute(ctx, "nope", []byte(`{}`)); return err }, proof.ErrUnknownContract, codes.NotFound},
		{"fail", func() error { _, err := hc.Execute(ctx, "counter", []byte(`{"id":"c2","max":0}`)); return err }, proof.ErrContractFailed, codes.FailedPrecondition},
		{"syntax error", func() error { return hc.RegisterContract(ctx, "broken", []byte("def invoke(:")) }, proof.ErrBadContract, codes.InvalidArgument},
		{"missing asset", func() error { _, err := hc.Proof(ctx, "c1", 99); return err }, proof.ErrNotFound, codes.NotFound},
	}
	for _, c := range cases {
		err := c.call()
		var ce *client.Error
		if !errors.Is(err, c.want) || !errors.As(err, &ce) || ce.Code != c.code {
			t.Errorf("%s: got %v (%T), want %v with code %v", c.name, err, err, c.want, c.code)
		}
	}
	var ce *client.Error
	if err := noToken.RegisterSecret(ctx); !errors.As(err, &ce) || ce.Code != codes.PermissionDenied {
		t.Errorf("registration with a wrong token: %v", err)
	}

	// Reflection lists the service, as grpcurl would.
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range resp.GetListServicesResponse().GetService() {
		found = found || s.Name == "kiroku.v1.Ledger"
	}
	if !found {
		t.Fatalf("reflection does not list kiroku.v1.Ledger: %v", resp)
	}
}

func TestRegistrationDisabledWithoutToken(t *testing.T) {
	srv := startServer(t, server.Options{})
	c := dial(t, client.Config{Server: srv.Addr(), Entity: "alice", Secret: bytes.Repeat([]byte{1}, 32), AdminToken: token})
	err := c.RegisterSecret(context.Background())
	var ce *client.Error
	if !errors.Is(err, proof.ErrRegistrationDisabled) || !errors.As(err, &ce) || ce.Code != codes.PermissionDenied {
		t.Fatalf("got %v", err)
	}
}

// TestLostReplyIsRecovered drops the first reply of every execute after the
// server committed it: the client retries with the same nonce, finds it
// used, and returns the committed result and proofs from the ledger's
// record — the contract ran once. Every other execute reply is lost, over
// unary calls and over the CallBatches stream (where a lost reply is the stream
// breaking under the calls waiting on it).
func TestLostReplyIsRecovered(t *testing.T) {
	for _, unary := range []bool{true, false} {
		t.Run(fmt.Sprintf("unary=%v", unary), func(t *testing.T) { testLostReplyIsRecovered(t, unary) })
	}
}

func testLostReplyIsRecovered(t *testing.T, unary bool) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token})
	secret := bytes.Repeat([]byte{9}, 32)
	var dropped, streamed atomic.Int32
	var registrations sync.Map // method → a reply was lost already
	drop := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		switch method {
		case api.Ledger_ExecuteContract_FullMethodName:
			if dropped.Add(1)%2 == 1 {
				return status.Error(codes.Unavailable, "reply lost (test)")
			}
		case api.Ledger_RegisterSecret_FullMethodName, api.Ledger_RegisterContract_FullMethodName:
			// The first registration is stored and its reply lost: the
			// retry must find it registered, not fail as a duplicate.
			if _, lost := registrations.LoadOrStore(method, true); !lost && err == nil {
				return status.Error(codes.Unavailable, "reply lost (test)")
			}
		}
		return err
	}
	// On the stream, every other execute reply breaks the stream instead
	// of arriving.
	breakStream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != api.Ledger_CallBatches_FullMethodName {
			return cs, err
		}
		streamed.Add(1)
		return &losingStream{ClientStream: cs, lose: func(r *api.CallReply) bool { return r.GetExecute() != nil && dropped.Add(1)%2 == 1 }}, nil
	}
	c := dial(t, client.Config{Server: srv.Addr(), Entity: "alice", Secret: secret, AdminToken: token, UnaryCalls: unary,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(drop), grpc.WithStreamInterceptor(breakStream)}})
	defer func() {
		if dropped.Load() < 2 || unary != (streamed.Load() == 0) {
			t.Errorf("%d execute replies lost, %d streams opened; the test lost nothing on its path", dropped.Load(), streamed.Load())
		}
	}()
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterContract(ctx, "counter", []byte(counter)); err != nil {
		t.Fatal(err)
	}
	var usedNonce string
	for i := 1; i <= 3; i++ {
		res, err := c.Execute(ctx, "counter", []byte(`{"id":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		usedNonce = res.Nonce
		if string(res.Result) != fmt.Sprint(i) || len(res.Proofs) != 1 || res.Proofs[0].Age != int64(i-1) || srv.Ledger.VerifyProof(&res.Proofs[0]) != nil {
			t.Fatalf("recovered result %s %+v", res.Result, res.Proofs)
		}
	}
	if latest, _ := srv.Ledger.Latest(ctx, "x"); latest != 2 {
		t.Fatalf("asset x at age %d after 3 executes with lost replies; want 2", latest)
	}
	// A lost reply of an aborted request recovers its error, with the
	// code the server would have sent.
	_, err := c.Execute(ctx, "counter", []byte(`{"id":"x","max":1}`))
	var ce *client.Error
	if !errors.Is(err, proof.ErrContractFailed) || !errors.As(err, &ce) || ce.Code != codes.FailedPrecondition {
		t.Fatalf("recovered abort: %#v", err)
	}
	// A caller-chosen nonce that another request used: the first attempt's
	// reply is lost, the retry finds the nonce used, and what the ledger
	// recorded for it belongs to the other request.
	r, err := c.SignRequest(&proof.Request{Nonce: usedNonce, ContractID: "builtin.ycsb_c", Argument: []byte(`{"ids":["x"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.ExecuteRequest(ctx, r); !errors.Is(err, proof.ErrNonceReused) {
		t.Fatalf("a reused nonce recovered %+v, %v; want ErrNonceReused", res, err)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	keyPEM, certPEM, _ := auth.GenerateIdentity("bob", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "c.json"), []byte(`{"server":"127.0.0.1:1","entity":"bob","key_version":2,
		"private_key_file":"key.pem","certificate_file":"cert.pem","admin_token_file":"token"}`), 0o600)
	cfg, err := client.LoadConfig(filepath.Join(dir, "c.json"))
	if err != nil || cfg.Entity != "bob" || cfg.KeyVersion != 2 || !bytes.Equal(cfg.PrivateKeyPEM, keyPEM) || cfg.AdminToken != token {
		t.Fatalf("config %+v %v", cfg, err)
	}
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"entity":"bob","secret":"x"}`), 0o600)
	if _, err := client.LoadConfig(filepath.Join(dir, "bad.json")); err == nil {
		t.Fatal("an unknown field must be an error")
	}
	t.Setenv("KIROKU_ENTITY", "env")
	t.Setenv("KIROKU_SECRET", "zz")
	if _, err := client.ConfigFromEnv(); err == nil {
		t.Fatal("a secret that is not hex must be an error")
	}
}

// TestAuditorModeConfig: Auditor mode reads its fields from files, and
// Dial refuses a mode it does not know, an Auditor without an address or
// pinned key, and a key that is neither PEM nor a fingerprint.
func TestAuditorModeConfig(t *testing.T) {
	dir := t.TempDir()
	pub := "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n"
	os.WriteFile(filepath.Join(dir, "auditor.pem"), []byte(pub), 0o600)
	os.WriteFile(filepath.Join(dir, "auditor.token"), []byte(" t0k3n \n"), 0o600)
	os.WriteFile(filepath.Join(dir, "c.json"), []byte(`{"server":"127.0.0.1:1","entity":"bob","secret_hex":"00",
		"mode":"auditor","auditor":"127.0.0.1:2","auditor_key_file":"auditor.pem","auditor_admin_token_file":"auditor.token"}`), 0o600)
	cfg, err := client.LoadConfig(filepath.Join(dir, "c.json"))
	if err != nil || cfg.Mode != client.ModeAuditor || cfg.Auditor != "127.0.0.1:2" || cfg.AuditorKey != pub || cfg.AuditorAdminToken != "t0k3n" {
		t.Fatalf("config %+v %v", cfg, err)
	}
	fp := strings.Repeat("ab", 32)
	for name, c := range map[string]client.Config{
		"unknown mode":     {Mode: "validator"},
		"no Auditor":       {Mode: client.ModeAuditor, AuditorKey: fp},
		"no pinned key":    {Mode: client.ModeAuditor, Auditor: "127.0.0.1:2"},
		"a key of nothing": {Mode: client.ModeAuditor, Auditor: "127.0.0.1:2", AuditorKey: "abc"},
		"a bad PEM":        {Mode: client.ModeAuditor, Auditor: "127.0.0.1:2", AuditorKey: "-----BEGIN PUBLIC KEY-----\nAA==\n-----END PUBLIC KEY-----\n"},
	} {
		if c, err := client.Dial(c); err == nil {
			c.Close()
			t.Errorf("%s: Dial accepted it", name)
		}
	}
	c, err := client.Dial(client.Config{Mode: client.ModeAuditor, Auditor: "127.0.0.1:2", AuditorKey: fp})
	if err != nil {
		t.Fatalf("a pinned fingerprint: %v", err)
	}
	c.Close()
}

// losingStream loses the messages holding a reply lose picks: RecvMsg fails as a broken
// connection would, after the server answered.
type losingStream struct {
	grpc.ClientStream
	lose func(*api.CallReply) bool
}

func (s *losingStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	if rs, ok := m.(*api.CallReplies); ok {
		for _, r := range rs.Replies {
			if s.lose(r) {
				return status.Error(codes.Unavailable, "stream lost (test)")
			}
		}
	}
	return nil
}

// TestRecoverTellsRequestsApart: a request whose nonce another request
// used, and whose first reply is lost, recovers the outcome recorded for
// the nonce only if it is its own. The other request here is to the same
// contract (which the recorded state names), with another argument, or
// from another entity: the version it wrote records which.
func TestRecoverTellsRequestsApart(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, server.Options{AdminToken: token})
	var lose sync.Map // nonce → its next reply is lost
	lost := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := req.(*api.ExecuteRequest); ok {
			if _, ok := lose.LoadAndDelete(r.GetNonce()); ok {
				return status.Error(codes.Unavailable, "reply lost (test)")
			}
		}
		return err
	}
	clientOf := func(entity string) *client.Client {
		c := dial(t, client.Config{Server: srv.Addr(), Entity: entity, Secret: bytes.Repeat([]byte(entity[:1]), 32), AdminToken: token,
			UnaryCalls: true, DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(lost)}})
		if err := c.RegisterSecret(ctx); err != nil {
			t.Fatal(err)
		}
		return c
	}
	alice, bob := clientOf("alice"), clientOf("bob")
	if err := alice.RegisterContract(ctx, "counter", []byte(counter)); err != nil {
		t.Fatal(err)
	}
	first, err := alice.Execute(ctx, "counter", []byte(`{"id":"p"}`))
	if err != nil {
		t.Fatal(err)
	}
	nonce := first.Nonce
	for _, tc := range []struct {
		name string
		c    *client.Client
		arg  string
	}{
		{"another argument", alice, `{"id":"q"}`},
		{"another entity", bob, `{"id":"p"}`},
		{"the same argument, spelled otherwise", alice, `{"id": "p"}`},
	} {
		r, err := tc.c.SignRequest(&proof.Request{Nonce: nonce, ContractID: "counter", Argument: []byte(tc.arg)})
		if err != nil {
			t.Fatal(err)
		}
		lose.Store(nonce, true)
		res, err := tc.c.ExecuteRequest(ctx, r)
		if !errors.Is(err, proof.ErrNonceReused) {
			t.Errorf("%s: recovered the nonce's outcome as this request's (result %v), %v; want ErrNonceReused", tc.name, res != nil, err)
		}
		if _, ok := lose.Load(nonce); ok {
			t.Fatalf("%s: no reply was lost: recovery was not put to the test", tc.name)
		}
	}
	// The request that used the nonce recovers its own outcome.
	r, err := alice.SignRequest(&proof.Request{Nonce: nonce, ContractID: "counter", Argument: []byte(`{"id":"p"}`)})
	if err != nil {
		t.Fatal(err)
	}
	lose.Store(nonce, true)
	if res, err := alice.ExecuteRequest(ctx, r); err != nil || string(res.Result) != "1" || len(res.Proofs) != 1 || srv.Ledger.VerifyProof(&res.Proofs[0]) != nil {
		t.Fatalf("the nonce's own request recovered %+v, %v; want result 1 and the proof of p@0", res, err)
	}
	if latest, _ := srv.Ledger.Latest(ctx, "p"); latest != 0 {
		t.Fatalf("asset p at age %d; the refused requests wrote", latest)
	}
}
