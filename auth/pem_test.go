package auth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

// selfSignedPEM returns a PEM certificate for the public half of key, self
// signed by key.
func selfSignedPEM(t testing.TB, key crypto.Signer) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func mustIdentity(t testing.TB) (keyPEM, certPEM []byte) {
	t.Helper()
	keyPEM, certPEM, err := GenerateIdentity("ledger-test", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return keyPEM, certPEM
}

func TestGenerateIdentity(t *testing.T) {
	keyPEM, certPEM := mustIdentity(t)
	cert, err := ParseCertificatePEM(certPEM)
	if err != nil {
		t.Fatalf("ParseCertificatePEM(GenerateIdentity output): %v", err)
	}
	key, err := ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		t.Fatalf("ParsePrivateKeyPEM(GenerateIdentity output): %v", err)
	}
	pub := cert.PublicKey.(*ecdsa.PublicKey)
	if !key.PublicKey.Equal(pub) {
		t.Fatal("certificate does not hold the generated key")
	}
	if cert.Subject.CommonName != "ledger-test" {
		t.Errorf("common name = %q", cert.Subject.CommonName)
	}
	if err := cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature); err != nil {
		t.Errorf("certificate is not self-signed: %v", err)
	}
	if cert.SerialNumber.Sign() <= 0 || cert.SerialNumber.BitLen() > 128 {
		t.Errorf("serial %v is not a positive 128-bit number", cert.SerialNumber)
	}
	_, certPEM2 := mustIdentity(t)
	cert2, err := ParseCertificatePEM(certPEM2)
	if err != nil {
		t.Fatal(err)
	}
	if cert.SerialNumber.Cmp(cert2.SerialNumber) == 0 {
		t.Error("two identities share a serial number")
	}
	if Fingerprint(pub) == Fingerprint(cert2.PublicKey.(*ecdsa.PublicKey)) {
		t.Error("two identities share a key")
	}

	// Keys and certificates from GenerateIdentity work together.
	s, err := NewECDSASigner(key)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewECDSAVerifier(pub)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := s.Sign([]byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify([]byte("hello"), sig); err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	if _, _, err := GenerateIdentity("x", now, now.Add(-time.Second)); err == nil {
		t.Error("GenerateIdentity accepted notAfter before notBefore")
	}
}

func TestParseCertificatePEM(t *testing.T) {
	keyPEM, certPEM := mustIdentity(t)
	_, otherCertPEM := mustIdentity(t)

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384Key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	withHeaders := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"X": "y"}, Bytes: block.Bytes})
	garbageDER := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
	oversized := append(bytes.Clone(certPEM), bytes.Repeat([]byte(" "), maxPEMSize)...)
	// A malformed block that pem.Decode would silently skip.
	skipped := append([]byte("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"), certPEM...)

	good := []struct {
		name string
		in   []byte
	}{
		{"GenerateIdentity", certPEM},
		{"surrounding whitespace", append(append([]byte("\n \t\r\n"), certPEM...), "\n\n  \r\n"...)},
		{"CRLF", bytes.ReplaceAll(certPEM, []byte("\n"), []byte("\r\n"))},
	}
	for _, tt := range good {
		cert, err := ParseCertificatePEM(tt.in)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
			t.Errorf("%s: public key is not P-256", tt.name)
		}
	}

	bad := []struct {
		name string
		in   []byte
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"whitespace only", []byte(" \n\t\n")},
		{"not PEM", []byte("hello, world\n")},
		{"DER without PEM", block.Bytes},
		{"leading junk", append([]byte("subject=ledger\n"), certPEM...)},
		{"private key block", keyPEM},
		{"two certificates", append(bytes.Clone(certPEM), otherCertPEM...)},
		{"certificate then key", append(bytes.Clone(certPEM), keyPEM...)},
		{"trailing junk", append(bytes.Clone(certPEM), "junk"...)},
		{"trailing NUL", append(bytes.Clone(certPEM), 0)},
		{"truncated", certPEM[:len(certPEM)-10]},
		{"PEM headers", withHeaders},
		{"not DER inside", garbageDER},
		{"malformed block before valid one", skipped},
		{"RSA certificate", selfSignedPEM(t, rsaKey)},
		{"P-384 certificate", selfSignedPEM(t, p384Key)},
		{"over 16 KiB", oversized},
	}
	for _, tt := range bad {
		cert, err := ParseCertificatePEM(tt.in)
		if !errors.Is(err, ErrBadCertificate) {
			t.Errorf("%s: error = %v, want ErrBadCertificate", tt.name, err)
		}
		if cert != nil {
			t.Errorf("%s: returned a certificate alongside the error", tt.name)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "auth: certificate: ") {
			t.Errorf("%s: error %q lacks context", tt.name, err)
		}
	}
}

