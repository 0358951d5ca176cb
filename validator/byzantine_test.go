package validator

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"path/filepath"
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
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/wire"
)

// A Byzantine ledger for the Validator's tests: a gRPC proxy in front of a
// real kiroku server, run by an operator who holds the ledger's proof key.
// In pass-through mode it forwards every call unchanged; a fault set
// between steps lets it alter replies, answer requests with results it
// fabricated (re-executed on another snapshot, properly hashed and signed),
// or rewrite the history it serves. The Validator's client dials the proxy
// and cannot tell it from the ledger, except by validating.

// execFault answers an execute in place of forwarding it.
type execFault func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error)

// historyFault rewrites the full history of asset id before GetAsset serves
// the range asked for.
type historyFault func(id string, hist []*proof.Version) ([]*proof.Version, error)

type byzProxy struct {
	api.UnimplementedLedgerServer
	up     api.LedgerClient
	srv    *server.Running
	signer auth.Signer
	addr   string

	mu       sync.Mutex
	exec     execFault
	history  historyFault
	sources  map[string][]byte              // registered Starlark contracts
	requests map[string]*api.ExecuteRequest // every execute seen, by nonce
}

// startByzLedger starts a real server, and returns its data directory
// too, for the proof key.
func startByzLedger(t *testing.T) (*server.Running, string) {
	t.Helper()
	dir := t.TempDir()
	return startLedgerAt(t, dir), dir
}

