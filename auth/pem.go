package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// maxPEMSize bounds the PEM input accepted by ParseCertificatePEM and
// ParsePrivateKeyPEM. A P-256 certificate is well under 1 KiB, so 16 KiB
// leaves ample room for extensions while keeping hostile inputs cheap.
const maxPEMSize = 16 << 10

// PEM block types understood by this package.
const (
	pemCertificate  = "CERTIFICATE"
	pemPKCS8Key     = "PRIVATE KEY"
	pemSEC1Key      = "EC PRIVATE KEY"
	pemECParameters = "EC PARAMETERS"
	pemPublicKey    = "PUBLIC KEY"
)

// splitPEM decodes data as a sequence of PEM blocks separated only by
// whitespace. Unlike a bare loop over pem.Decode, it refuses any text before,
// between or after the blocks, so that what was parsed is exactly what was
// given. The returned error does not wrap a sentinel; callers do.
func splitPEM(data []byte) ([]*pem.Block, error) {
	if len(data) > maxPEMSize {
		return nil, fmt.Errorf("input is %d bytes, limit is %d", len(data), maxPEMSize)
	}
	var blocks []*pem.Block
	rest := bytes.TrimSpace(data)
	if len(rest) == 0 {
		return nil, errors.New("empty input")
	}
	for len(rest) > 0 {
		if !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			if len(blocks) == 0 {
				return nil, errors.New("not PEM encoded")
			}
			return nil, errors.New("unexpected data after PEM block")
		}
		block, next := pem.Decode(rest)
		// pem.Decode silently skips a malformed block and returns the next
		// well-formed one; make sure the block it returned is the one that
		// starts here by checking that only one BEGIN line was consumed.
		consumed := rest[:len(rest)-len(next)]
		if block == nil || bytes.Count(consumed, []byte("-----BEGIN ")) != 1 {
			return nil, errors.New("malformed PEM block")
		}
		blocks = append(blocks, block)
		rest = bytes.TrimSpace(next)
	}
	return blocks, nil
}

// ParseCertificatePEM parses a PEM encoded X.509 certificate holding an ECDSA
// P-256 public key, as used to identify ECDSA clients and ledgers.
//
// The input must be at most 16 KiB and consist of exactly one CERTIFICATE
// block, without PEM headers, with nothing but whitespace around it. Any
// violation, an X.509 parse failure, or a public key other than ECDSA P-256
// yields an error wrapping [ErrBadCertificate]. The certificate's signature
// and validity period are not checked; trust decisions are left to the caller.
func ParseCertificatePEM(pemBytes []byte) (*x509.Certificate, error) {
	blocks, err := splitPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("auth: certificate: %w: %w", ErrBadCertificate, err)
	}
	if len(blocks) != 1 {
		return nil, fmt.Errorf("auth: certificate: %w: %d PEM blocks, want exactly 1", ErrBadCertificate, len(blocks))
	}
	block := blocks[0]
	if block.Type != pemCertificate {
		return nil, fmt.Errorf("auth: certificate: %w: PEM block type %q, want %q", ErrBadCertificate, block.Type, pemCertificate)
	}
	if len(block.Headers) != 0 {
		return nil, fmt.Errorf("auth: certificate: %w: unexpected PEM headers", ErrBadCertificate)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("auth: certificate: %w: %w", ErrBadCertificate, err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("auth: certificate: %w: public key is %s, want ECDSA P-256", ErrBadCertificate, keyKind(cert.PublicKey))
	}
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("auth: certificate: %w: %w", ErrBadCertificate, err)
	}
	return cert, nil
}

// keyKind names the algorithm of a parsed public or private key for error
// messages.
func keyKind(key any) string {
	switch key.(type) {
	case *rsa.PublicKey, *rsa.PrivateKey:
		return "RSA"
	case ed25519.PublicKey, ed25519.PrivateKey:
		return "Ed25519"
	case *ecdsa.PublicKey, *ecdsa.PrivateKey:
		return "ECDSA"
	default:
		return fmt.Sprintf("%T", key)
	}
}

// ParsePrivateKeyPEM parses a PEM encoded ECDSA P-256 private key, either as
// a PKCS#8 "PRIVATE KEY" block or a SEC 1 "EC PRIVATE KEY" block. An "EC
// PARAMETERS" block, as emitted by some OpenSSL commands, is tolerated and
// ignored; apart from that the input must hold exactly one key block and
// nothing but whitespace, and be at most 16 KiB. Encrypted PEM is not
// supported. Any failure yields an error wrapping [ErrBadKey].
func ParsePrivateKeyPEM(pemBytes []byte) (*ecdsa.PrivateKey, error) {
	key, err := parsePrivateKeyPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("auth: private key: %w", err)
	}
	return key, nil
}