func TestParsePrivateKeyPEM(t *testing.T) {
	key := mustGenerateP256(t)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sec1, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384PKCS8, err := x509.MarshalPKCS8PrivateKey(p384)
	if err != nil {
		t.Fatal(err)
	}
	p384SEC1, err := x509.MarshalECPrivateKey(p384)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPKCS8, err := x509.MarshalPKCS8PrivateKey(rsaKey)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, der []byte) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	}
	marshaled, err := MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(marshaled, []byte("-----BEGIN PRIVATE KEY-----\n")) {
		t.Fatalf("MarshalPrivateKeyPEM did not produce PKCS#8:\n%s", marshaled)
	}
	// OpenSSL's "ecparam -genkey" emits the curve parameters first.
	ecParams := enc("EC PARAMETERS", []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07})

	good := []struct {
		name string
		in   []byte
	}{
		{"PKCS#8", enc("PRIVATE KEY", pkcs8)},
		{"SEC 1", enc("EC PRIVATE KEY", sec1)},
		{"SEC 1 after EC PARAMETERS", append(bytes.Clone(ecParams), enc("EC PRIVATE KEY", sec1)...)},
		{"MarshalPrivateKeyPEM", marshaled},
	}
	for _, tt := range good {
		got, err := ParsePrivateKeyPEM(tt.in)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if !got.Equal(key) {
			t.Errorf("%s: parsed a different key", tt.name)
		}
	}

	bad := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"garbage", []byte("garbage")},
		{"garbage in PEM", enc("PRIVATE KEY", []byte("garbage"))},
		{"certificate", selfSignedPEM(t, key)},
		{"P-384 PKCS#8", enc("PRIVATE KEY", p384PKCS8)},
		{"P-384 SEC 1", enc("EC PRIVATE KEY", p384SEC1)},
		{"RSA PKCS#8", enc("PRIVATE KEY", rsaPKCS8)},
		{"RSA PKCS#1", enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey))},
		{"SEC 1 labeled PKCS#8", enc("PRIVATE KEY", sec1)},
		{"two keys", append(enc("PRIVATE KEY", pkcs8), enc("EC PRIVATE KEY", sec1)...)},
		{"trailing junk", append(enc("PRIVATE KEY", pkcs8), "junk"...)},
		{"only EC PARAMETERS", ecParams},
		{"encrypted", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: sec1})},
	}
	for _, tt := range bad {
		got, err := ParsePrivateKeyPEM(tt.in)
		if !errors.Is(err, ErrBadKey) {
			t.Errorf("%s: error = %v, want ErrBadKey", tt.name, err)
		}
		if got != nil {
			t.Errorf("%s: returned a key alongside the error", tt.name)
		}
	}

	if _, err := MarshalPrivateKeyPEM(p384); !errors.Is(err, ErrBadKey) {
		t.Errorf("MarshalPrivateKeyPEM(P-384) error = %v, want ErrBadKey", err)
	}
	if _, err := MarshalPrivateKeyPEM(nil); !errors.Is(err, ErrBadKey) {
		t.Errorf("MarshalPrivateKeyPEM(nil) error = %v, want ErrBadKey", err)
	}
}
