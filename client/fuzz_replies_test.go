package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/wire"
)

// FuzzReplies runs an SDK call against a Byzantine ledger: a proxy in front
// of a real server that answers the calls it receives, in order, as a
// script made of the fuzzer's bytes says — forward the call, reply with
// the script's bytes as the reply message (on the CallBatches stream, as a
// CallReply under the call's id), fail with a status and error kind, or
// forward and then lose the reply — and forwards everything once the
// script is spent. Whatever the replies hold, the SDK does not panic or
// hang, and a call that fails returns a typed error: a *client.Error, an
// error wrapping a ledger sentinel, or one of the SDK's own ("client: …").
// A call whose replies were all forwarded returns what the real ledger
// says.
func FuzzReplies(f *testing.F) {
	h := newByzHarness(f)
	forward, lose := []byte{0, 0, 0}, []byte{3, 0, 0}
	step := func(action byte, body []byte) []byte {
		return append([]byte{action, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	// On the CallBatches stream a reply holds its result too (see
	// sdkNilResult).
	emptyExec, _ := proto.Marshal(&api.CallReply{Result: &api.CallReply_Execute{Execute: &api.ExecuteReply{}}})
	badExec := append(bytes.Clone(emptyExec[:len(emptyExec)-1]), 0x03, 0x0a, 0x01, 0xff) // a nonce that is not UTF-8
	emptyState, _ := proto.Marshal(&api.CallReply{Result: &api.CallReply_TxState{TxState: &api.TxState{}}})
	for op := range opCount {
		empty, bad := []byte(nil), []byte("\x0a\x01\xff")
		switch op {
		case opExecuteMux:
			empty, bad = emptyExec, badExec
		case opTxState:
			empty, bad = emptyState, append(bytes.Clone(emptyState[:len(emptyState)-1]), 0x03, 0x0a, 0x01, 0xff)
		}
		f.Add(uint8(op), []byte{})
		f.Add(uint8(op), step(1, empty))
		f.Add(uint8(op), step(1, bad))
		f.Add(uint8(op), step(2, []byte{byte(codes.Unavailable), 0}))
		f.Add(uint8(op), step(2, []byte{byte(codes.AlreadyExists), 5}))
		f.Add(uint8(op), lose)
		f.Add(uint8(op), append(bytes.Clone(forward), step(1, h.honest[op])...))
	}
	// A reply with a proof listing an input twice; a reply lost after its
	// commit, whose retry then finds the outcome through GetTxState,
	// GetProof and GetAsset.
	twice, _ := proto.Marshal(&api.ExecuteReply{Proofs: []*api.Proof{{Input: []*api.InputEntry{{Id: "a"}, {Id: "a"}}}}})
	f.Add(uint8(opExecuteUnary), step(1, twice))
	f.Add(uint8(opExecuteUnary), append(append(bytes.Clone(lose), forward...), step(1, h.honest[opTxState])...))
	f.Fuzz(func(t *testing.T, op uint8, data []byte) {
		h.run(t, int(op)%opCount, data)
	})
}

// The SDK calls FuzzReplies makes.
const (
	opExecuteMux = iota
	opExecuteUnary
	opTxState
	opTxStateUnary
	opHistory
	opProof
	opValidate
	opLedgerKey
	opListContracts
	opCommittedResult
	opCount
)

// byzHarness is a real server, a scripted proxy in front of it, and what
// the real server answers.
type byzHarness struct {
	srv    *server.Running
	up     *grpc.ClientConn // to the real server
	proxy  string           // its address
	script atomic.Pointer[script]
	seq    atomic.Int64

	state  *proof.TxState   // of the committed nonce h0
	hist   []*proof.Version // of asset h
	result *proof.Result    // of h0
	honest [opCount][]byte  // a reply of the real server to each op's first call, for seeds
	secret []byte
	entity string
	kinds  []string
}

const putSource = "def invoke(ledger, args):\n    ledger.put(args['id'], args['v'])\n    return args['v']\n"

func newByzHarness(f *testing.F) *byzHarness {
	f.Helper()
	ctx := context.Background()
	srv, err := server.Start(ctx, server.Options{DataDir: f.TempDir(), Listen: "127.0.0.1:0", AdminToken: token,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Stop(time.Second) })
	h := &byzHarness{srv: srv, secret: bytes.Repeat([]byte{4}, 32), entity: "fz", kinds: append(proof.Kinds(), wire.KindCommitUnknown, "bogus")}
	c, err := client.Dial(client.Config{Server: srv.Addr(), Entity: h.entity, Secret: h.secret, AdminToken: token})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	if err := c.RegisterSecret(ctx); err != nil {
		f.Fatal(err)
	}
	if err := c.RegisterContract(ctx, "put", []byte(putSource)); err != nil {
		f.Fatal(err)
	}
	for i := range 3 {
		r, err := c.SignRequest(&proof.Request{Nonce: fmt.Sprintf("h%d", i), ContractID: "put", Argument: fmt.Appendf(nil, `{"id":"h","v":%d}`, i)})
		if err != nil {
			f.Fatal(err)
		}
		if h.result == nil {
			if h.result, err = c.ExecuteRequest(ctx, r); err != nil {
				f.Fatal(err)
			}
		} else if _, err := c.ExecuteRequest(ctx, r); err != nil {
			f.Fatal(err)
		}
	}
	if h.state, err = c.TxState(ctx, "h0"); err != nil {
		f.Fatal(err)
	}
	if h.hist, err = c.History(ctx, "h", proof.ScanRange{End: -1, Ascending: true}); err != nil {
		f.Fatal(err)
	}
	if h.up, err = grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { h.up.Close() })

	gs := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
	desc := grpc.ServiceDesc{ServiceName: api.Ledger_ServiceDesc.ServiceName, HandlerType: (*any)(nil), Metadata: api.Ledger_ServiceDesc.Metadata,
		Streams: []grpc.StreamDesc{{StreamName: "CallBatches", Handler: h.callBatches, ServerStreams: true, ClientStreams: true}}}
	for _, m := range api.Ledger_ServiceDesc.Methods {
		method := "/" + api.Ledger_ServiceDesc.ServiceName + "/" + m.MethodName
		desc.Methods = append(desc.Methods, grpc.MethodDesc{MethodName: m.MethodName,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var in rawMsg
				if err := dec(&in); err != nil {
					return nil, err
				}
				return h.unary(ctx, method, in.b)
			}})
	}
	gs.RegisterService(&desc, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	h.proxy = lis.Addr().String()
	go func() { _ = gs.Serve(lis) }()
	f.Cleanup(gs.Stop)

	// Honest replies, recorded through the proxy with an empty script.
	for op := range opCount {
		rec := &script{record: true}
		h.script.Store(rec)
		if err := h.call(op); err != nil {
			f.Fatalf("op %d through an honest proxy: %v", op, err)
		}
		h.honest[op] = rec.recorded
	}
	return h
}

// script is the proxy's answers to the calls it receives, in order.
type script struct {
	mu       sync.Mutex
	data     []byte
	faulted  bool // a step other than forward was taken
	record   bool // keep the first reply forwarded, in recorded
	recorded []byte
}

// step returns the next step: action (0 forward, 1 reply with body, 2 fail
// as body says, 3 forward and lose the reply) and body; forward once spent.
func (s *script) step() (byte, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.data) < 3 {
		return 0, nil
	}
	action, n := s.data[0]%4, int(s.data[1])<<8|int(s.data[2])
	n = min(n, len(s.data)-3)
	body := s.data[3 : 3+n]
	s.data = s.data[3+n:]
	if action != 0 {
		s.faulted = true
	}
	return action, body
}

func (s *script) keep(reply []byte) {
	s.mu.Lock()
	if s.record && s.recorded == nil {
		s.recorded = bytes.Clone(reply)
	}
	s.mu.Unlock()
}

// failure is the code and error kind a fail step's body names.
func (h *byzHarness) failure(body []byte) (codes.Code, string) {
	code, kind := codes.Unknown, ""
	if len(body) > 0 && body[0]%17 != 0 {
		code = codes.Code(body[0] % 17)
	}
	if len(body) > 1 {
		kind = h.kinds[int(body[1])%len(h.kinds)]
	}
	return code, kind
}

func (h *byzHarness) unary(ctx context.Context, method string, in []byte) (any, error) {
	s := h.script.Load()
	action, body := s.step()
	switch action {
	case 1:
		return &rawMsg{bytes.Clone(body)}, nil
	case 2:
		code, kind := h.failure(body)
		if kind != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(wire.ErrorKindKey, kind))
		}
		return nil, status.Error(code, "byzantine proxy")
	}
	var out rawMsg
	var tr metadata.MD
	err := h.up.Invoke(ctx, method, &rawMsg{in}, &out, grpc.ForceCodecV2(rawCodec{}), grpc.Trailer(&tr))
	if len(tr) > 0 {
		_ = grpc.SetTrailer(ctx, tr)
	}
	if err != nil {
		return nil, err
	}
	s.keep(out.b)
	if action == 3 {
		return nil, status.Error(codes.Unavailable, "byzantine proxy: reply lost")
	}
	return &out, nil
}