// parsePrivateKeyPEM implements ParsePrivateKeyPEM; its errors wrap ErrBadKey
// but carry no "auth:" context, so that callers can supply their own.
func parsePrivateKeyPEM(pemBytes []byte) (*ecdsa.PrivateKey, error) {
	blocks, err := splitPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	var keyBlock *pem.Block
	for _, b := range blocks {
		switch b.Type {
		case pemECParameters:
			continue
		case pemPKCS8Key, pemSEC1Key:
			if keyBlock != nil {
				return nil, fmt.Errorf("%w: more than one key block", ErrBadKey)
			}
			keyBlock = b
		default:
			return nil, fmt.Errorf("%w: PEM block type %q, want %q or %q", ErrBadKey, b.Type, pemPKCS8Key, pemSEC1Key)
		}
	}
	if keyBlock == nil {
		return nil, fmt.Errorf("%w: no private key block", ErrBadKey)
	}
	if len(keyBlock.Headers) != 0 {
		return nil, fmt.Errorf("%w: unexpected PEM headers (encrypted keys are not supported)", ErrBadKey)
	}

	var key *ecdsa.PrivateKey
	if keyBlock.Type == pemSEC1Key {
		key, err = x509.ParseECPrivateKey(keyBlock.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
		}
	} else {
		parsed, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
		}
		var ok bool
		if key, ok = parsed.(*ecdsa.PrivateKey); !ok {
			return nil, fmt.Errorf("%w: key is %s, want ECDSA P-256", ErrBadKey, keyKind(parsed))
		}
	}
	if err := checkPrivateKey(key); err != nil {
		return nil, err
	}
	return key, nil
}

// MarshalPrivateKeyPEM encodes a P-256 private key as a PKCS#8 "PRIVATE KEY"
// PEM block, the format [ParsePrivateKeyPEM] and [LoadOrCreateECDSAKey] read
// back. Keys that are not valid P-256 keys are rejected with an error
// wrapping [ErrBadKey].
func MarshalPrivateKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	if err := checkPrivateKey(key); err != nil {
		return nil, fmt.Errorf("auth: private key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("auth: private key: %w: %w", ErrBadKey, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPKCS8Key, Bytes: der}), nil
}

// MarshalPublicKeyPEM encodes a P-256 public key as a PKIX "PUBLIC KEY"
// PEM block, the form in which a ledger publishes its proof key.
func MarshalPublicKeyPEM(pub *ecdsa.PublicKey) ([]byte, error) {
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("auth: public key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("auth: public key: %w: %w", ErrBadKey, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: der}), nil
}

// ParsePublicKeyPEM parses what MarshalPublicKeyPEM writes: exactly one
// "PUBLIC KEY" block without headers, nothing but whitespace around it, at
// most 16 KiB, holding an ECDSA P-256 key. Any failure yields an error
// wrapping [ErrBadKey].
func ParsePublicKeyPEM(pemBytes []byte) (*ecdsa.PublicKey, error) {
	blocks, err := splitPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("auth: public key: %w: %w", ErrBadKey, err)
	}
	if len(blocks) != 1 || blocks[0].Type != pemPublicKey || len(blocks[0].Headers) != 0 {
		return nil, fmt.Errorf("auth: public key: %w: want exactly one %q PEM block without headers", ErrBadKey, pemPublicKey)
	}
	k, err := x509.ParsePKIXPublicKey(blocks[0].Bytes)
	if err != nil {
		return nil, fmt.Errorf("auth: public key: %w: %w", ErrBadKey, err)
	}
	pub, ok := k.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("auth: public key: %w: %s, want ECDSA P-256", ErrBadKey, keyKind(k))
	}
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("auth: public key: %w", err)
	}
	return pub, nil
}

// GenerateIdentity creates a fresh P-256 key pair and a self-signed X.509
// certificate for it with the given subject common name and validity
// period, and returns both PEM encoded: the key as PKCS#8 (see
// [MarshalPrivateKeyPEM]) and the certificate as accepted by
// [ParseCertificatePEM]. The certificate's serial number is a random
// positive integer below 2^128.
//
// It is meant for demos, tests and benchmarks; production identities are
// expected to be issued by the operator's own PKI.
func GenerateIdentity(commonName string, notBefore, notAfter time.Time) (keyPEM, certPEM []byte, err error) {
	if !notAfter.After(notBefore) {
		return nil, nil, fmt.Errorf("auth: identity: validity ends (%s) before it starts (%s)",
			notAfter.Format(time.RFC3339), notBefore.Format(time.RFC3339))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: identity: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("auth: identity: serial number: %w", err)
	}
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: identity: create certificate: %w", err)
	}
	keyPEM, err = MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
	return keyPEM, certPEM, nil
}

// randomSerial returns a uniformly random integer in [1, 2^128).
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, err
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}