// startByzProxy serves a proxy of srv on a loopback port, signing what it
// fabricates with the ledger's own proof key from dataDir.
func startByzProxy(t *testing.T, srv *server.Running, dataDir string) *byzProxy {
	t.Helper()
	k, err := auth.LoadOrCreateECDSAKey(filepath.Join(dataDir, "keys", "ledger-ecdsa.pem"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := auth.NewECDSASigner(k)
	if err != nil {
		t.Fatal(err)
	}
	if fp := auth.Fingerprint(&k.PublicKey); fp != srv.Key.Fingerprint {
		t.Fatalf("the key file holds %s, the server signs with %s", fp, srv.Key.Fingerprint)
	}
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p := &byzProxy{up: api.NewLedgerClient(conn), srv: srv, signer: signer,
		sources: map[string][]byte{}, requests: map[string]*api.ExecuteRequest{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	gs := grpc.NewServer()
	api.RegisterLedgerServer(gs, p)
	done := make(chan struct{})
	go func() { _ = gs.Serve(lis); close(done) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return p
}

// setExec sets the execute fault; nil forwards.
func (p *byzProxy) setExec(f execFault) {
	p.mu.Lock()
	p.exec = f
	p.mu.Unlock()
}

// setHistory sets the history fault; nil forwards.
func (p *byzProxy) setHistory(f historyFault) {
	p.mu.Lock()
	p.history = f
	p.mu.Unlock()
}

// request returns the execute request seen under nonce.
func (p *byzProxy) request(nonce string) *api.ExecuteRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests[nonce]
}

// outgoing carries the caller's bearer token (identity registration) on
// to the real server.
func outgoing(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, a := range md.Get("authorization") {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a)
	}
	return ctx
}

// relay forwards one call, with the real server's trailer (which carries
// the ledger's error kind) passed back to the caller.
func relay[Req, Rep any](ctx context.Context, in Req, f func(context.Context, Req, ...grpc.CallOption) (Rep, error)) (Rep, error) {
	var tr metadata.MD
	out, err := f(outgoing(ctx), in, grpc.Trailer(&tr))
	if len(tr) > 0 {
		_ = grpc.SetTrailer(ctx, tr)
	}
	return out, err
}

func (p *byzProxy) RegisterCertificate(ctx context.Context, in *api.RegisterCertificateRequest) (*api.RegisterReply, error) {
	return relay(ctx, in, p.up.RegisterCertificate)
}

func (p *byzProxy) RegisterSecret(ctx context.Context, in *api.RegisterSecretRequest) (*api.RegisterReply, error) {
	return relay(ctx, in, p.up.RegisterSecret)
}

func (p *byzProxy) RegisterContract(ctx context.Context, in *api.RegisterContractRequest) (*api.RegisterReply, error) {
	out, err := relay(ctx, in, p.up.RegisterContract)
	if err == nil {
		p.mu.Lock()
		p.sources[in.ContractId] = bytes.Clone(in.Source)
		p.mu.Unlock()
	}
	return out, err
}

func (p *byzProxy) ListContracts(ctx context.Context, in *api.ListContractsRequest) (*api.ListContractsReply, error) {
	return relay(ctx, in, p.up.ListContracts)
}

func (p *byzProxy) GetProof(ctx context.Context, in *api.GetProofRequest) (*api.Proof, error) {
	return relay(ctx, in, p.up.GetProof)
}

func (p *byzProxy) GetTxState(ctx context.Context, in *api.GetTxStateRequest) (*api.TxState, error) {
	return relay(ctx, in, p.up.GetTxState)
}

func (p *byzProxy) ValidateLedger(ctx context.Context, in *api.ValidateLedgerRequest) (*api.ValidateLedgerReply, error) {
	return relay(ctx, in, p.up.ValidateLedger)
}

func (p *byzProxy) GetLedgerKey(ctx context.Context, in *api.GetLedgerKeyRequest) (*api.LedgerKey, error) {
	return relay(ctx, in, p.up.GetLedgerKey)
}

func (p *byzProxy) ExecuteContract(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
	p.mu.Lock()
	p.requests[in.Nonce] = proto.Clone(in).(*api.ExecuteRequest)
	f := p.exec
	p.mu.Unlock()
	if f != nil {
		return f(ctx, in)
	}
	return p.forward(ctx, in)
}

// forward has the real ledger execute in.
func (p *byzProxy) forward(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
	return relay(ctx, in, p.up.ExecuteContract)
}

func (p *byzProxy) GetAsset(ctx context.Context, in *api.GetAssetRequest) (*api.GetAssetReply, error) {
	p.mu.Lock()
	f := p.history
	p.mu.Unlock()
	if f == nil {
		return relay(ctx, in, p.up.GetAsset)
	}
	var hist []*proof.Version
	for start := int64(0); ; {
		page, err := p.up.GetAsset(ctx, &api.GetAssetRequest{Id: in.Id, StartAge: start, EndAge: -1})
		if err != nil {
			return nil, err
		}
		if len(page.Versions) == 0 {
			break
		}
		for _, av := range page.Versions {
			v, err := wire.VersionFromAPI(av)
			if err != nil {
				return nil, err
			}
			hist = append(hist, v)
		}
		start = hist[len(hist)-1].Age + 1
	}
	hist, err := f(in.Id, hist)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	out := &api.GetAssetReply{}
	for _, v := range hist {
		if v.Age >= in.StartAge && (in.EndAge < 0 || v.Age <= in.EndAge) {
			out.Versions = append(out.Versions, wire.VersionToAPI(v))
		}
	}
	if in.Descending {
		slices.Reverse(out.Versions)
	}
	if in.Limit > 0 && len(out.Versions) > int(in.Limit) {
		out.Versions = out.Versions[:in.Limit]
	}
	return out, nil
}

// contract loads a contract for the proxy's own executions.
func (p *byzProxy) contract(id string) (ledger.Contract, error) {
	if c, ok := ledger.Builtins[id]; ok {
		return c, nil
	}
	p.mu.Lock()
	src, ok := p.sources[id]
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", proof.ErrUnknownContract, id)
	}
	return ledger.CompileContract(id, src)
}

// Output serves the proxy's re-executions from the real ledger's versions.
func (p *byzProxy) Output(ctx context.Context, id string, age int64) ([]byte, error) {
	v, err := p.srv.Ledger.Version(ctx, id, age)
	if err != nil {
		return nil, err
	}
	return v.Output, nil
}

// fabricate returns the reply of a ledger that executed in on the snapshot
// input (asset → age read) and committed the versions writes (asset → age),
// each chained to prev[id] — by default the hash of the real ledger's
// version age−1 — hashed and signed with the ledger's key exactly as the
// ledger would. The real ledger does not see the request.
func (p *byzProxy) fabricate(ctx context.Context, in *api.ExecuteRequest, input, writes map[string]int64, prev map[string][]byte) (*api.ExecuteReply, error) {
	req := wire.RequestFromAPI(in)
	rep, div, err := ledger.Replay(ctx, ledger.Limits{}, p.contract, req.ContractID, req.Argument, input, writes, p)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "byzantine proxy: re-executing %s: %v", req.Nonce, err)
	}
	if div != "" {
		return nil, status.Errorf(codes.Internal, "byzantine proxy: %s does not run on the chosen snapshot: %s", req.Nonce, div)
	}
	res := &proof.Result{Receipt: proof.Receipt{Nonce: req.Nonce, Contract: req.ContractID, Input: input, Writes: writes, Result: rep.Result}}
	for _, id := range slices.Sorted(maps.Keys(writes)) {
		ph, ok := prev[id]
		if !ok && writes[id] > 0 {
			pv, err := p.srv.Ledger.Version(ctx, id, writes[id]-1)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "byzantine proxy: %v", err)
			}
			ph = pv.Hash
		}
		ver := &proof.Version{ID: id, Age: writes[id], Input: input, Output: rep.Writes[id], Contract: req.ContractID,
			Argument: req.Argument, Nonce: req.Nonce, Entity: req.Entity, KeyVersion: req.KeyVersion, Signature: req.Signature,
			PrevHash: ph}
		ver.Hash = ver.ComputeHash()
		pr := ver.Proof()
		if pr.Signature, err = p.signer.Sign(pr.SigningBytes()); err != nil {
			return nil, err
		}
		res.Proofs = append(res.Proofs, pr)
	}
	if res.Signature, err = p.signer.Sign(res.Receipt.SigningBytes()); err != nil {
		return nil, err
	}
	return wire.ResultToAPI(res), nil
}

