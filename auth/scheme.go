package auth

import (
	"fmt"
	"strconv"
)

// Scheme identifies a signature scheme. Its numeric values are part of
// kiroku's persistent and wire formats and must never change.
type Scheme uint8

// The supported signature schemes.
const (
	// SchemeHMAC is HMAC-SHA256 with a shared secret.
	SchemeHMAC Scheme = 1
	// SchemeECDSA is ECDSA on P-256 over SHA-256, ASN.1 DER signatures.
	SchemeECDSA Scheme = 2
)

// String returns the canonical lowercase name of s ("hmac" or "ecdsa"), or
// "Scheme(N)" for a value that is not a known scheme.
func (s Scheme) String() string {
	switch s {
	case SchemeHMAC:
		return "hmac"
	case SchemeECDSA:
		return "ecdsa"
	default:
		return "Scheme(" + strconv.Itoa(int(s)) + ")"
	}
}

// ParseScheme is the inverse of [Scheme.String]: it maps "hmac" and "ecdsa"
// to their Scheme. Names are matched exactly; any other input yields an error
// wrapping [ErrUnknownScheme].
func ParseScheme(s string) (Scheme, error) {
	switch s {
	case "hmac":
		return SchemeHMAC, nil
	case "ecdsa":
		return SchemeECDSA, nil
	default:
		return 0, fmt.Errorf("auth: scheme %q: %w", s, ErrUnknownScheme)
	}
}

// Signer produces signatures under one key. Implementations in this package
// are safe for concurrent use.
type Signer interface {
	// Scheme reports the signature scheme of the key.
	Scheme() Scheme
	// Sign returns a signature over msg. The message is not retained.
	Sign(msg []byte) ([]byte, error)
}

// Verifier checks signatures under one key. Implementations in this package
// are safe for concurrent use.
type Verifier interface {
	// Scheme reports the signature scheme of the key.
	Scheme() Scheme
	// Verify returns nil if sig is a valid signature of msg, and otherwise
	// an error wrapping ErrBadSignature. The message is not retained.
	Verify(msg, sig []byte) error
}
