package validator

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/kiroku-db/kiroku/proof"
)

// TestOutcomeJSONMatchesEncodingJSON: the hand-written encoders write the
// bytes json.Marshal writes, for strings that need escaping (HTML
// characters, control characters, quotes, invalid UTF-8, U+2028) and for
// nil and empty maps and byte slices.
func TestOutcomeJSONMatchesEncodingJSON(t *testing.T) {
	pieces := []string{"a", "user0042", "Z9", "<", ">", "&", `"`, `\`, "\n", "\x00", "\x7f", "é", "\u2028", "\xff", "💡", " ", "-_.:"}
	rng := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		s := ""
		for range rng.IntN(5) {
			s += pieces[rng.IntN(len(pieces))]
		}
		return s
	}
	ages := func() map[string]int64 {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return map[string]int64{}
		}
		m := map[string]int64{}
		for range 1 + rng.IntN(6) {
			m[str()] = rng.Int64N(1<<40) - 1<<20
		}
		return m
	}
	bytes := func() []byte {
		if rng.IntN(4) == 0 {
			return nil
		}
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for range 2000 {
		ps := make([]proof.Proof, rng.IntN(4))
		want := make([]proofJSON, len(ps))
		for i := range ps {
			ps[i] = proof.Proof{ID: str(), Age: rng.Int64N(1 << 50), Nonce: str(), Input: ages(), Hash: bytes(), PrevHash: bytes(), Signature: bytes()}
			p := ps[i]
			want[i] = proofJSON{ID: p.ID, Age: p.Age, Nonce: p.Nonce, Input: p.Input, Hash: p.Hash, PrevHash: p.PrevHash, Signature: p.Signature}
		}
		w, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendProofs(nil, ps); string(got) != string(w) {
			t.Fatalf("proofs:\n got %s\nwant %s", got, w)
		}
		m := ages()
		if w, _ := json.Marshal(m); string(appendIDAges(nil, m)) != string(w) {
			t.Fatalf("map %v:\n got %s\nwant %s", m, appendIDAges(nil, m), w)
		}
	}
}
