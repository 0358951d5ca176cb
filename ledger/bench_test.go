package ledger

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/kiroku-db/kiroku/auth"
)

// BenchmarkExecuteYCSBF executes builtin.ycsb_f on the embedded engine
// with HMAC requests and proofs, one caller at a time, without the
// network: what the server does per request of `kiroku bench ledger
// --workload ycsb-f --auth hmac`. Its allocations are the ones to profile
// (-benchmem -memprofile); each iteration waits for its epoch to become
// durable, so ns/op is mostly that wait.
func BenchmarkExecuteYCSBF(b *testing.B) {
	ctx := context.Background()
	secret := bytes.Repeat([]byte("k"), 32)
	signer, _ := auth.NewHMACSigner(secret)
	verifier, _ := auth.NewHMACVerifier(secret)
	boxKey := make([]byte, 32)
	rand.Read(boxKey)
	box, _ := auth.NewSecretBox(boxKey)
	l, err := Open(ctx, Config{Backend: openEngine(b), Namespace: "bench", Signer: signer, ProofVerifier: verifier, Secrets: box})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.RegisterSecret(ctx, "alice", 1, secret); err != nil {
		b.Fatal(err)
	}
	const assets = 1000
	payload := bytes.Repeat([]byte("p"), 100)
	nonce := 0
	exec := func(contract, args string) {
		nonce++
		r := &Request{Nonce: fmt.Sprintf("n-%d", nonce), ContractID: contract, Argument: []byte(args), Entity: "alice", KeyVersion: 1}
		r.Signature, _ = signer.Sign(r.SigningBytes())
		if _, err := l.Execute(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	exec(BuiltinPrefix+"bulk_load", fmt.Sprintf(`{"prefix":"y","first":0,"count":%d,"payload":%q}`, assets, payload))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		exec(BuiltinPrefix+"ycsb_f", fmt.Sprintf(`{"id":"y%d","payload":%q}`, i%assets, payload))
	}
}
