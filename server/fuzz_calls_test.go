package server

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/wire"
)

// Fuzz targets for the server's request paths, each against a real server
// on the embedded engine, over gRPC on loopback, with request messages
// made of the fuzzer's bytes as they are (rawCodec), so that they need not
// even decode. Whatever arrives, the server answers with a status of its
// meaning, never INTERNAL or UNKNOWN (which say the server failed) and
// never by panicking; a request that does not decode is INVALID_ARGUMENT;
// a ledger error carries its kind; and what the server does answer holds
// what an honest ledger's answer must.

// fuzzServer is a server with a few assets and committed transactions
// (nonces n0…), an identity fz with an HMAC secret, and a contract echo.
type fuzzServer struct {
	srv    *Running
	conn   *grpc.ClientConn
	hs     auth.Signer
	nonces []string // committed
}

func newFuzzServer(f *testing.F) *fuzzServer {
	f.Helper()
	ctx := context.Background()
	srv := startServer(f, Options{})
	secret := bytes.Repeat([]byte{9}, 32)
	if err := srv.Ledger.RegisterSecret(ctx, "fz", 1, secret); err != nil {
		f.Fatal(err)
	}
	hs, _ := auth.NewHMACSigner(secret)
	fs := &fuzzServer{srv: srv, conn: rawConn(f, srv), hs: hs}
	reg := &ledger.ContractRegistration{ID: "echo", Source: []byte("def invoke(ledger, args):\n    return args\n"), Entity: "fz", KeyVersion: 1}
	reg.Signature, _ = ledger.Sign(hs, reg)
	if err := srv.Ledger.RegisterContract(ctx, reg); err != nil {
		f.Fatal(err)
	}
	for i, c := range []struct{ contract, arg string }{
		{"builtin.bulk_load", `{"prefix":"a","first":0,"count":5,"payload":"p"}`},
		{"builtin.ycsb_f", `{"id":"a0","payload":"q"}`},
		{"builtin.ycsb_f", `{"id":"a0","payload":"r"}`},
		{"builtin.ycsb_c", `{"ids":["a0","a1"]}`},
	} {
		r := fs.request(fmt.Sprintf("n%d", i), c.contract, c.arg)
		if _, err := srv.Ledger.Execute(ctx, wire.RequestFromAPI(r)); err != nil {
			f.Fatal(err)
		}
		fs.nonces = append(fs.nonces, r.Nonce)
	}
	bad := fs.request("n-bad", "echo", `{"a":`) // an abort, recorded
	if _, err := srv.Ledger.Execute(ctx, wire.RequestFromAPI(bad)); err == nil {
		f.Fatal("a bad argument was executed")
	}
	return fs
}

// request is a request signed by fz.
func (fs *fuzzServer) request(nonce, contract, arg string) *api.ExecuteRequest {
	r := &ledger.Request{Nonce: nonce, ContractID: contract, Argument: []byte(arg), Entity: "fz", KeyVersion: 1}
	r.Signature, _ = ledger.Sign(fs.hs, r)
	return wire.RequestToAPI(r)
}

// signedByFz reports whether r carries fz's signature of itself.
func (fs *fuzzServer) signedByFz(r *api.ExecuteRequest) bool {
	lr := wire.RequestFromAPI(r)
	good, _ := ledger.Sign(fs.hs, lr)
	return lr.Entity == "fz" && lr.KeyVersion == 1 && bytes.Equal(good, lr.Signature)
}

// invoke calls method with req's bytes as they are. It returns the status,
// the reply's bytes and the error kind the trailer names.
func (fs *fuzzServer) invoke(t *testing.T, method string, req []byte) (*status.Status, []byte, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reply rawMsg
	var tr metadata.MD
	err := fs.conn.Invoke(ctx, method, &rawMsg{req}, &reply, grpc.ForceCodecV2(rawCodec{}), grpc.Trailer(&tr))
	var kind string
	if k := tr.Get(wire.ErrorKindKey); len(k) > 0 {
		kind = k[0]
	}
	return status.Convert(err), reply.b, kind
}

// checkStatus checks the status a request was answered with: never
// INTERNAL or UNKNOWN; INVALID_ARGUMENT, without a kind, for a request
// that does not decode (into req); for a decoded one, a failure carries a
// ledger error kind that travels with its code.
func checkStatus(t *testing.T, data []byte, req proto.Message, st *status.Status, kind string) (decoded bool) {
	t.Helper()
	if c := st.Code(); c == codes.Internal || c == codes.Unknown {
		t.Fatalf("request %q: %v", data, st.Err())
	}
	if err := proto.Unmarshal(data, req); err != nil {
		if st.Code() != codes.InvalidArgument {
			t.Fatalf("request %q does not decode (%v), but the server answered %v", data, err, st.Err())
		}
		return false
	}
	if st.Code() != codes.OK && (kind == "" || wire.Code(kind) != st.Code()) {
		t.Fatalf("request %v: %v with error kind %q", req, st.Err(), kind)
	}
	return true
}

