package auditorsrv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auditor/auditorsrv"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/server"
	"github.com/kiroku-db/kiroku/wire"
)

const (
	ledgerToken  = "ledger-admin-token-0123"
	auditorToken = "auditor-admin-token-0123"
	transfer     = `
def invoke(ledger, args):
    a = ledger.get(args["from"])
    b = ledger.get(args["to"])
    av = 100 if a == None else a["value"]
    bv = 100 if b == None else b["value"]
    ledger.put(args["from"], av - args["n"])
    ledger.put(args["to"], bv + args["n"])
    return {"from": av - args["n"], "to": bv + args["n"]}
`
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// domains is a ledger server started with an Auditor's key and that
// Auditor's server, each on its own engine and key, on loopback.
type domains struct {
	ledger    *server.Running
	ledgerDir string
	aud       *auditorsrv.Running
	audKey    string // the Auditor's fingerprint
	audPEM    string
}

func startDomains(t *testing.T, lease time.Duration) *domains {
	t.Helper()
	ctx := context.Background()
	d := &domains{ledgerDir: t.TempDir()}
	audDir := t.TempDir()
	pub, fp, err := auditorsrv.InitKey(audDir)
	if err != nil {
		t.Fatal(err)
	}
	d.audKey, d.audPEM = fp, string(pub)
	o := server.Options{DataDir: d.ledgerDir, Listen: "127.0.0.1:0", AdminToken: ledgerToken, AuditorKeyPEM: pub, Logger: quiet}
	o.Engine.EpochInterval = 5 * time.Millisecond
	if d.ledger, err = server.Start(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.ledger.Stop(time.Second) })
	ao := auditorsrv.Options{DataDir: audDir, Listen: "127.0.0.1:0", AdminToken: auditorToken, Ledger: d.ledger.Addr(),
		LedgerKey: d.ledger.Key.Fingerprint, Lease: lease, RecoverEvery: 20 * time.Millisecond, Logger: quiet}
	ao.Storage.Engine.EpochInterval = 5 * time.Millisecond
	if d.aud, err = auditorsrv.Start(ctx, ao); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.aud.Stop(time.Second) })
	return d
}