// alter has the real ledger execute in, then lets f doctor the result
// before it goes back.
func (p *byzProxy) alter(ctx context.Context, in *api.ExecuteRequest, f func(res *proof.Result) error) (*api.ExecuteReply, error) {
	reply, err := p.forward(ctx, in)
	if err != nil {
		return nil, err
	}
	res, err := wire.ResultFromAPI(reply)
	if err != nil {
		return nil, err
	}
	if err := f(res); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return wire.ResultToAPI(res), nil
}

// resign signs res's proofs and receipt anew with the ledger's key.
func (p *byzProxy) resign(res *proof.Result) error {
	var err error
	for i := range res.Proofs {
		if res.Proofs[i].Signature, err = p.signer.Sign(res.Proofs[i].SigningBytes()); err != nil {
			return err
		}
	}
	res.Signature, err = p.signer.Sign(res.Receipt.SigningBytes())
	return err
}

// rechain re-links hist (prev_hash), rehashes and re-signs every version,
// so a rewritten history is internally consistent.
func (p *byzProxy) rechain(hist []*proof.Version) error {
	for i, v := range hist {
		v.PrevHash = nil
		if i > 0 {
			v.PrevHash = hist[i-1].Hash
		}
		v.Hash = v.ComputeHash()
		pr := v.Proof()
		sig, err := p.signer.Sign(pr.SigningBytes())
		if err != nil {
			return err
		}
		v.ProofSignature = sig
	}
	return nil
}

// holdFirst returns an execute fault for two concurrent requests: the
// first is executed by the real ledger, but its reply is held until the
// second arrives, which second answers; later ones are forwarded. first
// is closed once the first request has executed (start the second only
// then).
func (p *byzProxy) holdFirst(t *testing.T, second execFault) (execFault, <-chan struct{}) {
	var n atomic.Int32
	first, arrived := make(chan struct{}), make(chan struct{})
	return func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
		switch n.Add(1) {
		case 1:
			reply, err := p.forward(ctx, in)
			close(first)
			select {
			case <-arrived:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Second):
				t.Error("byzantine proxy: the second request never arrived")
			}
			return reply, err
		case 2:
			close(arrived)
			return second(ctx, in)
		}
		return p.forward(ctx, in)
	}, first
}

// byzEnv is one fresh ledger, proxy and Validator.
type byzEnv struct {
	srv *server.Running
	p   *byzProxy
	v   *Validator
}

func newByzEnv(t *testing.T) *byzEnv {
	t.Helper()
	srv, dir := startByzLedger(t)
	p := startByzProxy(t, srv, dir)
	c := dialLedger(t, p.addr, "alice")
	return &byzEnv{srv: srv, p: p, v: openValidator(t, openEngineDB(t), "", c, ClockConfig{})}
}