// FuzzGetAsset: an answered GetAsset is versions of the asset asked for,
// within the range, in the order asked, at most the limit the reply states
// (the one asked for, capped), each hashing to its hash and carrying the
// ledger's proof signature.
func FuzzGetAsset(f *testing.F) {
	fs := newFuzzServer(f)
	for _, r := range []*api.GetAssetRequest{{Id: "a0", EndAge: -1}, {Id: "a0", EndAge: -1, Descending: true, Limit: 2},
		{Id: "a0", StartAge: 1, EndAge: 1}, {Id: "a0", StartAge: -1, EndAge: -1}, {Id: "a0", StartAge: math.MaxInt64, EndAge: math.MinInt64},
		{Id: "a1", EndAge: math.MaxInt64, Limit: -1}, {Id: "zz", EndAge: -1}, {Id: "", EndAge: -1}, {Id: "a b"}, {Id: "a0", Limit: math.MaxInt32}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte("\x0a\x03a\xff0"))
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, out, kind := fs.invoke(t, api.Ledger_GetAsset_FullMethodName, data)
		var req api.GetAssetRequest
		if !checkStatus(t, data, &req, st, kind) || st.Code() != codes.OK {
			return
		}
		var reply api.GetAssetReply
		if err := proto.Unmarshal(out, &reply); err != nil {
			t.Fatalf("reply to %v does not decode: %v", &req, err)
		}
		want := int32(1000) // the server's cap
		if req.Limit > 0 && req.Limit < want {
			want = req.Limit
		}
		if reply.Limit != want || len(reply.Versions) > int(want) {
			t.Fatalf("%v: %d versions, limit %d; want at most %d", &req, len(reply.Versions), reply.Limit, want)
		}
		for i, av := range reply.Versions {
			v, err := wire.VersionFromAPI(av)
			if err != nil {
				t.Fatalf("%v: version %d does not convert: %v", &req, i, err)
			}
			if v.ID != req.Id || v.Age < req.StartAge || (req.EndAge >= 0 && v.Age > req.EndAge) {
				t.Fatalf("%v: version %s@%d is outside the range", &req, v.ID, v.Age)
			}
			if i > 0 && (v.Age > reply.Versions[i-1].Age) != !req.Descending {
				t.Fatalf("%v: ages %d then %d", &req, reply.Versions[i-1].Age, v.Age)
			}
			if !bytes.Equal(v.ComputeHash(), v.Hash) {
				t.Fatalf("%v: version %s@%d does not hash to its hash", &req, v.ID, v.Age)
			}
			p := v.Proof()
			if err := ledger.Verify(fs.srv.ProofVerifier, &p, p.Signature); err != nil {
				t.Fatalf("%v: the proof of %s@%d: %v", &req, v.ID, v.Age, err)
			}
		}
	})
}

// FuzzGetProof: an answered GetProof is the proof of the version asked
// for, signed by the ledger.
func FuzzGetProof(f *testing.F) {
	fs := newFuzzServer(f)
	for _, r := range []*api.GetProofRequest{{Id: "a0", Age: 0}, {Id: "a0", Age: 2}, {Id: "a0", Age: 3}, {Id: "a0", Age: -1},
		{Id: "a4", Age: math.MaxInt64}, {Id: "", Age: 0}, {Id: "\x00"}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte("\x0a\x02\xc3\x28"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, out, kind := fs.invoke(t, api.Ledger_GetProof_FullMethodName, data)
		var req api.GetProofRequest
		if !checkStatus(t, data, &req, st, kind) || st.Code() != codes.OK {
			return
		}
		var reply api.Proof
		if err := proto.Unmarshal(out, &reply); err != nil {
			t.Fatalf("reply to %v does not decode: %v", &req, err)
		}
		p, err := wire.ProofFromAPI(&reply)
		if err != nil || p.ID != req.Id || p.Age != req.Age {
			t.Fatalf("%v: the proof of %s@%d (%v)", &req, reply.Id, reply.Age, err)
		}
		if err := ledger.Verify(fs.srv.ProofVerifier, p, p.Signature); err != nil {
			t.Fatalf("%v: %v", &req, err)
		}
	})
}

