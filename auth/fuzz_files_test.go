package auth

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fuzz targets for what the package reads from outside the process: key
// files on disk (LoadOrCreateSecretKey, LoadOrCreateECDSAKey and the PEM
// parser behind it) and sealed secrets from the ledger's database
// (SecretBox.Open).

// FuzzSecretKeyFile loads a secret key file of arbitrary content. A file
// that is not 64 hex digits (give or take surrounding whitespace) is
// refused with ErrBadKey naming the file, and never replaced; an accepted
// one gives the 32 bytes its digits spell.
func FuzzSecretKeyFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "secrets.key")
	good := strings.Repeat("0123456789abcdef", 4)
	for _, s := range []string{good + "\n", " \t" + strings.ToUpper(good) + "\r\n\n", good, good[:63], good + "0", good[:62] + "zz",
		good[:32] + " " + good[32:], "", "\n", strings.Repeat("0", maxKeyFileSize+1)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		key, err := LoadOrCreateSecretKey(path)
		after, rerr := os.ReadFile(path)
		if rerr != nil || !bytes.Equal(after, content) {
			t.Fatalf("loading changed the key file from %q to %q (%v)", content, after, rerr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadKey) || !strings.Contains(err.Error(), path) || key != nil {
				t.Fatalf("refusal %v (key %x) does not wrap ErrBadKey, name the file and return no key", err, key)
			}
			return
		}
		if len(key) != secretKeyLen || hex.EncodeToString(key) != strings.ToLower(string(bytes.TrimSpace(content))) {
			t.Fatalf("file %q gave key %x", content, key)
		}
	})
}

// FuzzECDSAKeyFile loads an ECDSA key file of arbitrary content, and
// parses the same bytes with ParsePrivateKeyPEM. Both give the same
// verdict and key; a refusal wraps ErrBadKey (the loader's names the
// file) and the file is never replaced; an accepted key is a usable P-256
// key (what it signs verifies) that encodes back to itself.
func FuzzECDSAKeyFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "ledger-ecdsa.pem")
	key := fuzzKey(f)
	pkcs8, err := MarshalPrivateKeyPEM(key)
	if err != nil {
		f.Fatal(err)
	}
	sec1DER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		f.Fatal(err)
	}
	sec1 := pem.EncodeToMemory(&pem.Block{Type: pemSEC1Key, Bytes: sec1DER})
	params := pem.EncodeToMemory(&pem.Block{Type: pemECParameters, Bytes: []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}})
	withHeaders := pem.EncodeToMemory(&pem.Block{Type: pemPKCS8Key, Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: sec1DER})
	d := sha256.Sum256([]byte("kiroku auth fuzz P-384 key"))
	p384, err := ecdsa.ParseRawPrivateKey(elliptic.P384(), append(d[:], d[:16]...))
	if err != nil {
		f.Fatal(err)
	}
	p384DER, err := x509.MarshalPKCS8PrivateKey(p384)
	if err != nil {
		f.Fatal(err)
	}
	edDER, err := x509.MarshalPKCS8PrivateKey(ed25519.NewKeyFromSeed(d[:]))
	if err != nil {
		f.Fatal(err)
	}
	keyPEM, certPEM := mustIdentity(f)
	for _, in := range [][]byte{pkcs8, sec1, append(bytes.Clone(params), sec1...), append(bytes.Clone(pkcs8), pkcs8...), withHeaders,
		pem.EncodeToMemory(&pem.Block{Type: pemPKCS8Key, Bytes: p384DER}), pem.EncodeToMemory(&pem.Block{Type: pemPKCS8Key, Bytes: edDER}),
		keyPEM, certPEM, append([]byte("x"), pkcs8...), append(bytes.Clone(pkcs8), 'x'), pkcs8[:len(pkcs8)/2], params, {}} {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		loaded, err := LoadOrCreateECDSAKey(path)
		parsed, perr := ParsePrivateKeyPEM(content)
		after, rerr := os.ReadFile(path)
		if rerr != nil || !bytes.Equal(after, content) {
			t.Fatalf("loading changed the key file (%v)", rerr)
		}
		if (err == nil) != (perr == nil) {
			t.Fatalf("the loader says %v, the parser %v", err, perr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadKey) || !strings.Contains(err.Error(), path) || loaded != nil {
				t.Fatalf("loader's refusal %v does not wrap ErrBadKey, name the file and return no key", err)
			}
			if !errors.Is(perr, ErrBadKey) || parsed != nil {
				t.Fatalf("parser's refusal %v does not wrap ErrBadKey and return no key", perr)
			}
			return
		}
		if len(content) > maxPEMSize || !loaded.Equal(parsed) || loaded.Curve != elliptic.P256() {
			t.Fatalf("accepted %d bytes: a %v key, parsed alike: %v", len(content), loaded.Curve, loaded.Equal(parsed))
		}
		s, err := NewECDSASigner(loaded)
		if err != nil {
			t.Fatalf("accepted key cannot sign: %v", err)
		}
		v, err := NewECDSAVerifier(&loaded.PublicKey)
		if err != nil {
			t.Fatalf("accepted key's public half cannot verify: %v", err)
		}
		sig, err := s.Sign(content)
		if err != nil || v.Verify(content, sig) != nil {
			t.Fatalf("accepted key's signature does not verify: %v", err)
		}
		again, err := MarshalPrivateKeyPEM(loaded)
		if err != nil {
			t.Fatal(err)
		}
		if k, err := ParsePrivateKeyPEM(again); err != nil || !k.Equal(loaded) {
			t.Fatalf("re-encoded key does not parse back: %v", err)
		}
	})
}