// client dials both domains in Auditor mode as entity, pinning the
// Auditor's key by its fingerprint.
func (d *domains) client(t *testing.T, entity string, opts ...grpc.DialOption) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Config{Server: d.ledger.Addr(), Entity: entity, Secret: bytes.Repeat([]byte(entity[:1]), 32),
		AdminToken: ledgerToken, AuditorAdminToken: auditorToken, Mode: client.ModeAuditor, Auditor: d.aud.Addr(), AuditorKey: d.audKey,
		DialOptions: opts, UnaryCalls: len(opts) > 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// enrol registers c's secret and the transfer contract in both domains.
func enrol(t *testing.T, c *client.Client) {
	t.Helper()
	ctx := context.Background()
	if err := c.RegisterSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterContract(ctx, "transfer", []byte(transfer)); err != nil {
		t.Fatal(err)
	}
}

func transferArg(from, to string, n int) []byte {
	return []byte(fmt.Sprintf(`{"from":%q,"n":%d,"to":%q}`, from, n, to))
}

// TestThreePhases: through the SDK in Auditor mode, executions go
// Order → ledger → Validate over the network, concurrently; each result
// comes with the Auditor's approval of its receipt; the Auditor's replica
// ends with the ledger's history; and a client that skips the Auditor is
// refused by the ledger.
func TestThreePhases(t *testing.T) {
	ctx := context.Background()
	d := startDomains(t, 10*time.Second)
	c := d.client(t, "alice")
	enrol(t, c)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				req, err := c.NewRequest("transfer", transferArg(fmt.Sprintf("a%d", (w+i)%3), fmt.Sprintf("a%d", (w+i+1)%3), 1))
				if err != nil {
					t.Error(err)
					return
				}
				res, ap, err := c.ExecuteAudited(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(ap.Digest, proof.ReceiptDigest(&res.Receipt)) || d.ledger.Ledger.VerifyReceipt(&res.Receipt) != nil {
					t.Errorf("approval %+v does not name a receipt of the ledger's", ap)
				}
			}
		}()
	}
	wg.Wait()
	if _, err := c.Execute(ctx, "transfer", transferArg("a0", "a1", 5)); err != nil {
		t.Fatal(err)
	}
	total := 0
	for i := range 3 {
		id := fmt.Sprintf("a%d", i)
		want, err := d.ledger.Ledger.Latest(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.aud.Replica.Latest(ctx, id)
		if err != nil || got != want {
			t.Fatalf("replica %s at %d (%v), ledger at %d", id, got, err, want)
		}
		v, err := d.aud.Replica.Version(ctx, id, got)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(string(v.Output), `{"value":`), "}"))
		total += n
	}
	if total != 300 {
		t.Fatalf("the replica's balances add up to %d, want 300", total)
	}
	if d.aud.Auditor.Pending() != 0 {
		t.Fatalf("%d orders left", d.aud.Auditor.Pending())
	}

	direct, err := client.Dial(client.Config{Server: d.ledger.Addr(), Entity: "alice", Secret: bytes.Repeat([]byte("a"), 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Execute(ctx, "transfer", transferArg("a0", "a1", 1)); !errors.Is(err, proof.ErrOrderToken) {
		t.Fatalf("a request without the Auditor's token: %v, want order_token", err)
	}
	// An identity enrolled with the ledger alone cannot order.
	if _, err := direct.Order(ctx, &proof.Request{}); err == nil {
		t.Fatal("Order on a client in direct mode")
	}

	// Reflection lists the Auditor's service.
	conn, err := grpc.NewClient(d.aud.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
		found = found || s.Name == "kiroku.v1.Auditor"
	}
	if !found {
		t.Fatalf("reflection does not list kiroku.v1.Auditor: %v", resp)
	}
}

// ledgerSigner is the ledger's own proof key, read from its data
// directory: what a Byzantine ledger signs its altered replies with.
func (d *domains) ledgerSigner(t *testing.T) auth.Signer {
	t.Helper()
	k, err := auth.LoadOrCreateECDSAKey(filepath.Join(d.ledgerDir, "keys", "ledger-ecdsa.pem"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := auth.NewECDSASigner(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// resign signs reply's proofs and receipt with s, as a Byzantine ledger
// signs whatever it returns.
func resign(t *testing.T, s auth.Signer, reply *api.ExecuteReply) {
	t.Helper()
	res, err := wire.ResultFromAPI(reply)
	if err != nil {
		t.Fatal(err)
	}
	for i := range res.Proofs {
		res.Proofs[i].Signature, _ = proof.Sign(s, &res.Proofs[i])
	}
	res.Signature, _ = proof.Sign(s, &res.Receipt)
	*reply = *wire.ResultToAPI(res)
}

// TestByzantineLedger: a reply the ledger signed and the Auditor's run
// disagrees with is a Byzantine fault — DATA_LOSS, kind byzantine_fault
// and the asset, age and check in trailers on the wire; a
// *proof.ByzantineFault from the SDK, whose Execute returns no result. A
// reply altered without the ledger's key proves nothing: it is refused
// as bad_signature, and the order stands until recovery settles it from
// the ledger's own record.
func TestByzantineLedger(t *testing.T) {
	ctx := context.Background()
	d := startDomains(t, 300*time.Millisecond)
	ledgerKey := d.ledgerSigner(t)
	c := d.client(t, "bob")
	enrol(t, c)

	// Through the API: Validate with the ledger's reply altered and
	// re-signed.
	req, _ := c.NewRequest("transfer", transferArg("x", "y", 1))
	tok, err := c.Order(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ExecuteOrdered(ctx, req, tok)
	if err != nil {
		t.Fatal(err)
	}
	reply := wire.ResultToAPI(res)
	reply.Proofs[0].Hash = bytes.Repeat([]byte{1}, 32)
	resign(t, ledgerKey, reply)
	conn, err := grpc.NewClient(d.aud.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var trailer metadata.MD
	_, err = api.NewAuditorClient(conn).Validate(ctx, &api.ValidateRequest{Request: wire.RequestToAPI(req), Reply: reply}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.DataLoss || first(trailer, wire.ErrorKindKey) != "byzantine_fault" ||
		first(trailer, wire.FaultAssetKey) != "x" || first(trailer, wire.FaultAgeKey) != "0" || first(trailer, wire.FaultCheckKey) != "hash" {
		t.Fatalf("validation of an altered, signed reply: %v, trailer %v", err, trailer)
	}

	// Through the SDK: a ledger that returns another result, signed.
	tamper := func(resignIt bool) grpc.DialOption {
		return grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if err := invoker(ctx, method, req, reply, cc, opts...); err != nil || method != api.Ledger_ExecuteContract_FullMethodName {
				return err
			}
			r := reply.(*api.ExecuteReply)
			r.Result = []byte(`{"from":1000,"to":1000}`)
			if resignIt {
				resign(t, ledgerKey, r)
			}
			return nil
		})
	}
	byz := d.client(t, "bob", tamper(true))
	res, err = byz.Execute(ctx, "transfer", transferArg("p", "q", 1))
	var f *proof.ByzantineFault
	var ce *client.Error
	if res != nil || !errors.As(err, &f) || !errors.Is(err, proof.ErrByzantineFault) || !errors.As(err, &ce) ||
		ce.Code != codes.DataLoss || f.Check != "result" || f.Nonce == "" || !strings.Contains(f.Detail, "1000") {
		t.Fatalf("the SDK over a Byzantine ledger: %v, %+v (%v)", res, f, err)
	}

	// Altered without the ledger's key: refused, not a fault; recovery
	// settles the order from what the ledger recorded.
	liar := d.client(t, "bob", tamper(false))
	req, _ = liar.NewRequest("transfer", transferArg("r", "s", 1))
	if _, err := liar.ExecuteRequest(ctx, req); errors.Is(err, proof.ErrByzantineFault) || !errors.Is(err, proof.ErrBadSignature) {
		t.Fatalf("an unsigned alteration: %v, want bad_signature and no fault", err)
	}
	waitSettled(t, d)
	if age, err := d.aud.Replica.Latest(ctx, "s"); err != nil || age != 0 {
		t.Fatalf("recovery did not validate the transaction whose reply was altered: s@%d (%v)", age, err)
	}
	st, err := c.TxState(ctx, req.Nonce) // the ledger's own record, through an honest client
	if err != nil {
		t.Fatal(err)
	}
	if res, err = c.CommittedResult(ctx, st); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Validate(ctx, req, res); err != nil {
		t.Fatalf("the real reply brought after recovery: %v", err)
	}
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// waitSettled waits until the Auditor has no order left.
func waitSettled(t *testing.T, d *domains) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); d.aud.Auditor.Pending() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d orders still pending", d.aud.Auditor.Pending())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRecoveryOverTheNetwork: a client that orders and vanishes holds its
// assets until the lease runs out; the Auditor's recovery then has the
// ledger abort the nonce (over the network, signed with its key), so the
// request can never run, and releases the locks. A client that vanishes
// after the ledger committed has its transaction validated from the
// ledger's record.
func TestRecoveryOverTheNetwork(t *testing.T) {
	ctx := context.Background()
	d := startDomains(t, 300*time.Millisecond)
	c := d.client(t, "carol")
	enrol(t, c)
	lost, _ := c.NewRequest("transfer", transferArg("x", "y", 1))
	lostTok, err := c.Order(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}
	committed, _ := c.NewRequest("transfer", transferArg("p", "q", 1))
	tok, err := c.Order(ctx, committed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecuteOrdered(ctx, committed, tok); err != nil {
		t.Fatal(err)
	}
	// Conflicting with the vanished client's order, it waits for the
	// lease, then runs.
	start := time.Now()
	res, err := c.Execute(ctx, "transfer", transferArg("y", "q", 1))
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Fatalf("a request conflicting with a held order ran after %v, within its lease", time.Since(start))
	}
	// It saw the committed transfer to q, and none to y.
	if string(res.Result) != `{"from":99,"to":102}` {
		t.Fatalf("after recovery: %s", res.Result)
	}
	waitSettled(t, d)
	st, err := c.TxState(ctx, lost.Nonce)
	if err != nil || st.Status != proof.TxAborted || st.Kind != "aborted_by_auditor" {
		t.Fatalf("the vanished request's state on the ledger: %+v, %v", st, err)
	}
	if _, err := c.ExecuteOrdered(ctx, lost, lostTok); !errors.Is(err, proof.ErrOrderToken) && !errors.Is(err, proof.ErrNonceReused) {
		t.Fatalf("the vanished request ran after recovery: %v", err)
	}
	if age, _ := d.aud.Replica.Latest(ctx, "p"); age != 0 {
		t.Fatalf("the committed request was not validated into the replica: p@%d", age)
	}
}

// TestKeysArePinned: an Auditor refuses to start against a ledger that
// does not serve the pinned key, and a client refuses an Auditor whose
// key is not the pinned one; a client that pins the Auditor's PEM works.
func TestKeysArePinned(t *testing.T) {
	ctx := context.Background()
	d := startDomains(t, 10*time.Second)
	_, err := auditorsrv.Start(ctx, auditorsrv.Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Ledger: d.ledger.Addr(),
		LedgerKey: strings.Repeat("ab", 32), Logger: quiet})
	if !errors.Is(err, auditorsrv.ErrLedgerKey) {
		t.Fatalf("an Auditor pinning another ledger key: %v", err)
	}
	for _, key := range []string{strings.Repeat("cd", 32), "not a key"} {
		c, err := client.Dial(client.Config{Server: d.ledger.Addr(), Entity: "dan", Secret: make([]byte, 32), AdminToken: ledgerToken,
			Mode: client.ModeAuditor, Auditor: d.aud.Addr(), AuditorKey: key})
		if err != nil {
			continue // refused at Dial: not a key at all
		}
		defer c.Close()
		if _, err := c.Execute(ctx, "transfer", transferArg("x", "y", 1)); !errors.Is(err, client.ErrAuditorKey) {
			t.Fatalf("a client pinning %s: %v", key, err)
		}
	}
	pemClient, err := client.Dial(client.Config{Server: d.ledger.Addr(), Entity: "erin", Secret: bytes.Repeat([]byte("e"), 32),
		AdminToken: ledgerToken, AuditorAdminToken: auditorToken, Mode: client.ModeAuditor, Auditor: d.aud.Addr(), AuditorKey: d.audPEM})
	if err != nil {
		t.Fatal(err)
	}
	defer pemClient.Close()
	enrol(t, pemClient)
	if _, err := pemClient.Execute(ctx, "transfer", transferArg("x", "y", 1)); err != nil {
		t.Fatal(err)
	}
	// An Auditor's Validate without a reply is a bad request, and changes
	// nothing.
	conn, err := grpc.NewClient(d.aud.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var trailer metadata.MD
	_, err = api.NewAuditorClient(conn).Validate(ctx, &api.ValidateRequest{Request: &api.ExecuteRequest{Nonce: "n"}}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.InvalidArgument || first(trailer, wire.ErrorKindKey) != "bad_request" {
		t.Fatalf("a validation without a reply: %v %v", err, trailer)
	}
	_, err = api.NewAuditorClient(conn).Validate(ctx, &api.ValidateRequest{Request: &api.ExecuteRequest{Nonce: "n"}, Reply: &api.ExecuteReply{Nonce: "n"}},
		grpc.Trailer(&trailer))
	if status.Code(err) != codes.FailedPrecondition || first(trailer, wire.ErrorKindKey) != "not_ordered" {
		t.Fatalf("a validation of a request never ordered: %v %v", err, trailer)
	}
}
