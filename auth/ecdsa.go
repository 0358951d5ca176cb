package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
)

// maxECDSASigLen bounds the length of an ECDSA signature accepted for
// verification. A DER encoded P-256 signature is at most 72 bytes; anything
// much longer is rejected before any parsing takes place.
const maxECDSASigLen = 80

// ecdsaSigner is the Signer for SchemeECDSA.
type ecdsaSigner struct {
	key *ecdsa.PrivateKey
}

// ecdsaVerifier is the Verifier for SchemeECDSA.
type ecdsaVerifier struct {
	pub *ecdsa.PublicKey
}

// NewECDSASigner returns a [Signer] that signs SHA-256(msg) with key and
// encodes signatures in ASN.1 DER. The key must be a valid P-256 key;
// anything else is rejected with an error wrapping [ErrBadKey].
func NewECDSASigner(key *ecdsa.PrivateKey) (Signer, error) {
	if err := checkPrivateKey(key); err != nil {
		return nil, fmt.Errorf("auth: ecdsa signer: %w", err)
	}
	return &ecdsaSigner{key: key}, nil
}

// NewECDSAVerifier returns a [Verifier] that checks ASN.1 DER signatures of
// SHA-256(msg) under pub. The key must be a valid P-256 public key; anything
// else is rejected with an error wrapping [ErrBadKey].
func NewECDSAVerifier(pub *ecdsa.PublicKey) (Verifier, error) {
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("auth: ecdsa verifier: %w", err)
	}
	return &ecdsaVerifier{pub: pub}, nil
}

func (s *ecdsaSigner) Scheme() Scheme { return SchemeECDSA }

func (s *ecdsaSigner) Sign(msg []byte) ([]byte, error) {
	digest := sha256.Sum256(msg)
	sig, err := ecdsa.SignASN1(rand.Reader, s.key, digest[:])
	if err != nil {
		return nil, fmt.Errorf("auth: ecdsa: sign: %w", err)
	}
	return sig, nil
}

func (v *ecdsaVerifier) Scheme() Scheme { return SchemeECDSA }

func (v *ecdsaVerifier) Verify(msg, sig []byte) error {
	if len(sig) == 0 || len(sig) > maxECDSASigLen {
		return fmt.Errorf("auth: ecdsa: %w: length %d, want 1 to %d bytes",
			ErrBadSignature, len(sig), maxECDSASigLen)
	}
	digest := sha256.Sum256(msg)
	if !ecdsa.VerifyASN1(v.pub, digest[:], sig) {
		return fmt.Errorf("auth: ecdsa: %w", ErrBadSignature)
	}
	return nil
}

// checkPrivateKey returns an error wrapping ErrBadKey unless key is a usable
// P-256 private key. The returned error has no "auth:" prefix; callers add
// their own context.
func checkPrivateKey(key *ecdsa.PrivateKey) error {
	if key == nil {
		return fmt.Errorf("%w: nil private key", ErrBadKey)
	}
	if err := checkPublicKey(&key.PublicKey); err != nil {
		return err
	}
	// ECDH validates the private scalar as well as the curve.
	if _, err := key.ECDH(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return nil
}

// checkPublicKey returns an error wrapping ErrBadKey unless pub is a valid
// point on P-256. The returned error has no "auth:" prefix.
func checkPublicKey(pub *ecdsa.PublicKey) error {
	if pub == nil {
		return fmt.Errorf("%w: nil public key", ErrBadKey)
	}
	if pub.Curve != elliptic.P256() {
		return fmt.Errorf("%w: curve %s, want P-256", ErrBadKey, curveName(pub.Curve))
	}
	// ECDH rejects the point at infinity and points not on the curve.
	if _, err := pub.ECDH(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return nil
}

// curveName describes c for error messages.
func curveName(c elliptic.Curve) string {
	if c == nil || c.Params() == nil {
		return "<none>"
	}
	return c.Params().Name
}

// Fingerprint returns the lowercase hex encoding of the SHA-256 hash of the
// PKIX (SubjectPublicKeyInfo) DER encoding of pub: a stable 64-character
// identifier for an ECDSA key, independent of any certificate carrying it.
// It returns the empty string if pub is nil or cannot be encoded.
func Fingerprint(pub *ecdsa.PublicKey) string {
	if pub == nil {
		return ""
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}