// callBatches answers each call of the stream as the script says, one
// reply message per call.
func (h *byzHarness) callBatches(_ any, st grpc.ServerStream) error {
	for {
		var in rawMsg
		if err := st.RecvMsg(&in); err != nil {
			return nil
		}
		var msg api.CallRequests
		if err := proto.Unmarshal(in.b, &msg); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		for _, c := range msg.Calls {
			if c.GetCancel() != nil {
				continue
			}
			reply, err := h.callReply(st.Context(), c)
			if err != nil {
				return err
			}
			out := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), reply)
			if err := st.SendMsg(&rawMsg{out}); err != nil {
				return nil
			}
		}
	}
}

// callReply is the encoded CallReply to c; an error ends the stream.
func (h *byzHarness) callReply(ctx context.Context, c *api.CallRequest) ([]byte, error) {
	s := h.script.Load()
	action, body := s.step()
	id := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), c.Id)
	switch action {
	case 1:
		return append(bytes.Clone(body), id...), nil // the id last: it wins
	case 2:
		code, kind := h.failure(body)
		return proto.Marshal(&api.CallReply{Id: c.Id, Result: &api.CallReply_Error{Error: &api.CallError{Code: int32(code), Message: "byzantine proxy", Kind: kind}}})
	}
	var tr metadata.MD
	r := &api.CallReply{Id: c.Id}
	var err error
	switch call := c.Call.(type) {
	case *api.CallRequest_Execute:
		var out *api.ExecuteReply
		if out, err = api.NewLedgerClient(h.up).ExecuteContract(ctx, call.Execute, grpc.Trailer(&tr)); err == nil {
			r.Result = &api.CallReply_Execute{Execute: out}
		}
	case *api.CallRequest_GetTxState:
		var out *api.TxState
		if out, err = api.NewLedgerClient(h.up).GetTxState(ctx, call.GetTxState, grpc.Trailer(&tr)); err == nil {
			r.Result = &api.CallReply_TxState{TxState: out}
		}
	default:
		err = status.Error(codes.InvalidArgument, "no call")
	}
	if err != nil {
		st := status.Convert(err)
		e := &api.CallError{Code: int32(st.Code()), Message: st.Message()}
		if k := tr.Get(wire.ErrorKindKey); len(k) > 0 {
			e.Kind = k[0]
		}
		r.Result = &api.CallReply_Error{Error: e}
	}
	b, err := proto.Marshal(r)
	if err != nil {
		return nil, err
	}
	s.keep(b)
	if action == 3 {
		return nil, status.Error(codes.Unavailable, "byzantine proxy: reply lost")
	}
	return b, nil
}