// FuzzSecretBoxOpen opens arbitrary bytes as a sealed secret, as the
// ledger opens what its database holds. Only what Seal makes opens: an
// opened value seals back, under its own nonce, to exactly the bytes
// given; anything else is refused with ErrSealed and no plaintext. And
// whatever bytes are sealed open back to themselves.
func FuzzSecretBoxOpen(f *testing.F) {
	key := testSecret(sealKeyLen, 0x5a)
	box, err := NewSecretBox(key)
	if err != nil {
		f.Fatal(err)
	}
	block, _ := aes.NewCipher(key)
	aead, _ := cipher.NewGCM(block)
	seal := func(nonce byte, pt, ad string) []byte { // deterministic: every worker has the same seeds
		out := append([]byte{sealVersion}, bytes.Repeat([]byte{nonce}, sealNonceLen)...)
		return aead.Seal(out, out[1:sealHeaderLen], []byte(pt), []byte(ad))
	}
	for _, s := range []struct{ sealed, ad []byte }{
		{seal(1, "secret", "alice/1"), []byte("alice/1")},
		{seal(2, "", ""), nil},
		{seal(3, "secret", "alice/1"), []byte("alice/2")},
		{seal(4, "secret", "alice/1")[:sealHeaderLen+sealTagLen-1], []byte("alice/1")},
		{append([]byte{2}, seal(5, "secret", "")[1:]...), nil},
		{nil, nil},
	} {
		f.Add(s.sealed, s.ad)
	}
	f.Fuzz(func(t *testing.T, sealed, ad []byte) {
		pt, err := box.Open(sealed, ad)
		if err != nil {
			if !errors.Is(err, ErrSealed) || pt != nil {
				t.Fatalf("refusal %v (plaintext %q) does not wrap ErrSealed alone", err, pt)
			}
		} else {
			resealed := aead.Seal(bytes.Clone(sealed[:sealHeaderLen]), sealed[1:sealHeaderLen], pt, ad)
			if sealed[0] != sealVersion || !bytes.Equal(resealed, sealed) {
				t.Fatalf("opened %x, which Seal does not make from %q", sealed, pt)
			}
		}
		out, err := box.Seal(sealed, ad)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := box.Open(out, ad); err != nil || !bytes.Equal(back, sealed) {
			t.Fatalf("sealed %x, opened %x, %v", sealed, back, err)
		}
		if len(out) > 0 {
			out[len(out)-1] ^= 1
			if _, err := box.Open(out, ad); !errors.Is(err, ErrSealed) {
				t.Fatalf("a sealed value with its last bit flipped opened: %v", err)
			}
		}
	})
}
