package validator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/wire"
)

// FuzzValidatorReplies runs one transaction through the Validator against
// a Byzantine ledger, then validates (cross-checking the ledger's history)
// twice: first still against the Byzantine ledger, then against an honest
// one, so that what the first run left (in doubt, or not validated
// because a reply failed it) is settled. The Byzantine ledger is a proxy
// in front of a real server that answers ExecuteContract, GetTxState,
// GetProof and GetAsset, in the order they arrive, as a script made of the
// fuzzer's bytes says: forward; reply with the script's bytes as the reply
// message; reply with the real reply with the script's bytes XORed into
// its encoding; fail with a status and error kind; or forward and lose the
// reply. Whatever the replies, the Validator does not panic or hang, fails
// only with typed errors, and:
//   - with every reply forwarded, the transaction commits and validation
//     finds nothing;
//   - a committed result the Validator logged whose receipt or proofs are
//     not the ledger's signed statement about this request is found: a
//     violation names its nonce. (The log keeps the request's nonce and
//     contract, not the reply's; the SDK does not check that a reply's
//     nonce is its request's.)
func FuzzValidatorReplies(f *testing.F) {
	h := newValidatorHarness(f)
	step := func(action byte, body []byte) []byte {
		return append([]byte{action, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	f.Add([]byte{})
	f.Add(step(1, nil))                                        // an empty reply to the execute
	f.Add(step(1, h.oldReply))                                 // the reply of another request
	f.Add(append(step(1, h.oldReply), step(2, []byte{16})...)) // and the cross-check's history refused
	f.Add(step(4, []byte{0, 4, 1}))                            // a bit of the nonce flipped
	f.Add(step(4, []byte{0, 40, 0x80}))                        // further in
	f.Add(append(step(0, nil), step(4, []byte{0, 9, 1})...))   // the execute forwarded, the history altered
	f.Add(step(2, []byte{byte(codes.AlreadyExists), 5}))       // nonce_reused, untrue
	f.Add(step(2, []byte{byte(codes.Unavailable), 0}))         // a lost reply before execution
	f.Add(step(3, nil))                                        // a lost reply after it: in doubt
	f.Add(append(step(3, nil), step(4, []byte{0, 12, 2})...))  // in doubt, then a retry's answer altered
	f.Add(append(step(3, nil), step(3, nil)...))               // in doubt: the retry's reply lost too
	f.Fuzz(func(t *testing.T, data []byte) {
		h.run(t, data)
	})
}

// TestFailedRunReportsFindings: a validation that stores what it found and
// then fails (the ledger refuses the cross-check's history) returns its
// findings beside the error; no later unscoped run would report them.
func TestFailedRunReportsFindings(t *testing.T) {
	h := newValidatorHarness(t)
	ctx := context.Background()
	step := func(action byte, body []byte) []byte {
		return append([]byte{action, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	// The execute is answered with the reply to another request; the
	// cross-check's history is refused.
	h.script.Store(&vscript{data: append(step(1, h.oldReply), step(2, []byte{16})...)})
	defer h.script.Store(&vscript{})
	r, err := h.c.SignRequest(&proof.Request{Nonce: "failed-run", ContractID: "put", Argument: []byte(`{"id":"f","v":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.v.ExecuteRequest(ctx, r); err != nil {
		t.Fatalf("execute: %v", err)
	}
	rep, err := h.v.Validate(ctx, Scope{CrossCheck: true})
	if err == nil || rep == nil || !slices.ContainsFunc(rep.Violations, func(vl Violation) bool { return slices.Contains(vl.Txs, r.Nonce) }) {
		t.Fatalf("validation: %v, report %+v; want an error and the violation found before it", err, rep)
	}
}

type validatorHarness struct {
	srv      *server.Running
	up       api.LedgerClient
	v        *Validator
	c        *client.Client
	script   atomic.Pointer[vscript]
	seq      atomic.Int64
	oldReply []byte // an ExecuteReply of the real ledger to an earlier request
	kinds    []string
}

func newValidatorHarness(f testing.TB) *validatorHarness {
	f.Helper()
	ctx := context.Background()
	// HMAC proofs: a reply's signatures have one length, so the script's
	// offsets into it mean the same every run.
	o := server.Options{DataDir: f.TempDir(), Listen: "127.0.0.1:0", AdminToken: adminToken, ProofScheme: auth.SchemeHMAC,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o.Engine.EpochInterval = time.Millisecond
	srv, err := server.Start(ctx, o)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Stop(time.Second) })
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	h := &validatorHarness{srv: srv, up: api.NewLedgerClient(conn), kinds: append(proof.Kinds(), wire.KindCommitUnknown)}
	h.script.Store(&vscript{})

	gs := grpc.NewServer()
	api.RegisterLedgerServer(gs, &scriptProxy{h: h})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	f.Cleanup(gs.Stop)

	h.c, err = client.Dial(client.Config{Server: lis.Addr().String(), Entity: "fz", Secret: bytes.Repeat([]byte{6}, 32), AdminToken: adminToken,
		AttemptTimeout: 2 * time.Second, MaxAttempts: 3})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { h.c.Close() })
	if err := h.c.RegisterSecret(ctx); err != nil {
		f.Fatal(err)
	}
	db, err := engine.Open(engine.Config{Dir: f.TempDir(), EpochInterval: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	// An in-doubt transaction the ledger does not know is stamped aborted
	// at once, so the honest run settles every one.
	h.v, err = Open(ctx, Config{DB: db, Client: h.c, LedgerKey: srv.ProofVerifier, TxTimeout: time.Nanosecond})
	if err != nil {
		f.Fatal(err)
	}
	if err := h.v.RegisterContract(ctx, "put", []byte("def invoke(ledger, args):\n    ledger.put(args['id'], args['v'])\n    return args['v']\n")); err != nil {
		f.Fatal(err)
	}
	res, err := h.v.Execute(ctx, "put", []byte(`{"id":"old","v":1}`))
	if err != nil {
		f.Fatal(err)
	}
	if h.oldReply, err = proto.Marshal(wire.ResultToAPI(res)); err != nil {
		f.Fatal(err)
	}
	if rep, err := h.v.Validate(ctx, Scope{CrossCheck: true}); err != nil || !rep.OK() {
		f.Fatalf("an honest transaction: %v, %v", rep, err)
	}
	return h
}

// vscript is the proxy's answers, in order (see FuzzValidatorReplies).
type vscript struct {
	mu      sync.Mutex
	data    []byte
	faulted bool
}

// step returns the next action (0 forward, 1 replace, 2 fail, 3 forward and
// lose, 4 forward and alter) and its body; forward once spent.
func (s *vscript) step() (byte, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.data) < 3 {
		return 0, nil
	}
	action, n := s.data[0]%5, int(s.data[1])<<8|int(s.data[2])
	n = min(n, len(s.data)-3)
	body := s.data[3 : 3+n]
	s.data = s.data[3+n:]
	if action != 0 {
		s.faulted = true
	}
	return action, body
}

// scriptProxy forwards to the real server, but for the calls the script
// answers.
type scriptProxy struct {
	api.UnimplementedLedgerServer
	h *validatorHarness
}

// answer answers one scripted call: forward calls the real server, reply
// is the message to fill.
func answer[R proto.Message](ctx context.Context, h *validatorHarness, reply R, forward func(context.Context, ...grpc.CallOption) (R, error)) (R, error) {
	var zero R
	action, body := h.script.Load().step()
	switch action {
	case 1:
		if err := proto.Unmarshal(body, reply); err != nil {
			proto.Reset(reply) // not a message a typed server can send
		}
		return reply, nil
	case 2:
		code, kind := codes.Unknown, ""
		if len(body) > 0 && body[0]%17 != 0 {
			code = codes.Code(body[0] % 17)
		}
		if len(body) > 1 {
			kind = h.kinds[int(body[1])%len(h.kinds)]
			_ = grpc.SetTrailer(ctx, metadata.Pairs(wire.ErrorKindKey, kind))
		}
		return zero, status.Error(code, "byzantine proxy")
	}
	var tr metadata.MD
	out, err := forward(ctx, grpc.Trailer(&tr))
	if len(tr) > 0 {
		_ = grpc.SetTrailer(ctx, tr)
	}
	if err != nil {
		return zero, err
	}
	switch action {
	case 3:
		return zero, status.Error(codes.Unavailable, "byzantine proxy: reply lost")
	case 4:
		b, err := proto.Marshal(out)
		if err != nil || len(body) < 3 || len(b) == 0 {
			return out, err
		}
		at := int(body[0])<<8 | int(body[1])
		for i, x := range body[2:] {
			b[(at+i)%len(b)] ^= x
		}
		if err := proto.Unmarshal(b, reply); err != nil {
			return out, nil // the altered bytes do not decode: the real reply
		}
		return reply, nil
	}
	return out, nil
}

func (p *scriptProxy) RegisterSecret(ctx context.Context, in *api.RegisterSecretRequest) (*api.RegisterReply, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	return p.h.up.RegisterSecret(metadata.NewOutgoingContext(ctx, md), in)
}

func (p *scriptProxy) RegisterContract(ctx context.Context, in *api.RegisterContractRequest) (*api.RegisterReply, error) {
	return p.h.up.RegisterContract(ctx, in)
}

func (p *scriptProxy) ExecuteContract(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
	return answer(ctx, p.h, &api.ExecuteReply{}, func(ctx context.Context, o ...grpc.CallOption) (*api.ExecuteReply, error) {
		return p.h.up.ExecuteContract(ctx, in, o...)
	})
}

func (p *scriptProxy) GetTxState(ctx context.Context, in *api.GetTxStateRequest) (*api.TxState, error) {
	return answer(ctx, p.h, &api.TxState{}, func(ctx context.Context, o ...grpc.CallOption) (*api.TxState, error) {
		return p.h.up.GetTxState(ctx, in, o...)
	})
}

func (p *scriptProxy) GetProof(ctx context.Context, in *api.GetProofRequest) (*api.Proof, error) {
	return answer(ctx, p.h, &api.Proof{}, func(ctx context.Context, o ...grpc.CallOption) (*api.Proof, error) {
		return p.h.up.GetProof(ctx, in, o...)
	})
}

func (p *scriptProxy) GetAsset(ctx context.Context, in *api.GetAssetRequest) (*api.GetAssetReply, error) {
	return answer(ctx, p.h, &api.GetAssetReply{}, func(ctx context.Context, o ...grpc.CallOption) (*api.GetAssetReply, error) {
		return p.h.up.GetAsset(ctx, in, o...)
	})
}

// typedErr reports whether err is one the Validator may return for what a
// ledger answered: the SDK's, the ledger's kinds, or its own.
func typedErr(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) || proof.Kind(err) != "" || errors.Is(err, ErrLogIncomplete) ||
		strings.HasPrefix(err.Error(), "client: ") || strings.HasPrefix(err.Error(), "validator: ")
}

// genuine reports whether res, as the Validator logs it, is the ledger's
// signed statement about r: a receipt that verifies as one for r's nonce
// and contract (the log keeps the request's, not the reply's), and one
// verifying proof per write, for r's nonce and the receipt's read set.
func (h *validatorHarness) genuine(r *proof.Request, res *proof.Result) bool {
	rc := res.Receipt
	rc.Nonce, rc.Contract = r.Nonce, r.ContractID
	if proof.Verify(h.srv.ProofVerifier, &rc, rc.Signature) != nil || len(res.Proofs) != len(rc.Writes) {
		return false
	}
	for i := range res.Proofs {
		p := &res.Proofs[i]
		if a, ok := rc.Writes[p.ID]; !ok || a != p.Age || p.Nonce != rc.Nonce || proof.Verify(h.srv.ProofVerifier, p, p.Signature) != nil {
			return false
		}
	}
	return true
}

func (h *validatorHarness) run(t *testing.T, data []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := &vscript{data: data}
	h.script.Store(s)
	n := h.seq.Add(1) // of fixed width, as the script's offsets are
	r, err := h.c.SignRequest(&proof.Request{Nonce: fmt.Sprintf("fz-%08d", n), ContractID: "put",
		Argument: fmt.Appendf(nil, `{"id":"x%08d","v":[1,"é"]}`, n)})
	if err != nil {
		t.Fatal(err)
	}
	res, xerr := h.v.ExecuteRequest(ctx, r)
	if xerr != nil && !typedErr(xerr) {
		t.Fatalf("script %q: execute failed with an untyped error %T %v", data, xerr, xerr)
	}
	var found []Violation
	rep, verr := h.v.Validate(ctx, Scope{CrossCheck: true})
	if verr != nil && !typedErr(verr) {
		t.Fatalf("script %q: validation failed with an untyped error %T %v", data, verr, verr)
	}
	if rep != nil {
		found = append(found, rep.Violations...)
	}
	s.mu.Lock()
	faulted := s.faulted
	s.mu.Unlock()
	h.script.Store(&vscript{}) // honest from here on
	// The violations of the transaction stored so far too (a run that fails
	// after it stored what it found returns them beside its error, above;
	// this checks they were stored).
	rep, err = h.v.Validate(ctx, Scope{Nonce: r.Nonce, CrossCheck: true})
	if err != nil {
		t.Fatalf("script %q: validation against an honest ledger: %v", data, err)
	}
	if rep.Unresolved > 0 || rep.Waiting > 0 {
		t.Fatalf("script %q: %d unresolved and %d waiting after an honest validation", data, rep.Unresolved, rep.Waiting)
	}
	found = append(found, rep.Violations...)
	if !faulted {
		if xerr != nil || verr != nil || len(found) > 0 {
			t.Fatalf("every reply forwarded: execute %v, validation %v, violations %v", xerr, verr, found)
		}
		return
	}
	if xerr == nil && !h.genuine(r, res) && !slices.ContainsFunc(found, func(vl Violation) bool { return slices.Contains(vl.Txs, r.Nonce) }) {
		t.Fatalf("script %q: the Validator returned a result for %s that is not the ledger's (%+v), and validation found nothing of it: %v",
			data, r.Nonce, res, found)
	}
}
