package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// secretKeyLen is the length of the key managed by LoadOrCreateSecretKey,
// suitable for NewSecretBox.
const secretKeyLen = 32

// maxKeyFileSize bounds how much of a key file is read; real key files are
// far smaller, so anything larger is certainly not one of ours.
const maxKeyFileSize = maxPEMSize

// LoadOrCreateSecretKey returns the 32-byte secret key stored at path,
// creating it on first use. The file holds the key hex encoded followed by a
// newline.
//
// If path does not exist, a new random key is written to it atomically and
// durably with mode 0600 (see the package documentation); if another process
// creates the file first, its key is read and returned instead, so concurrent
// starters agree. The parent directory must already exist. An existing file
// that does not hold exactly 32 hex-encoded bytes (surrounding whitespace is
// ignored) yields an error wrapping [ErrBadKey] that names path.
func LoadOrCreateSecretKey(path string) ([]byte, error) {
	return loadOrCreate(path, parseSecretKeyFile, func() ([]byte, error) {
		key := make([]byte, secretKeyLen)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		return []byte(hex.EncodeToString(key) + "\n"), nil
	})
}

// LoadOrCreateECDSAKey returns the P-256 private key stored at path, creating
// it on first use with the same atomicity and durability rules as
// [LoadOrCreateSecretKey]. The file holds the key as a PKCS#8 PEM block (see
// [MarshalPrivateKeyPEM]); an existing file is parsed with the rules of
// [ParsePrivateKeyPEM], and a file that fails them yields an error wrapping
// [ErrBadKey] that names path.
func LoadOrCreateECDSAKey(path string) (*ecdsa.PrivateKey, error) {
	return loadOrCreate(path, parsePrivateKeyPEM, func() ([]byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		return MarshalPrivateKeyPEM(key)
	})
}

// parseSecretKeyFile decodes the content of a secret key file. Its errors
// wrap ErrBadKey and carry no path; loadOrCreate adds it.
func parseSecretKeyFile(data []byte) ([]byte, error) {
	text := bytes.TrimSpace(data)
	if len(text) != 2*secretKeyLen {
		return nil, fmt.Errorf("%w: want %d hex digits, found %d bytes", ErrBadKey, 2*secretKeyLen, len(text))
	}
	key := make([]byte, secretKeyLen)
	if _, err := hex.Decode(key, text); err != nil {
		return nil, fmt.Errorf("%w: not hex: %w", ErrBadKey, err)
	}
	return key, nil
}

// loadOrCreate reads and parses the file at path or, if it does not exist,
// creates it with the content returned by generate and parses that. The
// parse errors are expected to wrap ErrBadKey.
func loadOrCreate[K any](path string, parse func([]byte) (K, error), generate func() ([]byte, error)) (K, error) {
	var zero K
	data, err := readKeyFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		content, genErr := generate()
		if genErr != nil {
			return zero, fmt.Errorf("auth: key file %s: generate: %w", path, genErr)
		}
		created, createErr := createFileAtomic(path, content)
		if createErr != nil {
			return zero, fmt.Errorf("auth: key file %s: %w", path, createErr)
		}
		if created {
			data, err = content, nil
		} else {
			// Someone else won the race; use their key.
			data, err = readKeyFile(path)
		}
	}
	if err != nil {
		return zero, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	key, err := parse(data)
	if err != nil {
		return zero, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	return key, nil
}

// readKeyFile reads at most maxKeyFileSize bytes of the file at path and
// fails if the file is larger. A missing file gives an error matching
// fs.ErrNotExist.
func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxKeyFileSize {
		return nil, fmt.Errorf("%w: file is larger than %d bytes", ErrBadKey, maxKeyFileSize)
	}
	return data, nil
}

// createFileAtomic creates path with the given content and mode 0600 such
// that path, once it exists, always has the complete content, even across a
// crash. The content goes to a temporary file in the same directory, which
// is fsynced and then hard-linked to path; linking fails if path already
// exists, in which case createFileAtomic reports created == false and no
// error. Finally the temporary name is removed and the directory fsynced so
// that the new entry is durable.
func createFileAtomic(path string, content []byte) (created bool, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// os.CreateTemp opens with O_CREATE|O_EXCL and mode 0600.
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return false, err
	}
	tmpName := tmp.Name()
	defer func() {
		// The temporary name is never needed past this point: on success
		// path is the file's durable name, on failure it is garbage.
		if rmErr := os.Remove(tmpName); rmErr != nil && err == nil && !errors.Is(rmErr, fs.ErrNotExist) {
			created, err = false, rmErr
		}
	}()

	if err := writeAndSync(tmp, content); err != nil {
		return false, err
	}
	if err := os.Link(tmpName, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	// Remove the temporary name before syncing the directory so that one
	// fsync makes both the new name and the removal durable.
	if err := os.Remove(tmpName); err != nil {
		return false, err
	}
	if err := syncDir(dir); err != nil {
		return false, err
	}
	return true, nil
}

// writeAndSync writes content to f, forces the mode to 0600 regardless of
// umask, fsyncs the file and closes it.
func writeAndSync(f *os.File, content []byte) error {
	_, err := f.Write(content)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// syncDir fsyncs the directory dir so that entries created or removed in it
// survive a crash. It is internal/vfsutil.SyncDir on the OS directly: auth
// is imported by the client SDK, which should not pull in pebble's vfs.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if closeErr := d.Close(); err == nil {
		err = closeErr
	}
	return err
}