// FuzzGetTxState: an answered GetTxState is the state of the nonce asked
// for: committed with a receipt the ledger signed, aborted with the kind
// and reason of the abort, or unknown.
func FuzzGetTxState(f *testing.F) {
	fs := newFuzzServer(f)
	for _, n := range append(slices.Clone(fs.nonces), "n-bad", "never", "", " ", "n0\n") {
		b, _ := proto.Marshal(&api.GetTxStateRequest{Nonce: n})
		f.Add(b)
	}
	f.Add([]byte("\x0a\x01\x80"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, out, kind := fs.invoke(t, api.Ledger_GetTxState_FullMethodName, data)
		var req api.GetTxStateRequest
		if !checkStatus(t, data, &req, st, kind) || st.Code() != codes.OK {
			return
		}
		var reply api.TxState
		if err := proto.Unmarshal(out, &reply); err != nil {
			t.Fatalf("reply to %v does not decode: %v", &req, err)
		}
		checkTxState(t, fs, &reply, req.Nonce)
	})
}

// checkTxState checks an honest ledger's state of nonce.
func checkTxState(t *testing.T, fs *fuzzServer, reply *api.TxState, nonce string) {
	t.Helper()
	lst, err := wire.TxStateFromAPI(reply)
	if err != nil || lst.Nonce != nonce {
		t.Fatalf("the state of %q is the state of %q (%v)", nonce, lst.Nonce, err)
	}
	switch lst.Status {
	case ledger.TxCommitted:
		rc := lst.Receipt()
		if err := ledger.Verify(fs.srv.ProofVerifier, &rc, rc.Signature); err != nil {
			t.Fatalf("the receipt of %q: %v", nonce, err)
		}
	case ledger.TxAborted:
		if ledger.KindError(lst.Kind) == nil || lst.Reason == "" {
			t.Fatalf("%q aborted with kind %q, reason %q", nonce, lst.Kind, lst.Reason)
		}
	case ledger.TxUnknown:
		if slices.Contains(fs.nonces, nonce) {
			t.Fatalf("committed %q is unknown", nonce)
		}
	default:
		t.Fatalf("%q has status %q", nonce, lst.Status)
	}
}

// FuzzValidateLedger: validation of an honest ledger never finds a fault,
// and reports the asset and range it checked.
func FuzzValidateLedger(f *testing.F) {
	fs := newFuzzServer(f)
	for _, r := range []*api.ValidateLedgerRequest{{Id: "a0", EndAge: -1}, {Id: "a0", StartAge: 1, EndAge: 2}, {Id: "a0", StartAge: 3, EndAge: 1},
		{Id: "a0", StartAge: -1, EndAge: -1}, {Id: "a2", StartAge: math.MaxInt64, EndAge: math.MaxInt64}, {Id: "a3", EndAge: math.MinInt64},
		{Id: "none", EndAge: -1}, {Id: ""}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, out, kind := fs.invoke(t, api.Ledger_ValidateLedger_FullMethodName, data)
		var req api.ValidateLedgerRequest
		if !checkStatus(t, data, &req, st, kind) || st.Code() != codes.OK {
			return
		}
		var reply api.ValidateLedgerReply
		if err := proto.Unmarshal(out, &reply); err != nil {
			t.Fatalf("reply to %v does not decode: %v", &req, err)
		}
		if !reply.Ok || reply.Id != req.Id || reply.StartAge != req.StartAge || reply.Checked < 0 ||
			(reply.Checked > 0 && reply.EndAge-reply.StartAge+1 != reply.Checked) {
			t.Fatalf("%v: %v", &req, &reply)
		}
	})
}

