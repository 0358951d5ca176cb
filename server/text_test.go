package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/ledger"
)

// Text a client sends that is not what the ledger would store: arguments
// whose strings are not UTF-8 or name lone surrogates, arguments nested
// past the depth limit, and request messages whose string fields are not
// UTF-8. Each is refused as the client's fault, INVALID_ARGUMENT, and
// nothing is written.

// echoPut stores its argument's v under its id and returns it: what it
// stores and returns is what the ledger made of the argument.
const echoPut = "def invoke(ledger, args):\n    ledger.put(args['id'], args['v'])\n    return args['v']\n"

// TestArgumentTextIsRefused: an argument whose text has no canonical form
// (RFC 8785) is refused with bad_argument, by a Starlark contract and a
// built-in alike; before, a Starlark contract read invalid UTF-8 and lone
// surrogates as U+FFFD and stored that, which is not what was signed.
func TestArgumentTextIsRefused(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, Options{AdminToken: "admin-token"})
	c := secretClient(t, srv, "ann", "admin-token")
	if err := c.RegisterContract(ctx, "echo", []byte(echoPut)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, v string }{
		{"invalid UTF-8", "\"a\xffb\""},
		{"a UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"a truncated UTF-8 sequence", "\"\xc3\""},
		{"an overlong UTF-8 encoding", "\"\xc0\xaf\""},
		{"a lone high surrogate", `"\ud800"`},
		{"a lone high surrogate before another escape", `"\ud800\u0041"`},
		{"a lone low surrogate", `"\udc00"`},
		{"a lone surrogate as a key", `{"\udfff":1}`},
	} {
		for _, contract := range []string{"echo", "builtin.ycsb_f"} {
			arg := `{"id":"k","v":` + tc.v + `}`
			if contract == "builtin.ycsb_f" {
				arg = `{"id":"k","payload":` + tc.v + `}`
			}
			_, err := c.Execute(ctx, contract, []byte(arg))
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != codes.InvalidArgument || !errors.Is(err, ledger.ErrBadArgument) {
				t.Errorf("%s, %s: got %v, want INVALID_ARGUMENT bad_argument", tc.name, contract, err)
			}
		}
	}
	if vs, err := c.History(ctx, "k", ledger.ScanRange{End: -1}); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("after refused arguments, asset k has %d versions (%v), want none", len(vs), err)
	}
	// A surrogate pair is one character, and valid.
	res, err := c.Execute(ctx, "echo", []byte(`{"id":"k","v":"\ud83d\ude00"}`))
	if err != nil || string(res.Result) != `"😀"` {
		t.Fatalf("a surrogate pair: %s, %v; want \"😀\"", res.Result, err)
	}
}

// TestContractTextIsRefused: a string a contract makes that is not UTF-8
// (a byte slice of a multi-byte character) is a value JSON cannot hold,
// bad_value, rather than U+FFFD in its stead.
func TestContractTextIsRefused(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, Options{AdminToken: "admin-token"})
	c := secretClient(t, srv, "bo", "admin-token")
	for id, src := range map[string]string{
		"result": "def invoke(ledger, args):\n    return args['v'][0:1]\n",
		"put":    "def invoke(ledger, args):\n    ledger.put('p', args['v'][0:1])\n    return 1\n",
		"key":    "def invoke(ledger, args):\n    return {args['v'][0:1]: 1}\n",
		"call":   "def invoke(ledger, args):\n    return ledger.call('result', args)\n",
	} {
		if err := c.RegisterContract(ctx, id, []byte(src)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"result", "put", "key", "call"} {
		_, err := c.Execute(ctx, id, []byte(`{"v":"é"}`))
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != codes.InvalidArgument || !errors.Is(err, ledger.ErrBadValue) {
			t.Errorf("%s: got %v, want INVALID_ARGUMENT bad_value", id, err)
		}
	}
	if vs, err := c.History(ctx, "p", ledger.ScanRange{End: -1}); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("asset p has %d versions (%v), want none", len(vs), err)
	}
}

// TestDeepArgumentNamesTheLimit: an argument nested past the depth limit
// is refused saying so, however deep: past encoding/json's own limit
// (10,000) it was "not a JSON text".
func TestDeepArgumentNamesTheLimit(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, Options{AdminToken: "admin-token"})
	c := secretClient(t, srv, "cy", "admin-token")
	if err := c.RegisterContract(ctx, "echo", []byte(echoPut)); err != nil {
		t.Fatal(err)
	}
	for _, depth := range []int{65, 100, 10_001, 30_000} {
		v := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		for _, contract := range []string{"echo", "builtin.ycsb_f"} {
			arg := `{"id":"k","v":` + v + `}`
			if contract == "builtin.ycsb_f" {
				arg = `{"id":"k","payload":` + v + `}`
			}
			_, err := c.Execute(ctx, contract, []byte(arg))
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != codes.InvalidArgument || !errors.Is(err, ledger.ErrBadArgument) ||
				!strings.Contains(ce.Msg, "depth limit of 64") {
				t.Errorf("depth %d, %s: got %v, want INVALID_ARGUMENT bad_argument naming the depth limit of 64", depth, contract, err)
			}
		}
	}
	// The deepest an argument may be: its value v nested in 63 more.
	v := strings.Repeat("[", 64) + strings.Repeat("]", 64)
	if res, err := c.Execute(ctx, "echo", []byte(`{"id":"k","v":`+v+`}`)); err != nil || string(res.Result) != v {
		t.Fatalf("an argument at the depth limit: %.80s, %v", res.Result, err)
	}
}

