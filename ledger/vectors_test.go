package ledger_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiroku-db/kiroku/auth"
	"github.com/kiroku-db/kiroku/ledger"
)

// The byte strings the ledger hashes and signs are frozen: a proof signed
// today must verify, byte for byte, in years, by another organisation's
// code. testdata/vectors/ledger.json holds, for each kind, the fields, the
// exact encoding, its SHA-256, an HMAC-SHA256 signature under a fixed
// secret and an ECDSA P-256 signature under testdata/vectors/ecdsa.pem (a
// key for these tests only). TestVectors recomputes every encoding and
// checks every signature, and checks that damaged inputs are refused: a
// flipped byte, and each encoding presented under another kind's domain
// tag.
//
// The file is written only by KIROKU_WRITE_VECTORS=1, which is for a new
// version of a format (a new domain tag, added beside the old), never for
// making this test pass after a change to an existing encoding.

const vectorsDir = "../testdata/vectors"

// hmacSecret is the vectors' HMAC key: bytes 0x00..0x1f.
var hmacSecret = func() []byte {
	b := make([]byte, 32)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

type vector struct {
	Kind     string          `json:"kind"`
	Fields   json.RawMessage `json:"fields"`
	Encoding string          `json:"encoding"` // hex
	SHA256   string          `json:"sha256"`   // hex, of the encoding
	HMAC     string          `json:"hmac_sha256"`
	ECDSA    string          `json:"ecdsa_p256_der"`
}

type vectorFile struct {
	Note          string   `json:"note"`
	HMACSecret    string   `json:"hmac_secret"`
	HMACKeyID     string   `json:"hmac_key_fingerprint"`
	ECDSAKeyID    string   `json:"ecdsa_key_fingerprint"`
	Vectors       []vector `json:"vectors"`
	DomainTags    []string `json:"domain_tags"`
	VersionHashes []string `json:"chain"` // hashes of the chained versions, in order
}

// vectorInputs are the values encoded: every kind, with empty and
// non-ASCII strings, negative ages (an absent read), and a two-version
// chain.
func vectorInputs() (reqs []ledger.Request, regs []ledger.ContractRegistration, versions []ledger.Version, proofs []ledger.Proof, receipts []ledger.Receipt) {
	reqs = []ledger.Request{
		{Nonce: "3f1c2b7e-9a4d-4e0b-8c55-0d6f2a1b9e77", ContractID: "transfer", Argument: []byte(`{"amount":10,"from":"acct-1","to":"acct-2"}`),
			Entity: "alice", KeyVersion: 1},
		{Nonce: "n", ContractID: "c", Argument: []byte(` { "b" : [1, 2.5e3], "a":"é" } `), Entity: "bob", KeyVersion: 4294967295},
	}
	regs = []ledger.ContractRegistration{
		{ID: "transfer", Source: []byte("def invoke(ledger, args):\n    return {\"ok\": True}\n"), Entity: "alice", KeyVersion: 1},
	}
	v0 := ledger.Version{ID: "acct-1", Age: 0, Input: map[string]int64{"acct-2": -1}, Output: []byte(`{"balance":100}`),
		Contract: "open", Argument: []byte(`{"id":"acct-1"}`), Nonce: "n0", Entity: "alice", KeyVersion: 1, Signature: bytes.Repeat([]byte{0xaa}, 32)}
	v0.Hash = v0.ComputeHash()
	v1 := ledger.Version{ID: "acct-1", Age: 1, Input: map[string]int64{"acct-2": 7, "acct-0": 3, "ä": 0}, Output: []byte(`{"balance":90}`),
		Contract: "transfer", Argument: reqs[0].Argument, Nonce: reqs[0].Nonce, Entity: "alice", KeyVersion: 1,
		Signature: bytes.Repeat([]byte{0xbb}, 71), PrevHash: v0.Hash}
	v1.Hash = v1.ComputeHash()
	versions = []ledger.Version{v0, v1}
	proofs = []ledger.Proof{v0.Proof(), v1.Proof()}
	receipts = []ledger.Receipt{
		{Nonce: reqs[0].Nonce, Contract: "transfer", Input: map[string]int64{"acct-1": 0, "acct-2": 7},
			Writes: map[string]int64{"acct-1": 1, "acct-2": 8}, Result: []byte(`{"ok":true}`)},
		{Nonce: "read-only", Contract: "get", Input: map[string]int64{}, Writes: map[string]int64{}, Result: []byte(`null`)},
	}
	return
}

// encoded pairs each value with its kind and encoding.
type encoded struct {
	kind   string
	fields any
	enc    []byte
}

func allEncoded() []encoded {
	reqs, regs, versions, proofs, receipts := vectorInputs()
	var out []encoded
	for i := range reqs {
		out = append(out, encoded{"request", reqs[i], reqs[i].SigningBytes()})
	}
	for i := range regs {
		out = append(out, encoded{"contract", regs[i], regs[i].SigningBytes()})
	}
	for i := range versions {
		out = append(out, encoded{"asset-version", versions[i], versions[i].HashBytes()})
	}
	for i := range proofs {
		out = append(out, encoded{"proof", proofs[i], proofs[i].SigningBytes()})
	}
	for i := range receipts {
		out = append(out, encoded{"receipt", receipts[i], receipts[i].SigningBytes()})
	}
	return out
}

var domainTags = []string{"kiroku/request/v1", "kiroku/contract/v1", "kiroku/asset-version/v1", "kiroku/proof/v1", "kiroku/receipt/v1"}

func loadVectorKeys(t *testing.T) (hs auth.Signer, hv auth.Verifier, ev auth.Verifier, ecdsaFP string, es auth.Signer) {
	t.Helper()
	var err error
	if hs, err = auth.NewHMACSigner(hmacSecret); err != nil {
		t.Fatal(err)
	}
	if hv, err = auth.NewHMACVerifier(hmacSecret); err != nil {
		t.Fatal(err)
	}
	pemBytes, err := os.ReadFile(filepath.Join(vectorsDir, "ecdsa.pem"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := auth.ParsePrivateKeyPEM(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	if es, err = auth.NewECDSASigner(key); err != nil {
		t.Fatal(err)
	}
	if ev, err = auth.NewECDSAVerifier(&key.PublicKey); err != nil {
		t.Fatal(err)
	}
	return hs, hv, ev, auth.Fingerprint(&key.PublicKey), es
}

func TestVectors(t *testing.T) {
	hs, hv, ev, ecdsaFP, es := loadVectorKeys(t)
	path := filepath.Join(vectorsDir, "ledger.json")
	if os.Getenv("KIROKU_WRITE_VECTORS") == "1" {
		writeVectors(t, path, hs, es, ecdsaFP)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vf vectorFile
	if err := json.Unmarshal(raw, &vf); err != nil {
		t.Fatal(err)
	}
	if vf.HMACSecret != hex.EncodeToString(hmacSecret) || vf.HMACKeyID != auth.HMACKeyFingerprint(hmacSecret) || vf.ECDSAKeyID != ecdsaFP {
		t.Fatalf("the vectors' keys changed: hmac %s (%s), ecdsa %s", vf.HMACSecret, vf.HMACKeyID, vf.ECDSAKeyID)
	}
	now := allEncoded()
	if len(now) != len(vf.Vectors) {
		t.Fatalf("%d vectors on file, %d encodings now", len(vf.Vectors), len(now))
	}
	for i, v := range vf.Vectors {
		// The fields on file document the inputs for other implementations;
		// the inputs themselves are vectorInputs, which must not change.
		e := now[i]
		if v.Kind != e.kind {
			t.Fatalf("vector %d: kind %s on file, %s now", i, v.Kind, e.kind)
		}
		want, err := hex.DecodeString(v.Encoding)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want, e.enc) {
			t.Errorf("vector %d (%s): the encoding changed\n was %x\n now %x", i, v.Kind, want, e.enc)
			continue
		}
		sum := sha256.Sum256(e.enc)
		if hex.EncodeToString(sum[:]) != v.SHA256 {
			t.Errorf("vector %d (%s): SHA-256 %x, file says %s", i, v.Kind, sum, v.SHA256)
		}
		hmacSig, _ := hex.DecodeString(v.HMAC)
		ecdsaSig, _ := hex.DecodeString(v.ECDSA)
		if err := hv.Verify(e.enc, hmacSig); err != nil {
			t.Errorf("vector %d (%s): the HMAC signature on file does not verify: %v", i, v.Kind, err)
		}
		if err := ev.Verify(e.enc, ecdsaSig); err != nil {
			t.Errorf("vector %d (%s): the ECDSA signature on file does not verify: %v", i, v.Kind, err)
		}
		// Invalid vectors: every single flipped byte is refused by both
		// schemes, and the encoding under another kind's tag is too.
		for j := range e.enc {
			bad := bytes.Clone(e.enc)
			bad[j] ^= 0x01
			if hv.Verify(bad, hmacSig) == nil || ev.Verify(bad, ecdsaSig) == nil {
				t.Fatalf("vector %d (%s): a signature verifies with byte %d flipped", i, v.Kind, j)
			}
		}
		for _, tag := range domainTags {
			retagged := retag(t, e.enc, tag)
			if bytes.Equal(retagged, e.enc) {
				continue
			}
			if hv.Verify(retagged, hmacSig) == nil || ev.Verify(retagged, ecdsaSig) == nil {
				t.Fatalf("vector %d (%s): its signature verifies under the tag %q", i, v.Kind, tag)
			}
		}
	}
	// The chain: each version's hash is the SHA-256 of its encoding, and
	// the next version's prev_hash.
	_, _, versions, _, _ := vectorInputs()
	for i, ver := range versions {
		if hex.EncodeToString(ver.Hash) != vf.VersionHashes[i] {
			t.Errorf("version %d hash %x, file says %s", i, ver.Hash, vf.VersionHashes[i])
		}
		if i > 0 && !bytes.Equal(ver.PrevHash, versions[i-1].Hash) {
			t.Errorf("version %d does not chain to %d", i, i-1)
		}
	}
	if !equalStrings(vf.DomainTags, domainTags) {
		t.Errorf("domain tags on file %v, now %v", vf.DomainTags, domainTags)
	}
}

// retag replaces the domain tag that starts enc (a 4-byte length, then
// the tag) by tag.
func retag(t *testing.T, enc []byte, tag string) []byte {
	t.Helper()
	n := int(enc[0])<<24 | int(enc[1])<<16 | int(enc[2])<<8 | int(enc[3])
	out := []byte{byte(len(tag) >> 24), byte(len(tag) >> 16), byte(len(tag) >> 8), byte(len(tag))}
	out = append(out, tag...)
	return append(out, enc[4+n:]...)
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func writeVectors(t *testing.T, path string, hs, es auth.Signer, ecdsaFP string) {
	vf := vectorFile{
		Note: "Frozen encodings of what kiroku hashes and signs (ledger/FORMAT.md), with signatures under the HMAC secret " +
			"below and the test-only ECDSA key in ecdsa.pem. An implementation that reproduces these bytes and verifies " +
			"these signatures reads kiroku's proofs. Never edit; a new format version gets a new domain tag and new vectors.",
		HMACSecret: hex.EncodeToString(hmacSecret), HMACKeyID: auth.HMACKeyFingerprint(hmacSecret), ECDSAKeyID: ecdsaFP,
		DomainTags: domainTags}
	for _, e := range allEncoded() {
		fields, _ := json.Marshal(e.fields)
		hsig, err := hs.Sign(e.enc)
		if err != nil {
			t.Fatal(err)
		}
		esig, err := es.Sign(e.enc)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(e.enc)
		vf.Vectors = append(vf.Vectors, vector{Kind: e.kind, Fields: fields, Encoding: hex.EncodeToString(e.enc),
			SHA256: hex.EncodeToString(sum[:]), HMAC: hex.EncodeToString(hsig), ECDSA: hex.EncodeToString(esig)})
	}
	_, _, versions, _, _ := vectorInputs()
	for _, v := range versions {
		vf.VersionHashes = append(vf.VersionHashes, hex.EncodeToString(v.Hash))
	}
	out, err := json.MarshalIndent(vf, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}