// FuzzCalls sends one message of arbitrary bytes on a CallBatches stream
// and closes it. The stream ends INVALID_ARGUMENT if the message does not
// decode, and OK after answering each of its calls once otherwise: every
// call but a cancel gets exactly one reply, under its id, of its kind
// (an execute's result or a transaction state, for its nonce) or an error
// of meaning (DEADLINE_EXCEEDED only for a call with a timeout that a
// time.Duration holds, CANCELLED only for one cancelled); only a request
// fz signed executes.
func FuzzCalls(f *testing.F) {
	fs := newFuzzServer(f)
	add := func(calls ...*api.CallRequest) {
		b, err := proto.Marshal(&api.CallRequests{Calls: calls})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	exec := func(id uint64, timeout int64, r *api.ExecuteRequest) *api.CallRequest {
		return &api.CallRequest{Id: id, TimeoutMicros: timeout, Call: &api.CallRequest_Execute{Execute: r}}
	}
	state := func(id uint64, nonce string) *api.CallRequest {
		return &api.CallRequest{Id: id, Call: &api.CallRequest_GetTxState{GetTxState: &api.GetTxStateRequest{Nonce: nonce}}}
	}
	cancel := func(id uint64) *api.CallRequest {
		return &api.CallRequest{Id: id, Call: &api.CallRequest_Cancel{Cancel: &api.CancelCall{}}}
	}
	add(exec(1, 0, fs.request("s1", "echo", `{"a":[1,"x"]}`)), state(2, "n0"), state(3, "s1"))
	add(exec(1, 1, fs.request("s2", "builtin.ycsb_f", `{"id":"a1","payload":"z"}`)), exec(1, math.MaxInt64, fs.request("s3", "echo", `1`)))
	add(exec(7, 1<<62, fs.request("s4", "echo", `2`)), exec(8, -5, fs.request("s5", "echo", `3`)), cancel(7))
	add(exec(9, 0, fs.request("s6", "echo", `{"a":`)), exec(10, 0, fs.request("s7", "nope", `{}`)), &api.CallRequest{Id: 11})
	add(exec(12, 0, fs.request("n0", "echo", `1`)), exec(13, 0, fs.request("s8", "echo", "\"\xff\"")), state(14, ""), cancel(99))
	add(exec(15, 0, &api.ExecuteRequest{}), state(16, "n-bad"))
	add()
	f.Add([]byte{0x0a, 0x04, 0x08, 0x01, 0x22, 0x00})
	f.Add([]byte{0x0a, 0x07, 0x08, 0x01, 0x22, 0x03, 0x0a, 0x01, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		code, replies, err := streamRaw(context.Background(), fs.conn, data)
		if err != nil {
			t.Fatalf("message %q: %v", data, err)
		}
		var msg api.CallRequests
		if derr := proto.Unmarshal(data, &msg); derr != nil {
			if code != codes.InvalidArgument || len(replies) != 0 {
				t.Fatalf("message %q does not decode (%v), but the stream ended %v after %d replies", data, derr, code, len(replies))
			}
			return
		}
		if code != codes.OK {
			t.Fatalf("%v: the stream ended %v", &msg, code)
		}
		checkReplies(t, fs, &msg, replies)
	})
}

// checkReplies checks the replies to the calls of msg (see FuzzCalls).
func checkReplies(t *testing.T, fs *fuzzServer, msg *api.CallRequests, replies []*api.CallReplies) {
	t.Helper()
	pending := map[uint64][]*api.CallRequest{} // calls not yet answered, by id
	cancelled := map[uint64]bool{}
	for _, c := range msg.Calls {
		if _, ok := c.Call.(*api.CallRequest_Cancel); ok {
			cancelled[c.Id] = true
			continue
		}
		pending[c.Id] = append(pending[c.Id], c)
	}
	var errs []*api.CallReply
	for _, rs := range replies {
		for _, r := range rs.Replies {
			match := func(kind func(*api.CallRequest) bool) *api.CallRequest {
				cs := pending[r.Id]
				i := slices.IndexFunc(cs, kind)
				if i < 0 {
					t.Fatalf("%v: reply %v answers no call", msg, r)
				}
				c := cs[i]
				pending[r.Id] = slices.Delete(cs, i, i+1)
				return c
			}
			switch res := r.Result.(type) {
			case *api.CallReply_Execute:
				c := match(func(c *api.CallRequest) bool {
					return c.GetExecute() != nil && c.GetExecute().Nonce == res.Execute.Nonce
				})
				if !fs.signedByFz(c.GetExecute()) {
					t.Fatalf("%v: executed %v, as %v", msg, c, res.Execute)
				}
			case *api.CallReply_TxState:
				c := match(func(c *api.CallRequest) bool {
					return c.GetGetTxState() != nil && c.GetGetTxState().Nonce == res.TxState.Nonce
				})
				checkTxState(t, fs, res.TxState, c.GetGetTxState().Nonce)
			case *api.CallReply_Error:
				errs = append(errs, r) // matched once the typed replies are
			default:
				t.Fatalf("%v: reply %v holds no result", msg, r)
			}
		}
	}
	for _, r := range errs {
		cs := pending[r.Id]
		if len(cs) == 0 {
			t.Fatalf("%v: reply %v answers no call", msg, r)
		}
		c := cs[0]
		pending[r.Id] = cs[1:]
		e := r.GetError()
		switch code := codes.Code(e.Code); {
		case code == codes.OK || code == codes.Internal || code == codes.Unknown:
			t.Fatalf("%v: call %v failed with %v: %s", msg, c, code, e.Message)
		case code == codes.DeadlineExceeded && (c.TimeoutMicros <= 0 || c.TimeoutMicros > maxTimeoutMicros):
			t.Fatalf("%v: call %v, whose timeout is none, exceeded its deadline", msg, c)
		case code == codes.Canceled && !cancelled[c.Id]:
			t.Fatalf("%v: call %v was cancelled", msg, c)
		case e.Kind != "" && wire.Code(e.Kind) != code:
			t.Fatalf("%v: call %v failed with %v and error kind %q", msg, c, code, e.Kind)
		}
	}
	for id, cs := range pending {
		if len(cs) > 0 {
			t.Fatalf("%v: %d calls under id %d got no reply", msg, len(cs), id)
		}
	}
}
