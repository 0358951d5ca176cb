package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"sync"
)

// Bounds on the length of an HMAC secret, in bytes. The lower bound matches
// the output size of SHA-256, below which the secret rather than the hash
// limits security; the upper bound keeps configuration mistakes (a whole file
// pasted as a secret) from going unnoticed.
const (
	MinSecretLen = 32
	MaxSecretLen = 1024
)

// hmacKeyIDDomain separates HMAC key fingerprints from any other use of
// SHA-256 over a secret.
const hmacKeyIDDomain = "kiroku hmac key id"

// hmacKey is both the Signer and the Verifier for SchemeHMAC. It owns a
// private copy of the secret. Each call takes a keyed hash state of its
// own from a pool (keying one costs two hash blocks and four allocations,
// more than a short message), so it is safe for concurrent use.
type hmacKey struct {
	secret []byte
	states sync.Pool // of hash.Hash keyed with secret, reset
}

func newHMACKey(secret []byte) (*hmacKey, error) {
	if n := len(secret); n < MinSecretLen || n > MaxSecretLen {
		return nil, fmt.Errorf("auth: hmac: %w: length %d, want %d to %d bytes",
			ErrBadSecret, n, MinSecretLen, MaxSecretLen)
	}
	return &hmacKey{secret: append([]byte(nil), secret...)}, nil
}

// NewHMACSigner returns a [Signer] computing HMAC-SHA256 under secret. The
// secret is copied, so the caller may reuse or wipe its slice. A secret
// shorter than [MinSecretLen] or longer than [MaxSecretLen] is rejected with
// an error wrapping [ErrBadSecret].
func NewHMACSigner(secret []byte) (Signer, error) {
	k, err := newHMACKey(secret)
	if err != nil {
		return nil, err
	}
	return k, nil
}

// NewHMACVerifier returns a [Verifier] for HMAC-SHA256 under secret. MACs are
// compared in constant time. The secret is copied and must satisfy the same
// length bounds as for [NewHMACSigner].
func NewHMACVerifier(secret []byte) (Verifier, error) {
	k, err := newHMACKey(secret)
	if err != nil {
		return nil, err
	}
	return k, nil
}

func (k *hmacKey) Scheme() Scheme { return SchemeHMAC }

func (k *hmacKey) Sign(msg []byte) ([]byte, error) {
	return k.mac(msg), nil
}

func (k *hmacKey) Verify(msg, sig []byte) error {
	if len(sig) != sha256.Size {
		return fmt.Errorf("auth: hmac: %w: length %d, want %d", ErrBadSignature, len(sig), sha256.Size)
	}
	if !hmac.Equal(k.mac(msg), sig) {
		return fmt.Errorf("auth: hmac: %w", ErrBadSignature)
	}
	return nil
}

func (k *hmacKey) mac(msg []byte) []byte {
	h, _ := k.states.Get().(hash.Hash)
	if h == nil {
		h = hmac.New(sha256.New, k.secret)
	}
	h.Write(msg)
	sum := h.Sum(nil)
	h.Reset()
	k.states.Put(h)
	return sum
}

// HMACKeyFingerprint returns a short public identifier for an HMAC secret:
// the lowercase hex encoding of the first 16 bytes of
// SHA-256("kiroku hmac key id" || secret), 32 characters in all. It lets logs
// and configuration refer to a secret without revealing it; the fixed prefix
// keeps the value unrelated to any other hash of the same secret.
func HMACKeyFingerprint(secret []byte) string {
	h := sha256.New()
	h.Write([]byte(hmacKeyIDDomain))
	h.Write(secret)
	return hex.EncodeToString(h.Sum(nil)[:16])
}
