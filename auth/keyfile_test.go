package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// keyFileCase describes one of the two key-file kinds under a common shape:
// load returns the key as comparable bytes.
type keyFileCase struct {
	name string
	load func(path string) ([]byte, error)
}

func keyFileCases() []keyFileCase {
	return []keyFileCase{
		{"secret", LoadOrCreateSecretKey},
		{"ecdsa", func(path string) ([]byte, error) {
			key, err := LoadOrCreateECDSAKey(path)
			if err != nil {
				return nil, err
			}
			return key.Bytes()
		}},
	}
}

func TestLoadOrCreateKeyFile(t *testing.T) {
	for _, tc := range keyFileCases() {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "key")
			first, err := tc.load(path)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if mode := fi.Mode(); mode != 0o600 {
				t.Errorf("mode %v, want 0600", mode)
			}
			second, err := tc.load(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(first) != string(second) {
				t.Fatal("second load returned a different key")
			}
			assertOnlyFile(t, dir, "key")

			// A fresh file gives a fresh key.
			other, err := tc.load(filepath.Join(dir, "other"))
			if err != nil {
				t.Fatal(err)
			}
			if string(other) == string(first) {
				t.Fatal("two key files hold the same key")
			}
		})
	}
}

func TestLoadOrCreateSecretKeyFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret.key")
	key, err := LoadOrCreateSecretKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(key) != 32 {
		t.Fatalf("key length %d, want 32", len(key))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 65 || data[64] != '\n' {
		t.Fatalf("file content %q, want 64 hex digits and a newline", data)
	}
	if _, err := NewSecretBox(key); err != nil {
		t.Fatalf("key unusable for SecretBox: %v", err)
	}
}

func TestLoadOrCreateECDSAKeyFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.pem")
	key, err := LoadOrCreateECDSAKey(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), "-----BEGIN PRIVATE KEY-----\n") {
		t.Fatalf("file is not PKCS#8 PEM:\n%s", data)
	}
	parsed, err := ParsePrivateKeyPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	if !parsed.Equal(key) {
		t.Fatal("file holds a different key")
	}
}

func TestLoadOrCreateCorrupt(t *testing.T) {
	tests := []struct {
		name    string
		content string
	}{
		{"empty", ""},
		{"not hex", strings.Repeat("zz", 32) + "\n"},
		{"too short", strings.Repeat("ab", 31) + "\n"},
		{"too long", strings.Repeat("ab", 33) + "\n"},
		{"PEM garbage", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"},
		{"huge", strings.Repeat("a", 1<<20)},
	}
	for _, kc := range keyFileCases() {
		for _, tt := range tests {
			path := filepath.Join(t.TempDir(), "key")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := kc.load(path)
			if !errors.Is(err, ErrBadKey) {
				t.Errorf("%s/%s: error = %v, want ErrBadKey", kc.name, tt.name, err)
				continue
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("%s/%s: error %q does not name %s", kc.name, tt.name, err, path)
			}
			if data, _ := os.ReadFile(path); string(data) != tt.content {
				t.Errorf("%s/%s: corrupt file was overwritten", kc.name, tt.name)
			}
		}
	}
}

func TestLoadOrCreateMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "dir", "key")
	if _, err := LoadOrCreateSecretKey(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("error = %v, want one naming %s", err, path)
	}
}

func TestLoadOrCreateConcurrent(t *testing.T) {
	for _, tc := range keyFileCases() {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "key")
			const n = 16
			keys := make([][]byte, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { keys[i], errs[i] = tc.load(path) })
			}
			wg.Wait()
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("starter %d: %v", i, errs[i])
				}
				if string(keys[i]) != string(keys[0]) {
					t.Fatalf("starter %d got a different key", i)
				}
			}
			assertOnlyFile(t, dir, "key")
		})
	}
}

// assertOnlyFile checks that dir holds the single entry name, i.e. no
// temporary files were left behind.
func assertOnlyFile(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != name {
			t.Errorf("unexpected file %s left in directory", e.Name())
		}
	}
}