// exec executes through the Validator and fails the test on error.
func (e *byzEnv) exec(t *testing.T, contract, format string, a ...any) *proof.Result {
	t.Helper()
	res, err := e.v.Execute(context.Background(), contract, fmt.Appendf(nil, format, a...))
	if err != nil {
		t.Fatalf("%s %s: %v", contract, fmt.Sprintf(format, a...), err)
	}
	return res
}

// concurrently runs two executions, the second started once the first has
// reached the proxy (see holdFirst), and returns their nonces.
func (e *byzEnv) concurrently(t *testing.T, first <-chan struct{}, c1, a1, c2, a2 string) (n1, n2 string) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	var r1, r2 *proof.Result
	var err1, err2 error
	wg.Go(func() { r1, err1 = e.v.Execute(ctx, c1, []byte(a1)) })
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the proxy")
	}
	wg.Go(func() { r2, err2 = e.v.Execute(ctx, c2, []byte(a2)) })
	wg.Wait()
	if err1 != nil || err2 != nil {
		t.Fatalf("concurrent executions: %v; %v", err1, err2)
	}
	return r1.Nonce, r2.Nonce
}

// expectViolation asserts that rep holds a violation of kind on key (any
// key if ""; any age if age < 0) naming every one of txs.
func expectViolation(t *testing.T, rep *Report, kind Kind, key string, age int64, txs ...string) *Violation {
	t.Helper()
	for i := range rep.Violations {
		vl := &rep.Violations[i]
		if vl.Kind != kind || (key != "" && vl.Key != key) || (age >= 0 && vl.Age != age) {
			continue
		}
		if !slices.ContainsFunc(txs, func(n string) bool { return !slices.Contains(vl.Txs, n) }) {
			return vl
		}
	}
	var b strings.Builder
	rep.Print(&b)
	t.Errorf("no %s violation on %s@%d naming %v; the report:\n%s", kind, key, age, txs, b.String())
	return nil
}