// run makes op's call through the proxy with data as its script and
// checks the outcome.
func (h *byzHarness) run(t *testing.T, op int, data []byte) {
	s := &script{data: data}
	h.script.Store(s)
	done := make(chan error, 1)
	go func() { done <- h.call(op) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("op %d with script %q: no answer in 30 s", op, data)
	}
	s.mu.Lock()
	faulted := s.faulted
	s.mu.Unlock()
	if err == nil {
		return
	}
	if !faulted {
		t.Fatalf("op %d, every reply forwarded: %v", op, err)
	}
	var ce *client.Error
	if !errors.As(err, &ce) && proof.Kind(err) == "" && !errors.Is(err, client.ErrBadReply) && !strings.HasPrefix(err.Error(), "client: ") {
		t.Fatalf("op %d with script %q: untyped error %T %v", op, data, err, err)
	}
}

// call makes op's SDK call through the proxy, on a client of its own, and
// when every reply was forwarded, checks it against what the real ledger
// answered.
func (h *byzHarness) call(op int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(client.Config{Server: h.proxy, Entity: h.entity, Secret: h.secret, UnaryCalls: op == opExecuteUnary || op == opTxStateUnary,
		AttemptTimeout: 2 * time.Second, MaxAttempts: 3})
	if err != nil {
		return err
	}
	defer c.Close()
	honest := func() bool {
		s := h.script.Load()
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.faulted
	}
	mismatch := func(format string, a ...any) error {
		if honest() {
			return fmt.Errorf("honest reply: "+format, a...)
		}
		return nil
	}
	switch op {
	case opExecuteMux, opExecuteUnary:
		id := fmt.Sprintf("x%d-%d", op, h.seq.Add(1))
		res, err := c.Execute(ctx, "put", fmt.Appendf(nil, `{"id":%q,"v":[1,"é"]}`, id))
		if err != nil {
			return err
		}
		if string(res.Result) != `[1,"é"]` || len(res.Proofs) != 1 || res.Proofs[0].ID != id || res.Writes[id] != 0 {
			return mismatch("result %s, proofs %v", res.Result, res.Proofs)
		}
		if honest() {
			if err := proof.Verify(h.srv.ProofVerifier, &res.Receipt, res.Signature); err != nil {
				return fmt.Errorf("honest receipt: %w", err)
			}
		}
	case opTxState, opTxStateUnary:
		st, err := c.TxState(ctx, "h0")
		if err != nil {
			return err
		}
		if st.Status != h.state.Status || !bytes.Equal(st.Result, h.state.Result) || !bytes.Equal(st.Signature, h.state.Signature) {
			return mismatch("state %+v, want %+v", st, h.state)
		}
	case opHistory:
		vs, err := c.History(ctx, "h", proof.ScanRange{End: -1, Ascending: true})
		if err != nil {
			return err
		}
		if len(vs) != len(h.hist) {
			return mismatch("%d versions, want %d", len(vs), len(h.hist))
		}
		for i, v := range vs {
			if v.Age != h.hist[i].Age || !bytes.Equal(v.Hash, h.hist[i].Hash) {
				return mismatch("version %d: %s@%d", i, v.ID, v.Age)
			}
		}
	case opProof:
		p, err := c.Proof(ctx, "h", 1)
		if err != nil {
			return err
		}
		if want := h.hist[1].Proof(); p.ID != want.ID || p.Age != want.Age || !bytes.Equal(p.Signature, want.Signature) {
			return mismatch("proof %+v, want %+v", p, want)
		}
	case opValidate:
		v, err := c.ValidateLedger(ctx, "h", 0, -1)
		if err != nil {
			return err
		}
		if !v.Ok || v.Checked != int64(len(h.hist)) {
			return mismatch("validation %v", v)
		}
	case opLedgerKey:
		k, err := c.LedgerKey(ctx)
		if err != nil {
			return err
		}
		if !proto.Equal(k, h.srv.Key) {
			return mismatch("key %v, want %v", k, h.srv.Key)
		}
	case opListContracts:
		cs, err := c.ListContracts(ctx)
		if err != nil {
			return err
		}
		found := false
		for _, ci := range cs {
			found = found || (ci.ContractId == "put" && string(ci.Source) == putSource)
		}
		if !found {
			return mismatch("contracts %v lack put", cs)
		}
	case opCommittedResult:
		res, err := c.CommittedResult(ctx, h.state)
		if err != nil {
			return err
		}
		if len(res.Proofs) != len(h.result.Proofs) || !bytes.Equal(res.Result, h.result.Result) {
			return mismatch("result %+v, want %+v", res, h.result)
		}
		for i := range res.Proofs {
			if !bytes.Equal(res.Proofs[i].Signature, h.result.Proofs[i].Signature) {
				return mismatch("proof %d differs", i)
			}
		}
	}
	return nil
}

// rawMsg is a message as its encoded bytes.
type rawMsg struct{ b []byte }

// rawCodec carries *rawMsg as its bytes, whatever they hold: the proxy
// sends replies no protobuf library would marshal. It is named "proto",
// so the client decodes them with its protobuf codec.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
