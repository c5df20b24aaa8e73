package bundle

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/safefile"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// ParseSHA256Line parses a sha256sum line for tarName: 64 lowercase hex
// digits, two spaces (or space and '*'), the file's base name.
func ParseSHA256Line(b []byte, tarName string) (digest.Digest, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 4096)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			continue
		}
		if len(line) < 67 || (line[64:66] != "  " && line[64:66] != " *") {
			return "", fmt.Errorf("%w: the .sha256 file for %s is not in sha256sum format (64 lowercase hex digits, two spaces, the tar's name): copy the .sha256 that came with the bundle", ErrInvalid, tarName)
		}
		d, ok := sha256digest.FromHex(line[:64])
		name := line[66:]
		if !ok {
			return "", fmt.Errorf("%w: the .sha256 file for %s holds no digest of 64 lowercase hex digits: copy the .sha256 that came with the bundle", ErrInvalid, tarName)
		}
		if name == tarName {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: the .sha256 file has no line for %s: copy the .sha256 that came with this bundle", ErrInvalid, tarName)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// LoadTrustedKeys reads minisign public key files.
func LoadTrustedKeys(paths []string) ([]TrustedKey, error) {
	keys := make([]TrustedKey, 0, len(paths))
	for _, p := range paths {
		k, err := minisign.PublicKeyFromFile(p)
		if err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", p, err)
		}
		keys = append(keys, TrustKey(k))
	}
	return keys, nil
}

// TrustKey is k as a Policy's trusted key.
func TrustKey(k minisign.PublicKey) TrustedKey {
	text, _ := k.MarshalText() // it fails on no key
	return TrustedKey(text)
}

// publicKeys are a Policy's trusted keys as minisign checks with them;
// one that does not parse (made by hand, not by TrustKey) trusts nothing.
func publicKeys(keys []TrustedKey) []minisign.PublicKey {
	out := make([]minisign.PublicKey, 0, len(keys))
	for _, k := range keys {
		var pk minisign.PublicKey
		if pk.UnmarshalText([]byte(k)) == nil {
			out = append(out, pk)
		}
	}
	return out
}

// FindSource describes path: a block device is raw; for a file, the
// sidecars next to it (upgrade-X.sha256, upgrade-X.tar.minisig) are found.
// An explicit sha256 path overrides the lookup.
func FindSource(path, sha256Path string) (Source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Source{}, fmt.Errorf("bundle %s: %w", path, err)
	}
	src := Source{Path: path, SHA256Path: sha256Path}
	if fi.Mode()&os.ModeDevice != 0 {
		src.Raw = true
		return src, nil
	}
	if !fi.Mode().IsRegular() {
		return Source{}, fmt.Errorf("bundle %s: not a file or block device", path)
	}
	base := strings.TrimSuffix(path, ".tar")
	if src.SHA256Path == "" {
		if _, err := os.Stat(base + ".sha256"); err == nil {
			src.SHA256Path = base + ".sha256"
		}
	}
	if _, err := os.Stat(path + ".minisig"); err == nil {
		src.SigPath = path + ".minisig"
	}
	return src, nil
}

// MaxSidecar bounds a .sha256 or .minisig (a line, or a few hundred
// bytes with its comments): a bigger one, or one that is no regular file
// (a FIFO, /dev/zero), is refused rather than read; a .minisig is passed
// on to peers.
const MaxSidecar = 4 << 10

// ReadSidecar reads the .sha256 or .minisig at path, bounded (see
// MaxSidecar). what names it in errors ("the .sha256 of upgrade-…tar"),
// which never hold its bytes.
func ReadSidecar(path, what string) ([]byte, error) {
	b, err := safefile.ReadFile(path, MaxSidecar)
	switch {
	case errors.Is(err, safefile.ErrTooBig):
		return nil, fmt.Errorf("%w: %s is over %d bytes: it is not what ferry writes there; copy the one that came with the bundle", ErrInvalid, what, MaxSidecar)
	case errors.Is(err, safefile.ErrNotRegular):
		return nil, fmt.Errorf("%w: %s is not a regular file: copy the file itself, not a link to it", ErrInvalid, what)
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", what, errors.Unwrap(err))
	}
	return b, nil
}

// ReadSignature reads the .minisig at path (see ReadSidecar) and checks
// that it is a minisign signature: only one is kept, verified or passed on
// to peers, never whatever file a link or a mistake put there.
func ReadSignature(path, what string) ([]byte, error) {
	b, err := ReadSidecar(path, what)
	if err != nil {
		return nil, err
	}
	return b, CheckSignature(b, what)
}

// CheckSignature refuses (ErrInvalid) a .minisig that does not parse as a
// minisign signature. what names it, as in ReadSidecar; the message never
// holds its bytes.
func CheckSignature(b []byte, what string) error {
	var s minisign.Signature
	if err := s.UnmarshalText(b); err != nil {
		return fmt.Errorf("%w: %s is not a minisign signature: remove it, or copy the .tar.minisig that came with the bundle", ErrInvalid, what)
	}
	return nil
}

// sha256What and sigWhat name a source's sidecars in messages.
func sha256What(s Source) string {
	return "the .sha256 file of " + s.Name()
}

func sigWhat(s Source) string {
	return "the .minisig file of " + s.Name()
}
