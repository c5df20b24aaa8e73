package bundle

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"aead.dev/minisign"
	"golang.org/x/crypto/blake2b"
	"golang.org/x/crypto/scrypt"
)

// encryptKeyCheaply password-protects an unencrypted minisign secret key
// the way minisign does, with the smallest scrypt cost (minisign.EncryptKey
// uses libsodium's "sensitive" cost: seconds per decryption).
func encryptKeyCheaply(t *testing.T, password string, plain []byte) []byte {
	t.Helper()
	_, b64, _ := strings.Cut(string(plain), "\n")
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil || len(b) != 158 {
		t.Fatalf("unexpected key format: %v", err)
	}
	const ops, mem = 1 << 15, 1 << 24 // → scrypt N=1024, r=8, p=1
	binary.LittleEndian.PutUint16(b[2:], 0x6353)
	rand.Read(b[6:38])
	binary.LittleEndian.PutUint64(b[38:], ops)
	binary.LittleEndian.PutUint64(b[46:], mem)
	msg := make([]byte, 74)
	binary.LittleEndian.PutUint16(msg, minisign.EdDSA)
	copy(msg[2:], b[54:126])
	sum := blake2b.Sum256(msg)
	copy(b[126:], sum[:])
	stream, err := scrypt.Key([]byte(password), b[6:38], 1024, 8, 1, 104)
	if err != nil {
		t.Fatal(err)
	}
	for i := range stream {
		b[54+i] ^= stream[i]
	}
	return []byte("untrusted comment: minisign encrypted secret key\n" + base64.StdEncoding.EncodeToString(b) + "\n")
}

func TestSign_LoadsKeysAndSignsPrehashed(t *testing.T) {
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	plain, _ := priv.MarshalText()
	enc := encryptKeyCheaply(t, "s3cret", plain)
	plainPath, encPath := filepath.Join(dir, "plain.key"), filepath.Join(dir, "enc.key")
	os.WriteFile(plainPath, plain, 0o600)
	os.WriteFile(encPath, enc, 0o600)

	msg := bytes.Repeat([]byte("bundle "), 10000)
	for _, tc := range []struct{ path, password string }{{plainPath, ""}, {encPath, "s3cret"}} {
		key, err := LoadSignKey(tc.path, tc.password)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		sig, err := SignReader(key, bytes.NewReader(msg))
		if err != nil {
			t.Fatal(err)
		}
		if !minisign.Verify(pub, msg, sig) {
			t.Fatalf("%s: signature does not verify", tc.path)
		}
		if minisign.Verify(pub, append(msg, 'x'), sig) {
			t.Fatal("signature verifies another message")
		}
	}
	for _, tc := range []struct{ name, path, password string }{
		{"encrypted without password", encPath, ""},
		{"wrong password", encPath, "nope"},
		{"missing file", filepath.Join(dir, "none"), ""},
	} {
		if _, err := LoadSignKey(tc.path, tc.password); !errors.Is(err, ErrSignKey) {
			t.Errorf("%s: got %v, want ErrSignKey", tc.name, err)
		}
	}
}
