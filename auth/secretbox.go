package auth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
)

// Layout of a sealed secret:
//
//	version (1 byte) || nonce (12 bytes) || ciphertext || GCM tag (16 bytes)
const (
	sealVersion   = 1
	sealKeyLen    = 32
	sealNonceLen  = 12
	sealTagLen    = 16
	sealHeaderLen = 1 + sealNonceLen
)

// SecretBox seals HMAC secrets, and other small values, for storage at rest
// with AES-256-GCM. Each Seal draws a fresh random 12-byte nonce, so sealing
// the same plaintext twice gives different outputs. The output starts with a
// format version byte (currently 1) so that the layout can evolve; Open
// rejects versions it does not know.
//
// Additional data is authenticated but not stored: binding a sealed secret to
// its context (for example the ID of the client it belongs to) prevents a
// sealed value from being copied to another record.
//
// The number of random-nonce seals under one key should stay well below 2^32.
// A SecretBox must be created with [NewSecretBox] and is safe for concurrent
// use.
type SecretBox struct {
	aead cipher.AEAD
}

// NewSecretBox returns a SecretBox using key, which must be exactly 32 bytes
// (AES-256); any other length is rejected with an error wrapping [ErrBadKey].
// The key is not retained beyond its expanded AES key schedule.
func NewSecretBox(key []byte) (*SecretBox, error) {
	if len(key) != sealKeyLen {
		return nil, fmt.Errorf("auth: secret box: %w: key is %d bytes, want %d", ErrBadKey, len(key), sealKeyLen)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("auth: secret box: %w: %w", ErrBadKey, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("auth: secret box: %w: %w", ErrBadKey, err)
	}
	return &SecretBox{aead: aead}, nil
}

// Seal encrypts and authenticates plaintext, also authenticating
// additionalData, and returns version || nonce || ciphertext+tag in a newly
// allocated slice. It fails only if the box was not created with
// [NewSecretBox] or the system random source fails.
func (b *SecretBox) Seal(plaintext, additionalData []byte) ([]byte, error) {
	if b == nil || b.aead == nil {
		return nil, fmt.Errorf("auth: secret box: %w: not initialized by NewSecretBox", ErrBadKey)
	}
	out := make([]byte, sealHeaderLen, sealHeaderLen+len(plaintext)+sealTagLen)
	out[0] = sealVersion
	nonce := out[1:sealHeaderLen]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("auth: secret box: nonce: %w", err)
	}
	return b.aead.Seal(out, nonce, plaintext, additionalData), nil
}

// Open authenticates and decrypts a value produced by [SecretBox.Seal] with
// the same key and additional data, returning the plaintext in a newly
// allocated slice. Any failure (truncated input, unknown version byte,
// corrupted bytes, wrong key or wrong additional data) yields an error
// wrapping [ErrSealed]; the causes are deliberately not distinguished beyond
// the message.
func (b *SecretBox) Open(sealed, additionalData []byte) ([]byte, error) {
	if b == nil || b.aead == nil {
		return nil, fmt.Errorf("auth: secret box: %w: not initialized by NewSecretBox", ErrSealed)
	}
	if len(sealed) < sealHeaderLen+sealTagLen {
		return nil, fmt.Errorf("auth: secret box: %w: %d bytes is too short", ErrSealed, len(sealed))
	}
	if sealed[0] != sealVersion {
		return nil, fmt.Errorf("auth: secret box: %w: unknown version %d", ErrSealed, sealed[0])
	}
	nonce := sealed[1:sealHeaderLen]
	plaintext, err := b.aead.Open(nil, nonce, sealed[sealHeaderLen:], additionalData)
	if err != nil {
		return nil, fmt.Errorf("auth: secret box: %w: authentication failed", ErrSealed)
	}
	return plaintext, nil
}