// Byzantine faults, one per subtest, each on a fresh ledger, proxy and
// Validator database.
func TestByzantine(t *testing.T) {
	ctx := context.Background()
	const k = "k0"
	load := func(t *testing.T, e *byzEnv) {
		t.Helper()
		e.exec(t, "builtin.bulk_load", `{"prefix":"k","first":0,"count":2,"payload":"init"}`)
	}
	ycsbF := func(t *testing.T, e *byzEnv, payload string) string {
		t.Helper()
		return e.exec(t, "builtin.ycsb_f", `{"id":%q,"payload":%q}`, k, payload).Nonce
	}
	scopeK := Scope{Key: k, Age: -1, CrossCheck: true}

	// 1. The operator rewrites a committed output in storage (the version
	// and the head the ledger executes from). The cross-check finds the
	// stored version differs from the Validator's own; a later transaction
	// the ledger computes from the tampered value diverges on re-execution.
	t.Run("1_tampered_storage", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		t1 := ycsbF(t, e, "p1") // k0@1 = {"payload":"p1","updates":1}
		tampered := storage.Text(`{"payload":"p1","updates":41}`)
		if err := e.srv.Backend.Put(ctx, &storage.Put{Namespace: ledger.DefaultNamespace, Table: ledger.AssetsTable,
			Partition: storage.Values{"id": storage.Text(k)}, Clustering: storage.Values{"age": storage.BigInt(1)},
			Values: storage.Values{"output": tampered}, Condition: storage.IfExists()}); err != nil {
			t.Fatal(err)
		}
		if err := e.srv.Backend.Put(ctx, &storage.Put{Namespace: ledger.DefaultNamespace, Table: "heads",
			Partition: storage.Values{"id": storage.Text(k)}, Values: storage.Values{"output": tampered},
			Condition: storage.IfExists()}); err != nil {
			t.Fatal(err)
		}
		rep := validate(t, e.v, scopeK)
		expectViolation(t, rep, KindIODivergence, k, 1, t1)

		t3 := ycsbF(t, e, "p3") // the ledger computes "updates":42
		if v, err := e.srv.Ledger.Version(ctx, k, 2); err != nil || !strings.Contains(string(v.Output), `"updates":42`) {
			t.Fatalf("the ledger did not execute on the tampered value: %v %v", v, err)
		}
		rep = validate(t, e.v, scopeK)
		expectViolation(t, rep, KindIODivergence, k, 2, t3)
	})

	// 2. The proxy alters the contract's result and re-signs the receipt.
	t.Run("2a_fabricated_result", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		e.p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			return e.p.alter(ctx, in, func(res *proof.Result) error {
				res.Result = []byte(`{"age":99}`)
				return e.p.resign(res)
			})
		})
		t1 := ycsbF(t, e, "p1")
		rep := validate(t, e.v, Scope{CrossCheck: true})
		vl := expectViolation(t, rep, KindIODivergence, k, 1, t1)
		if vl != nil && !strings.Contains(vl.Detail, `{"age":99}`) {
			t.Errorf("the divergence does not name the fabricated result: %s", vl.Detail)
		}
	})

	// The proxy states another output in the proof: the hash of a version
	// with a forged value, properly chained, proof and receipt re-signed.
	t.Run("2b_fabricated_proof", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		e.p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			req := wire.RequestFromAPI(in)
			return e.p.alter(ctx, in, func(res *proof.Result) error {
				pr := &res.Proofs[0]
				forged := &proof.Version{ID: pr.ID, Age: pr.Age, Input: pr.Input, Output: []byte(`{"payload":"forged","updates":1}`),
					Contract: req.ContractID, Argument: req.Argument, Nonce: req.Nonce, Entity: req.Entity,
					KeyVersion: req.KeyVersion, Signature: req.Signature, PrevHash: pr.PrevHash}
				pr.Hash = forged.ComputeHash()
				return e.p.resign(res)
			})
		})
		t1 := ycsbF(t, e, "p1")
		rep := validate(t, e.v, Scope{})
		expectViolation(t, rep, KindIODivergence, k, 1, t1)
	})

	// 3. A corrupted signature, of a proof or of a receipt.
	t.Run("3a_corrupt_proof_signature", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		e.p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			return e.p.alter(ctx, in, func(res *proof.Result) error {
				sig := res.Proofs[0].Signature
				sig[len(sig)/2] ^= 0x01
				return nil
			})
		})
		t1 := ycsbF(t, e, "p1")
		rep := validate(t, e.v, Scope{})
		expectViolation(t, rep, KindBadSignature, k, 1, t1)
	})
	t.Run("3b_corrupt_receipt_signature", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		e.p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			return e.p.alter(ctx, in, func(res *proof.Result) error {
				res.Signature[len(res.Signature)-1] ^= 0x01
				return nil
			})
		})
		t1 := ycsbF(t, e, "p1")
		// A read-only transaction has only its receipt to sign.
		t2 := e.exec(t, "builtin.ycsb_c", `{"ids":["k0","k1"]}`).Nonce
		rep := validate(t, e.v, Scope{})
		expectViolation(t, rep, KindBadSignature, k, 1, t1)
		expectViolation(t, rep, KindBadSignature, k, 1, t2)
	})

	// 4. Lost update: T1 and T2 run concurrently; the ledger answers T2 as
	// if it had read the version T1 read, and wrote the version T1 wrote.
	t.Run("4a_lost_update", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		ycsbF(t, e, "p1") // v = 1
		const v = 1
		f, first := e.p.holdFirst(t, func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			return e.p.fabricate(ctx, in, map[string]int64{k: v}, map[string]int64{k: v + 1}, nil)
		})
		e.p.setExec(f)
		t1, t2 := e.concurrently(t, first, "builtin.ycsb_f", `{"id":"k0","payload":"T1"}`, "builtin.ycsb_f", `{"id":"k0","payload":"T2"}`)
		rep := validate(t, e.v, Scope{CrossCheck: true})
		expectViolation(t, rep, KindCycle, k, -1, t1, t2)
		expectViolation(t, rep, KindDuplicateVersion, k, v+1, t1, t2)
	})

	// The same, but T2's version is chained after T1's: it reads v and
	// writes v+2 with prev_hash the hash of T1's v+1.
	t.Run("4b_lost_update_chained", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		ycsbF(t, e, "p1")
		const v = 1
		f, first := e.p.holdFirst(t, func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			t1v, err := e.srv.Ledger.Version(ctx, k, v+1)
			if err != nil {
				return nil, err
			}
			return e.p.fabricate(ctx, in, map[string]int64{k: v}, map[string]int64{k: v + 2}, map[string][]byte{k: t1v.Hash})
		})
		e.p.setExec(f)
		t1, t2 := e.concurrently(t, first, "builtin.ycsb_f", `{"id":"k0","payload":"T1"}`, "builtin.ycsb_f", `{"id":"k0","payload":"T2"}`)
		rep := validate(t, e.v, Scope{})
		expectViolation(t, rep, KindCycle, k, -1, t1, t2)
		for _, vl := range rep.Violations {
			if vl.Kind == KindIODivergence || vl.Kind == KindBadSignature {
				t.Errorf("the fabricated reply is consistent; got %s", vl.String())
			}
		}
	})

	// 5. Write skew: both read x@0 and y@0 concurrently; T1 takes x off
	// call, T2 (fabricated on the snapshot {x@0, y@0}) y.
	t.Run("5_write_skew", func(t *testing.T) {
		e := newByzEnv(t)
		const oncall = `
def invoke(ledger, args):
    if 'init' in args:
        for k in args['init']:
            ledger.put(k, 1)
        return {'init': len(args['init'])}
    x = ledger.get(args['x'])
    y = ledger.get(args['y'])
    total = x['value'] + y['value']
    if total < 2:
        fail('the last one on call cannot leave')
    ledger.put(args['off'], 0)
    return {'on_call': total - 1}
`
		if err := e.v.RegisterContract(ctx, "oncall", []byte(oncall)); err != nil {
			t.Fatal(err)
		}
		e.exec(t, "oncall", `{"init":["x","y"]}`)
		f, first := e.p.holdFirst(t, func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			return e.p.fabricate(ctx, in, map[string]int64{"x": 0, "y": 0}, map[string]int64{"y": 1}, nil)
		})
		e.p.setExec(f)
		t1, t2 := e.concurrently(t, first, "oncall", `{"x":"x","y":"y","off":"x"}`, "oncall", `{"x":"x","y":"y","off":"y"}`)
		e.p.setExec(nil)
		if _, err := e.v.Execute(ctx, "oncall", []byte(`{"x":"x","y":"y","off":"y"}`)); err == nil {
			t.Fatal("the real ledger let the last one leave") // sanity: honestly, T2 fails
		}
		rep := validate(t, e.v, Scope{})
		vl := expectViolation(t, rep, KindCycle, "", -1, t1, t2)
		if vl != nil && vl.Key != "x" && vl.Key != "y" {
			t.Errorf("the cycle is filed under %s@%d", vl.Key, vl.Age)
		}
	})

	// 6. Stale read: T1 commits k@v+1 and returns; T2, started after, is
	// answered as if it had read k@v.
	t.Run("6_stale_read", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		const v = 0
		t1 := ycsbF(t, e, "p1") // k0@1, acknowledged
		e.p.setExec(func(ctx context.Context, in *api.ExecuteRequest) (*api.ExecuteReply, error) {
			return e.p.fabricate(ctx, in, map[string]int64{k: v}, map[string]int64{}, nil)
		})
		res := e.exec(t, "builtin.ycsb_c", `{"ids":["k0"]}`)
		if !strings.Contains(string(res.Result), `"updates":0`) {
			t.Fatalf("the fabricated read returned %s", res.Result)
		}
		rep := validate(t, e.v, Scope{})
		vl := expectViolation(t, rep, KindStaleRead, k, v+1, res.Nonce, t1)
		if vl != nil && (vl.Txs[0] != res.Nonce || vl.Txs[1] != t1) {
			t.Errorf("the stale read names %v; want the reader %s first, then %s", vl.Txs, res.Nonce, t1)
		}
	})

	// 7. The ledger's history omits a logged committed version: leaving a
	// gap, or renumbering the later versions (rechained and re-signed).
	dropSetup := func(t *testing.T) (*byzEnv, []string) {
		e := newByzEnv(t)
		load(t, e)
		return e, []string{ycsbF(t, e, "p1"), ycsbF(t, e, "p2"), ycsbF(t, e, "p3")}
	}
	t.Run("7a_dropped_gap", func(t *testing.T) {
		e, ts := dropSetup(t)
		e.p.setHistory(func(id string, hist []*proof.Version) ([]*proof.Version, error) {
			if id != k {
				return hist, nil
			}
			return slices.Delete(hist, 2, 3), nil
		})
		rep := validate(t, e.v, scopeK)
		expectViolation(t, rep, KindDropped, k, 2, ts[1])
	})
	t.Run("7b_dropped_renumbered", func(t *testing.T) {
		e, ts := dropSetup(t)
		e.p.setHistory(func(id string, hist []*proof.Version) ([]*proof.Version, error) {
			if id != k {
				return hist, nil
			}
			hist = slices.Delete(hist, 2, 3)
			for i, v := range hist {
				v.Age = int64(i)
			}
			return hist, e.p.rechain(hist)
		})
		rep := validate(t, e.v, scopeK)
		expectViolation(t, rep, KindDropped, k, 2, ts[1])
	})

	// 8. The ledger's history swaps two logged versions.
	t.Run("8_reordered", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		t1, t2 := ycsbF(t, e, "p1"), ycsbF(t, e, "p2")
		e.p.setHistory(func(id string, hist []*proof.Version) ([]*proof.Version, error) {
			if id != k {
				return hist, nil
			}
			hist[1], hist[2] = hist[2], hist[1]
			hist[1].Age, hist[2].Age = 1, 2
			return hist, e.p.rechain(hist)
		})
		rep := validate(t, e.v, scopeK)
		expectViolation(t, rep, KindReordered, k, 1, t1)
		expectViolation(t, rep, KindReordered, k, 2, t2)
	})

	// 9. The operator forgets a nonce (its tx_states row) and re-sends the
	// very same signed request to the ledger, which executes it again.
	t.Run("9_replayed_request", func(t *testing.T) {
		e := newByzEnv(t)
		load(t, e)
		t1 := ycsbF(t, e, "p1")
		req := e.p.request(t1)
		if req == nil {
			t.Fatal("the proxy did not see the request")
		}
		if _, err := e.p.up.ExecuteContract(ctx, req); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("the ledger accepted a used nonce before the tampering: %v", err)
		}
		if err := e.srv.Backend.Delete(ctx, &storage.Delete{Namespace: ledger.DefaultNamespace, Table: "tx_states",
			Partition: storage.Values{"nonce": storage.Text(t1)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.p.up.ExecuteContract(ctx, req); err != nil {
			t.Fatalf("replaying %s: %v", t1, err)
		}
		if v, err := e.srv.Ledger.Version(ctx, k, 2); err != nil || v.Nonce != t1 {
			t.Fatalf("the replay wrote no second version under %s: %v %v", t1, v, err)
		}
		rep := validate(t, e.v, scopeK)
		expectViolation(t, rep, KindReplay, k, 2, t1)
	})
}

// TestByzantineHonestProxy: the proxy in pass-through mode raises no false
// alarm over a few hundred concurrent mixed transactions.
func TestByzantineHonestProxy(t *testing.T) {
	ctx := context.Background()
	e := newByzEnv(t)
	if err := e.v.RegisterContract(ctx, "transfer", []byte(transfer)); err != nil {
		t.Fatal(err)
	}
	e.exec(t, "builtin.bulk_load", `{"prefix":"k","first":0,"count":8,"payload":"x"}`)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range 30 {
				var err error
				switch rng.IntN(3) {
				case 0:
					_, err = e.v.Execute(ctx, "builtin.ycsb_f", fmt.Appendf(nil, `{"id":"k%d","payload":"p%d"}`, rng.IntN(8), w))
				case 1:
					_, err = e.v.Execute(ctx, "builtin.ycsb_c", fmt.Appendf(nil, `{"ids":["k%d","k%d"]}`, rng.IntN(8), rng.IntN(8)))
				default:
					_, err = e.v.Execute(ctx, "transfer", fmt.Appendf(nil, `{"from":"a%d","to":"a%d","amount":%d}`, rng.IntN(4), 4+rng.IntN(4), rng.IntN(150)))
				}
				if err != nil && !strings.Contains(err.Error(), "insufficient") {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	rep := validate(t, e.v, Scope{CrossCheck: true})
	if !rep.OK() || rep.Validated != 241 || rep.Unresolved != 0 || rep.CrossChecked == 0 {
		var b strings.Builder
		rep.Print(&b)
		t.Fatalf("honest history through the proxy: %s", b.String())
	}
	t.Logf("validated %d (%d aborted), graph %d/%d, cross-checked %d", rep.Validated, rep.Aborted, rep.GraphNodes, rep.GraphEdges, rep.CrossChecked)
}
