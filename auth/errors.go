package auth

import "errors"

// Sentinel errors. Errors returned by this package wrap exactly one of these
// and add context, so callers should test for them with errors.Is.
var (
	// ErrBadSignature reports that a signature does not verify: the key is
	// wrong, the message was altered, or the signature bytes are malformed.
	ErrBadSignature = errors.New("invalid signature")

	// ErrBadCertificate reports an unusable certificate: the input is not
	// PEM, is not a single CERTIFICATE block, has trailing data, cannot be
	// parsed as X.509, or does not hold an ECDSA P-256 public key.
	ErrBadCertificate = errors.New("invalid certificate")

	// ErrBadKey reports an unusable key: a private key that cannot be parsed
	// or is not on P-256, a key file with malformed content, or a SecretBox
	// key of the wrong length.
	ErrBadKey = errors.New("invalid key")

	// ErrBadSecret reports an HMAC secret whose length is outside
	// [MinSecretLen, MaxSecretLen].
	ErrBadSecret = errors.New("invalid HMAC secret")

	// ErrUnknownScheme reports a signature scheme name or number that this
	// package does not implement.
	ErrUnknownScheme = errors.New("unknown signature scheme")

	// ErrSealed reports that a sealed secret could not be opened: it is
	// truncated or corrupt, has an unknown format version, or was sealed
	// under a different key or different additional data.
	ErrSealed = errors.New("cannot open sealed secret")
)
