package bundle

import (
	"crypto"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"aead.dev/minisign"
	"golang.org/x/crypto/blake2b"
)

// ErrSignKey marks a signing key that cannot be used.
var ErrSignKey = errors.New("bad signing key")

// LoadSignKey reads a minisign secret key file (as `minisign -G` writes
// it): unencrypted (`minisign -G -W`) or protected by password.
func LoadSignKey(path, password string) (minisign.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return minisign.PrivateKey{}, fmt.Errorf("%w: %v", ErrSignKey, err)
	}
	var key minisign.PrivateKey
	if minisign.IsEncrypted(b) {
		if password == "" {
			return key, fmt.Errorf("%w: %s is password-protected: set FERRY_SIGN_PASSWORD", ErrSignKey, path)
		}
		key, err = minisign.DecryptKey(password, b)
		if err != nil {
			return key, fmt.Errorf("%w: %s: cannot decrypt (wrong password?): %v", ErrSignKey, path, err)
		}
		return key, nil
	}
	if err := key.UnmarshalText(b); err != nil {
		return key, fmt.Errorf("%w: %s is not a minisign secret key: %v", ErrSignKey, path, err)
	}
	return key, nil
}

// NewSignHash returns the hash a minisign prehashed signature covers
// (BLAKE2b-512). Write the file through it, then call SignHash.
func NewSignHash() hash.Hash {
	h, err := blake2b.New512(nil)
	if err != nil {
		panic(err) // only for a bad key size; there is no key
	}
	return h
}

// SignHash returns the .minisig text for a file whose NewSignHash sum is
// sum: a prehashed (HashEdDSA) signature, the form `minisign -V` verifies
// by default.
func SignHash(key minisign.PrivateKey, sum []byte) ([]byte, error) {
	sig, err := key.Sign(nil, sum, crypto.BLAKE2b_512)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSignKey, err)
	}
	return sig, nil
}

// SignReader reads r to its end and returns its .minisig text.
func SignReader(key minisign.PrivateKey, r io.Reader) ([]byte, error) {
	h := NewSignHash()
	if _, err := io.Copy(h, r); err != nil {
		return nil, err
	}
	return SignHash(key, h.Sum(nil))
}