// TestUndecodableRequestIsInvalidArgument: a request message whose string
// field is not UTF-8 (proto3 forbids it, so grpc's codec does not decode
// it) is the client's fault, INVALID_ARGUMENT, on a unary call and on the
// CallBatches stream; grpc reports it INTERNAL by itself.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	srv := startServer(t, Options{})
	conn := rawConn(t, srv)
	bad := []byte("a\xffb")
	for _, tc := range []struct {
		method string
		req    []byte
	}{
		{api.Ledger_GetAsset_FullMethodName, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad)},
		{api.Ledger_GetProof_FullMethodName, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad)},
		{api.Ledger_GetTxState_FullMethodName, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad)},
		{api.Ledger_ValidateLedger_FullMethodName, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad)},
		{api.Ledger_ExecuteContract_FullMethodName, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad)},
		{api.Ledger_RegisterContract_FullMethodName, protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), bad)},
		{api.Ledger_GetAsset_FullMethodName, []byte{0x0a, 0x05, 'a'}}, // a field cut short
	} {
		err := conn.Invoke(context.Background(), tc.method, &rawMsg{tc.req}, &rawMsg{}, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s with %q: got %v, want INVALID_ARGUMENT", tc.method, tc.req, err)
		}
	}

	// On the stream: a get_tx_state call whose nonce is not UTF-8 ends the
	// stream, since the calls of a message that does not decode cannot
	// be answered one by one.
	call := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)
	call = protowire.AppendBytes(protowire.AppendTag(call, 4, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad))
	msg := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), call)
	code, replies, err := streamRaw(context.Background(), conn, msg)
	if err != nil || code != codes.InvalidArgument || len(replies) != 0 {
		t.Fatalf("a CallBatches message that does not decode: the stream ended %v after %d replies (%v), want INVALID_ARGUMENT", code, len(replies), err)
	}
}

// TestLenientRequestThroughTheCodec pins what lenientRequest relies on:
// grpc's protobuf codec hands the bytes of a message it is given to decode
// into a lenientRequest to its Unmarshal (protobuf's support for message
// types of its older Go API), and reports no error of its own, whatever
// the bytes.
func TestLenientRequestThroughTheCodec(t *testing.T) {
	codec := encoding.GetCodecV2(grpcproto.Name)
	good, _ := proto.Marshal(&api.GetAssetRequest{Id: "a0", EndAge: -1})
	for _, tc := range []struct {
		in []byte
		ok bool
	}{{good, true}, {nil, true}, {[]byte("\x0a\x03a\xffb"), false}, {[]byte{0x0a, 0x05, 'a'}, false}, {[]byte{0xff}, false}} {
		var m api.GetAssetRequest
		r := lenientRequest{m: &m}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Clone(tc.in))}, &r); err != nil {
			t.Fatalf("%q: the codec failed: %v", tc.in, err)
		}
		switch {
		case tc.ok && (r.err != nil || !bytes.Equal(mustMarshal(t, &m), tc.in)):
			t.Errorf("%q: decoded to %v, %v", tc.in, &m, r.err)
		case !tc.ok && status.Code(r.err) != codes.InvalidArgument:
			t.Errorf("%q: %v, want INVALID_ARGUMENT", tc.in, r.err)
		}
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startServer starts a server on the embedded engine in a temporary
// directory, stopped when the test ends.
func startServer(tb testing.TB, o Options) *Running {
	tb.Helper()
	o.DataDir, o.Listen, o.Logger = tb.TempDir(), "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := Start(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Stop(time.Second) })
	return r
}

// rawConn dials srv for calls that send and receive messages as bytes
// (rawCodec), and closes the connection when the test ends.
func rawConn(tb testing.TB, srv *Running) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// rawMsg is a message as its encoded bytes.
type rawMsg struct{ b []byte }

// rawCodec sends a *rawMsg's bytes as they are, whatever they hold, and
// receives a message's bytes into one: a client that sends what no
// protobuf library would marshal. It is named "proto", so the server
// decodes what it sends with its protobuf codec.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// streamRaw opens a CallBatches stream on conn, sends msgs as they are,
// closes its sending side and reads the replies until the stream ends. It
// returns the status the stream ended with and the reply messages; err is
// for a failure to open or send.
func streamRaw(ctx context.Context, conn *grpc.ClientConn, msgs ...[]byte) (codes.Code, []*api.CallReplies, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := conn.NewStream(ctx, &api.Ledger_ServiceDesc.Streams[0], api.Ledger_CallBatches_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return 0, nil, err
	}
	for _, m := range msgs {
		if err := st.SendMsg(&rawMsg{m}); err != nil && !errors.Is(err, io.EOF) {
			return 0, nil, err
		}
	}
	if err := st.CloseSend(); err != nil {
		return 0, nil, err
	}
	var out []*api.CallReplies
	for {
		var m rawMsg
		err := st.RecvMsg(&m)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return codes.OK, out, nil
			}
			return status.Code(err), out, nil
		}
		var r api.CallReplies
		if err := proto.Unmarshal(m.b, &r); err != nil {
			return 0, out, err
		}
		out = append(out, &r)
	}
}
