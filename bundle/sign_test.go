package bundle

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"aead.dev/minisign"
)

func TestSign_LoadsKeysAndSignsPrehashed(t *testing.T) {
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	plain, _ := priv.MarshalText()
	enc, err := minisign.EncryptKey("s3cret", priv)
	if err != nil {
		t.Fatal(err)
	}
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
