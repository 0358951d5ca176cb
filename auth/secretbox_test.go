package auth

import (
	"bytes"
	"errors"
	"testing"
)

func TestSecretBox(t *testing.T) {
	key := testSecret(32, 10)
	box, err := NewSecretBox(key)
	if err != nil {
		t.Fatal(err)
	}
	secret := testSecret(48, 20)
	ad := []byte("client:alice")
	sealed, err := box.Seal(secret, ad)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + 12 + len(secret) + 16; len(sealed) != want {
		t.Fatalf("sealed length %d, want %d", len(sealed), want)
	}
	if sealed[0] != 1 {
		t.Fatalf("version byte %d, want 1", sealed[0])
	}
	if bytes.Contains(sealed, secret[:16]) {
		t.Fatal("sealed output contains plaintext")
	}
	got, err := box.Open(sealed, ad)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatal("round trip changed the secret")
	}

	again, err := box.Seal(secret, ad)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(again, sealed) || bytes.Equal(again[1:13], sealed[1:13]) {
		t.Fatal("two seals of the same plaintext share a nonce")
	}

	// Empty plaintext and nil additional data are fine.
	empty, err := box.Seal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := box.Open(empty, []byte{}); err != nil || len(got) != 0 {
		t.Fatalf("empty round trip: %q, %v", got, err)
	}

	otherBox, err := NewSecretBox(testSecret(32, 11))
	if err != nil {
		t.Fatal(err)
	}
	wrongVersion := bytes.Clone(sealed)
	wrongVersion[0] = 2
	bad := []struct {
		name   string
		box    *SecretBox
		sealed []byte
		ad     []byte
	}{
		{"wrong key", otherBox, sealed, ad},
		{"wrong additional data", box, sealed, []byte("client:bob")},
		{"missing additional data", box, sealed, nil},
		{"flipped version byte", box, flip(sealed, 0), ad},
		{"wrong version byte", box, wrongVersion, ad},
		{"flipped nonce byte", box, flip(sealed, 5), ad},
		{"flipped ciphertext byte", box, flip(sealed, 20), ad},
		{"flipped tag byte", box, flip(sealed, len(sealed)-1), ad},
		{"truncated by one", box, sealed[:len(sealed)-1], ad},
		{"header only", box, sealed[:13], ad},
		{"shorter than header+tag", box, sealed[:28], ad},
		{"empty", box, nil, ad},
		{"zero-value box", &SecretBox{}, sealed, ad},
	}
	for _, tt := range bad {
		got, err := tt.box.Open(tt.sealed, tt.ad)
		if !errors.Is(err, ErrSealed) {
			t.Errorf("%s: error = %v, want ErrSealed", tt.name, err)
		}
		if got != nil {
			t.Errorf("%s: returned plaintext alongside the error", tt.name)
		}
	}
}

func TestSecretBoxKeyLength(t *testing.T) {
	for _, n := range []int{0, 16, 24, 31, 33, 64} {
		if _, err := NewSecretBox(make([]byte, n)); !errors.Is(err, ErrBadKey) {
			t.Errorf("key length %d: error = %v, want ErrBadKey", n, err)
		}
	}
}
