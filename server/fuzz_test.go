package server

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kiroku-db/kiroku/api"
	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/engine"
	"github.com/kiroku-db/kiroku/ledger"
	"github.com/kiroku-db/kiroku/wire"
)

// FuzzExecuteRequest feeds arbitrary bytes through what the server does
// with an ExecuteContract call: protobuf decoding, request checks,
// signature verification and execution. It must never panic, every
// rejection must carry a ledger error kind, and only a correctly signed
// request may succeed.
func FuzzExecuteRequest(f *testing.F) {
	ctx := context.Background()
	db, err := engine.Open(engine.Config{Dir: f.TempDir(), EpochInterval: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	key, _ := auth.LoadOrCreateECDSAKey(f.TempDir() + "/k.pem")
	signer, _ := auth.NewECDSASigner(key)
	verifier, _ := auth.NewECDSAVerifier(&key.PublicKey)
	box, _ := auth.NewSecretBox(bytes.Repeat([]byte{3}, 32))
	l, err := ledger.Open(ctx, ledger.Config{Backend: db, Signer: signer, ProofVerifier: verifier, Secrets: box})
	if err != nil {
		f.Fatal(err)
	}
	secret := bytes.Repeat([]byte{5}, 32)
	if err := l.RegisterSecret(ctx, "alice", 1, secret); err != nil {
		f.Fatal(err)
	}
	hs, _ := auth.NewHMACSigner(secret)
	sign := func(r *ledger.Request) []byte {
		r.Signature, _ = hs.Sign(r.SigningBytes())
		b, _ := proto.Marshal(wire.RequestToAPI(r))
		return b
	}
	f.Add(sign(&ledger.Request{Nonce: "n1", ContractID: "builtin.bulk_load", Argument: []byte(`{"prefix":"a","first":0,"count":2,"payload":"p"}`), Entity: "alice", KeyVersion: 1}))
	f.Add(sign(&ledger.Request{Nonce: "n2", ContractID: "builtin.ycsb_f", Argument: []byte(`{"id":"a0","payload":"q"}`), Entity: "alice", KeyVersion: 1}))
	f.Add(sign(&ledger.Request{Nonce: "n3", ContractID: "builtin.ycsb_c", Argument: []byte(`{"ids":["a0","a1"]}`), Entity: "alice", KeyVersion: 1}))
	f.Add(sign(&ledger.Request{Nonce: "n4", ContractID: "builtin.ycsb_f", Argument: []byte(`{"id":`), Entity: "alice", KeyVersion: 1}))
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var msg api.ExecuteRequest
		if err := proto.Unmarshal(data, &msg); err != nil {
			return
		}
		req := wire.RequestFromAPI(&msg)
		_, err := l.Execute(ctx, req)
		if err == nil {
			good, _ := hs.Sign(req.SigningBytes())
			if req.Entity != "alice" || req.KeyVersion != 1 || !bytes.Equal(good, req.Signature) {
				t.Fatalf("a request not signed by alice was executed: %+v", req)
			}
			return
		}
		if ledger.Kind(err) == "" {
			t.Fatalf("rejection without an error kind: %v", err)
		}
	})
}
