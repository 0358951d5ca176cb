package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// testSecret returns a deterministic HMAC secret of length n.
func testSecret(n int, seed byte) []byte {
	s := make([]byte, n)
	for i := range s {
		s[i] = seed + byte(i)
	}
	return s
}

func mustGenerateP256(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestScheme(t *testing.T) {
	tests := []struct {
		s    Scheme
		name string
	}{
		{SchemeHMAC, "hmac"},
		{SchemeECDSA, "ecdsa"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.name {
			t.Errorf("Scheme(%d).String() = %q, want %q", tt.s, got, tt.name)
		}
		got, err := ParseScheme(tt.name)
		if err != nil || got != tt.s {
			t.Errorf("ParseScheme(%q) = %v, %v; want %v, nil", tt.name, got, err, tt.s)
		}
	}
	if got := Scheme(9).String(); got != "Scheme(9)" {
		t.Errorf("Scheme(9).String() = %q", got)
	}
	for _, bad := range []string{"", "HMAC", "rsa", "ecdsa ", "Scheme(1)"} {
		if _, err := ParseScheme(bad); !errors.Is(err, ErrUnknownScheme) {
			t.Errorf("ParseScheme(%q) error = %v, want ErrUnknownScheme", bad, err)
		}
	}
}

func TestHMACSecretLength(t *testing.T) {
	tests := []struct {
		n  int
		ok bool
	}{
		{0, false},
		{MinSecretLen - 1, false},
		{MinSecretLen, true},
		{64, true},
		{MaxSecretLen, true},
		{MaxSecretLen + 1, false},
	}
	for _, tt := range tests {
		secret := testSecret(tt.n, 1)
		_, errS := NewHMACSigner(secret)
		_, errV := NewHMACVerifier(secret)
		for _, err := range []error{errS, errV} {
			if tt.ok && err != nil {
				t.Errorf("len %d: unexpected error %v", tt.n, err)
			}
			if !tt.ok && !errors.Is(err, ErrBadSecret) {
				t.Errorf("len %d: error = %v, want ErrBadSecret", tt.n, err)
			}
		}
	}
}

func TestHMACCopiesSecret(t *testing.T) {
	secret := testSecret(32, 7)
	s, err := NewHMACSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewHMACVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	clear(secret)
	sig, err := s.Sign([]byte("msg"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify([]byte("msg"), sig); err != nil {
		t.Fatalf("verify after wiping caller's secret: %v", err)
	}
}

// TestHMACKnownAnswer checks RFC 4231 test case 6 through the pooled
// hash states: first use, reuse, and concurrent use give the same MAC.
func TestHMACKnownAnswer(t *testing.T) {
	key := bytes.Repeat([]byte{0xaa}, 131)
	msg := []byte("Test Using Larger Than Block-Size Key - Hash Key First")
	const want = "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
	s, err := NewHMACSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 100 {
				sig, err := s.Sign(msg)
				if err == nil && hex.EncodeToString(sig) != want {
					err = errors.New("MAC " + hex.EncodeToString(sig))
				}
				if err == nil {
					_, err = s.Sign([]byte("other"))
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// keyPair is a signer with its matching verifier and a verifier for an
// unrelated key of the same scheme.
type keyPair struct {
	name   string
	signer Signer
	good   Verifier
	other  Verifier
}

func testKeyPairs(t *testing.T) []keyPair {
	t.Helper()
	hs, err := NewHMACSigner(testSecret(32, 1))
	if err != nil {
		t.Fatal(err)
	}
	hv, err := NewHMACVerifier(testSecret(32, 1))
	if err != nil {
		t.Fatal(err)
	}
	hOther, err := NewHMACVerifier(testSecret(32, 2))
	if err != nil {
		t.Fatal(err)
	}
	key := mustGenerateP256(t)
	es, err := NewECDSASigner(key)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := NewECDSAVerifier(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	eOther, err := NewECDSAVerifier(&mustGenerateP256(t).PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return []keyPair{
		{"hmac", hs, hv, hOther},
		{"ecdsa", es, ev, eOther},
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x01
	return c
}

func TestSignVerify(t *testing.T) {
	msg := []byte("append key=alpha value=1 seq=42")
	for _, kp := range testKeyPairs(t) {
		t.Run(kp.name, func(t *testing.T) {
			if kp.signer.Scheme() != kp.good.Scheme() {
				t.Fatalf("signer scheme %v != verifier scheme %v", kp.signer.Scheme(), kp.good.Scheme())
			}
			sig, err := kp.signer.Sign(msg)
			if err != nil {
				t.Fatal(err)
			}
			if err := kp.good.Verify(msg, sig); err != nil {
				t.Fatalf("valid signature rejected: %v", err)
			}
			// The empty message is a message like any other.
			esig, err := kp.signer.Sign(nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := kp.good.Verify([]byte{}, esig); err != nil {
				t.Fatalf("valid signature of empty message rejected: %v", err)
			}

			bad := []struct {
				name     string
				msg, sig []byte
				v        Verifier
			}{
				{"flipped first message byte", flip(msg, 0), sig, kp.good},
				{"flipped last message byte", flip(msg, len(msg)-1), sig, kp.good},
				{"extended message", append(bytes.Clone(msg), 0), sig, kp.good},
				{"flipped first signature byte", msg, flip(sig, 0), kp.good},
				{"flipped middle signature byte", msg, flip(sig, len(sig)/2), kp.good},
				{"flipped last signature byte", msg, flip(sig, len(sig)-1), kp.good},
				{"truncated signature", msg, sig[:len(sig)-1], kp.good},
				{"empty signature", msg, nil, kp.good},
				{"signature with trailing byte", msg, append(bytes.Clone(sig), 0), kp.good},
				{"oversized signature", msg, bytes.Repeat([]byte{0x30}, 4096), kp.good},
				{"different key", msg, sig, kp.other},
			}
			for _, tt := range bad {
				if err := tt.v.Verify(tt.msg, tt.sig); !errors.Is(err, ErrBadSignature) {
					t.Errorf("%s: error = %v, want ErrBadSignature", tt.name, err)
				}
			}
		})
	}
}

func TestECDSAVerifiesSHA256(t *testing.T) {
	key := mustGenerateP256(t)
	v, err := NewECDSAVerifier(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("the ledger signs proofs")
	digest := sha256.Sum256(msg)
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(msg, sig); err != nil {
		t.Fatalf("signature over SHA-256(msg) rejected: %v", err)
	}
	// And the other way round: our signatures verify directly.
	s, err := NewECDSASigner(key)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := s.Sign(msg)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(&key.PublicKey, digest[:], ours) {
		t.Fatal("Sign output does not verify with ecdsa.VerifyASN1 over SHA-256(msg)")
	}
	// A signature over the raw message (no hashing) must not verify.
	raw, err := ecdsa.SignASN1(rand.Reader, key, msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(msg, raw); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("signature over unhashed message: error = %v, want ErrBadSignature", err)
	}
}

func TestECDSARejectsBadKeys(t *testing.T) {
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewECDSASigner(nil); !errors.Is(err, ErrBadKey) {
		t.Errorf("NewECDSASigner(nil) error = %v, want ErrBadKey", err)
	}
	if _, err := NewECDSASigner(p384); !errors.Is(err, ErrBadKey) {
		t.Errorf("NewECDSASigner(P-384) error = %v, want ErrBadKey", err)
	}
	if _, err := NewECDSAVerifier(nil); !errors.Is(err, ErrBadKey) {
		t.Errorf("NewECDSAVerifier(nil) error = %v, want ErrBadKey", err)
	}
	if _, err := NewECDSAVerifier(&p384.PublicKey); !errors.Is(err, ErrBadKey) {
		t.Errorf("NewECDSAVerifier(P-384) error = %v, want ErrBadKey", err)
	}
}

func TestFingerprints(t *testing.T) {
	key := mustGenerateP256(t)
	fp := Fingerprint(&key.PublicKey)
	if len(fp) != 64 || strings.ToLower(fp) != fp {
		t.Fatalf("Fingerprint = %q, want 64 lowercase hex digits", fp)
	}
	if fp != Fingerprint(&key.PublicKey) {
		t.Fatal("Fingerprint is not deterministic")
	}
	if fp == Fingerprint(&mustGenerateP256(t).PublicKey) {
		t.Fatal("different keys share a fingerprint")
	}
	if Fingerprint(nil) != "" {
		t.Fatal("Fingerprint(nil) is not empty")
	}

	secret := testSecret(32, 3)
	want := sha256.Sum256(append([]byte("kiroku hmac key id"), secret...))
	got := HMACKeyFingerprint(secret)
	if len(got) != 32 {
		t.Fatalf("HMACKeyFingerprint length %d, want 32", len(got))
	}
	if got != hex.EncodeToString(want[:16]) {
		t.Fatalf("HMACKeyFingerprint = %s, want %s", got, hex.EncodeToString(want[:16]))
	}
	if got == HMACKeyFingerprint(testSecret(32, 4)) {
		t.Fatal("different secrets share a fingerprint")
	}
}
