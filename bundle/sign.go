package bundle

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"
	"time"

	"aead.dev/minisign"
	"golang.org/x/crypto/blake2b"

	"github.com/ferry-edge/ferry/internal/digest"
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

// SignHash returns the .minisig text for a bundle whose NewSignHash sum is
// sum and whose sha256 is digest: a prehashed (HashEdDSA) signature, the
// form `minisign -V` verifies by default, whose trusted comment names the
// digest (digestComment). A node offered the bundle by a peer checks that
// comment with its trusted keys before it fetches a byte (CommentDigest):
// a signature approves that bundle, not whatever a peer offers with it.
func SignHash(key minisign.PrivateKey, sum []byte, d digest.Digest) ([]byte, error) {
	if len(sum) != blake2b.Size {
		return nil, fmt.Errorf("%w: a signature hash of %d bytes", ErrSignKey, len(sum))
	}
	hex := strings.TrimPrefix(string(NormalizeDigest(string(d))), "sha256:")
	if hex == "" {
		return nil, fmt.Errorf("%w: %q is not a sha256 digest", ErrSignKey, d)
	}
	edKey, err := ed25519Key(key)
	if err != nil {
		return nil, err
	}
	trusted := fmt.Sprintf("timestamp:%d\tsha256:%s", time.Now().Unix(), hex)
	s := minisign.Signature{
		Algorithm:        minisign.HashEdDSA,
		KeyID:            key.ID(),
		TrustedComment:   trusted,
		UntrustedComment: fmt.Sprintf("signature from ferry, key %X", key.ID()),
	}
	msgSig := ed25519.Sign(edKey, sum)
	copy(s.Signature[:], msgSig)
	copy(s.CommentSignature[:], ed25519.Sign(edKey, append(msgSig, trusted...)))
	return s.MarshalText()
}

// ed25519Key is key's Ed25519 private key, from its unencrypted text form
// (minisign's layout: the key ID at byte 54, the key at 62).
func ed25519Key(key minisign.PrivateKey) (ed25519.PrivateKey, error) {
	text, err := key.MarshalText()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSignKey, err)
	}
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	b, err := base64.StdEncoding.DecodeString(lines[len(lines)-1])
	if err != nil || len(b) < 62+ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: cannot read the key's bytes", ErrSignKey)
	}
	return ed25519.PrivateKey(b[62 : 62+ed25519.PrivateKeySize]), nil
}

// SignReader reads r (a bundle's tar) to its end and returns its .minisig
// text, naming its sha256.
func SignReader(key minisign.PrivateKey, r io.Reader) ([]byte, error) {
	h, d := NewSignHash(), sha256.New()
	if _, err := io.Copy(io.MultiWriter(h, d), r); err != nil {
		return nil, err
	}
	return SignHash(key, h.Sum(nil), digest.FromSHA256(d.Sum(nil)))
}

// ErrSignatureDigest: a signature that names no bundle digest, or another.
var ErrSignatureDigest = errors.New("the signature does not name this bundle")

// CommentDigest checks that sig's trusted comment is the signer's (pub's
// comment signature over the signature and the comment: verifiable
// without the bundle's bytes) and returns the digest it names.
func CommentDigest(pub minisign.PublicKey, sig minisign.Signature) (digest.Digest, error) {
	raw, err := publicKeyBytes(pub)
	if err != nil {
		return "", err
	}
	if !ed25519.Verify(raw, append(sig.Signature[:], sig.TrustedComment...), sig.CommentSignature[:]) {
		return "", fmt.Errorf("%w: its trusted comment is not signed by key %X", ErrSignatureDigest, pub.ID())
	}
	for _, f := range strings.Split(sig.TrustedComment, "\t") {
		if hex, ok := strings.CutPrefix(strings.TrimSpace(f), "sha256:"); ok {
			if d := NormalizeDigest(hex); d != "" {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("%w: it names no sha256 (made by an older ferry or by minisign itself): sign the bundle again with this version's ferry bundle create --sign-key", ErrSignatureDigest)
}

// publicKeyBytes is pub's Ed25519 key, from its base64 form ("Ed", the
// key ID, the key).
func publicKeyBytes(pub minisign.PublicKey) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(pub.String())
	if err != nil || len(b) != 2+8+ed25519.PublicKeySize {
		return nil, fmt.Errorf("cannot read public key %X", pub.ID())
	}
	return ed25519.PublicKey(b[10:]), nil
}
