package auth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/asn1"
	"errors"
	"math/big"
	"testing"
)

func FuzzParseCertificatePEM(f *testing.F) {
	keyPEM, certPEM := mustIdentity(f)
	f.Add(certPEM)
	f.Add(keyPEM)
	f.Add(append(bytes.Clone(certPEM), certPEM...))
	f.Add(append(bytes.Clone(certPEM), "junk"...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("not pem"))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, in []byte) {
		cert, err := ParseCertificatePEM(in)
		if err != nil {
			if !errors.Is(err, ErrBadCertificate) {
				t.Fatalf("error %v does not wrap ErrBadCertificate", err)
			}
			if cert != nil {
				t.Fatal("certificate returned alongside an error")
			}
			return
		}
		if len(in) > maxPEMSize {
			t.Fatalf("accepted %d bytes of input", len(in))
		}
		pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P256() {
			t.Fatalf("accepted a certificate with public key %T", cert.PublicKey)
		}
		if _, err := NewECDSAVerifier(pub); err != nil {
			t.Fatalf("accepted key unusable for verification: %v", err)
		}
	})
}

// FuzzParsePublicKeyPEM: a ledger's published proof key is untrusted input
// to a Validator. Whatever is accepted is a usable P-256 key and encodes
// back to the same key.
func FuzzParsePublicKeyPEM(f *testing.F) {
	key := fuzzKey(f)
	pub, err := MarshalPublicKeyPEM(&key.PublicKey)
	if err != nil {
		f.Fatal(err)
	}
	keyPEM, certPEM := mustIdentity(f)
	f.Add(pub)
	f.Add(append(bytes.Clone(pub), pub...))
	f.Add(keyPEM)
	f.Add(certPEM)
	f.Add([]byte("-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		k, err := ParsePublicKeyPEM(in)
		if err != nil {
			if !errors.Is(err, ErrBadKey) || k != nil {
				t.Fatalf("rejection %v (key %v) does not wrap ErrBadKey alone", err, k)
			}
			return
		}
		if _, err := NewECDSAVerifier(k); err != nil {
			t.Fatalf("accepted key unusable for verification: %v", err)
		}
		again, err := MarshalPublicKeyPEM(k)
		if err != nil {
			t.Fatal(err)
		}
		if k2, err := ParsePublicKeyPEM(again); err != nil || !k2.Equal(k) {
			t.Fatalf("re-encoded key does not parse back: %v", err)
		}
	})
}

// fuzzKey returns a fixed P-256 key so that every fuzzing worker process
// agrees on which signatures are genuine.
func fuzzKey(f *testing.F) *ecdsa.PrivateKey {
	f.Helper()
	d := sha256.Sum256([]byte("kiroku auth fuzz key"))
	key, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), d[:])
	if err != nil {
		f.Fatal(err)
	}
	return key
}

// malleate returns the other valid encoding (r, n-s) of a DER ECDSA
// signature, which verifies just as well as the original.
func malleate(f *testing.F, sig []byte) []byte {
	f.Helper()
	var rs struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(sig, &rs); err != nil {
		f.Fatal(err)
	}
	rs.S.Sub(elliptic.P256().Params().N, rs.S)
	out, err := asn1.Marshal(rs)
	if err != nil {
		f.Fatal(err)
	}
	return out
}

func FuzzVerify(f *testing.F) {
	secret := testSecret(32, 0x42)
	hmacSigner, err := NewHMACSigner(secret)
	if err != nil {
		f.Fatal(err)
	}
	hmacVerifier, err := NewHMACVerifier(secret)
	if err != nil {
		f.Fatal(err)
	}
	key := fuzzKey(f)
	ecdsaVerifier, err := NewECDSAVerifier(&key.PublicKey)
	if err != nil {
		f.Fatal(err)
	}

	// Genuine ECDSA signatures are deterministic (RFC 6979), so all worker
	// processes compute the same set. For each signed message, the valid
	// signatures are the genuine one and its malleated twin.
	genuine := map[string][][]byte{}
	for _, msg := range []string{"", "append key=a value=1", "proof 7"} {
		digest := sha256.Sum256([]byte(msg))
		sig, err := key.Sign(nil, digest[:], crypto.SHA256)
		if err != nil {
			f.Fatal(err)
		}
		twin := malleate(f, sig)
		genuine[msg] = [][]byte{sig, twin}
		f.Add([]byte(msg), twin)
		mac, _ := hmacSigner.Sign([]byte(msg))
		f.Add([]byte(msg), sig)
		f.Add([]byte(msg), mac)
		f.Add([]byte(msg), sig[:len(sig)-1])
		f.Add([]byte(msg+"x"), sig)
	}
	f.Add([]byte("m"), []byte{})
	f.Add([]byte("m"), bytes.Repeat([]byte{0x30}, 81))
	f.Add([]byte("m"), []byte{0x30, 0x06, 0x02, 0x01, 0x00, 0x02, 0x01, 0x00})

	f.Fuzz(func(t *testing.T, msg, sig []byte) {
		// HMAC: exactly one signature per message is valid.
		mac, _ := hmacSigner.Sign(msg)
		err := hmacVerifier.Verify(msg, sig)
		switch {
		case bytes.Equal(sig, mac) && err != nil:
			t.Fatalf("hmac: genuine signature rejected: %v", err)
		case !bytes.Equal(sig, mac) && err == nil:
			t.Fatalf("hmac: accepted forged signature %x", sig)
		case err != nil && !errors.Is(err, ErrBadSignature):
			t.Fatalf("hmac: error %v does not wrap ErrBadSignature", err)
		}

		// ECDSA: only the genuine signatures of signed messages verify.
		err = ecdsaVerifier.Verify(msg, sig)
		isGenuine := false
		for _, g := range genuine[string(msg)] {
			if bytes.Equal(sig, g) {
				isGenuine = true
			}
		}
		switch {
		case isGenuine && err != nil:
			t.Fatalf("ecdsa: genuine signature rejected: %v", err)
		case !isGenuine && err == nil:
			t.Fatalf("ecdsa: accepted forged signature %x for %q", sig, msg)
		case err != nil && !errors.Is(err, ErrBadSignature):
			t.Fatalf("ecdsa: error %v does not wrap ErrBadSignature", err)
		}
	})
}
