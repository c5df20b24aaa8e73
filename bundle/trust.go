package bundle

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"aead.dev/minisign"
)

// ParseSHA256Line parses a sha256sum line for tarName: 64 lowercase hex
// digits, two spaces (or space and '*'), the file's base name.
func ParseSHA256Line(b []byte, tarName string) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 4096)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			continue
		}
		if len(line) < 67 || (line[64:66] != "  " && line[64:66] != " *") {
			return "", fmt.Errorf("%w: .sha256 line %q is not in sha256sum format (<64 hex>  <name>)", ErrInvalid, truncate(line, 80))
		}
		hex, name := line[:64], line[66:]
		if !isHex64(hex) {
			return "", fmt.Errorf("%w: .sha256 holds %q, not 64 lowercase hex digits", ErrInvalid, truncate(hex, 80))
		}
		if name == tarName {
			return "sha256:" + hex, nil
		}
	}
	return "", fmt.Errorf("%w: .sha256 has no line for %s", ErrInvalid, tarName)
}

// NormalizeDigest accepts "sha256:<hex>" or "<hex>" and returns
// "sha256:<hex>", or "" when s is neither.
func NormalizeDigest(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "sha256:")
	if !isHex64(s) {
		return ""
	}
	return "sha256:" + s
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// LoadTrustedKeys reads minisign public key files.
func LoadTrustedKeys(paths []string) ([]minisign.PublicKey, error) {
	keys := make([]minisign.PublicKey, 0, len(paths))
	for _, p := range paths {
		k, err := minisign.PublicKeyFromFile(p)
		if err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", p, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Source is where a bundle is read from.
type Source struct {
	// Path is the tar file, or a block device holding the raw tar.
	Path string
	// Raw means Path is a device: the tar ends at its end-of-archive
	// marker and whatever follows on the device is ignored.
	Raw bool
	// SHA256Path and SigPath are the sidecar files; "" when absent.
	SHA256Path string
	SigPath    string
	// Label is where the bundle came from when Path does not say it: a
	// descriptor passed by ferry load is read at /proc/self/fd/N, and
	// Label is the path the caller gave.
	Label string
	// Reader, when set, gives the tar's bytes instead of opening Path
	// (a fetch streaming into the extraction: cut-through); Size is
	// their length. Path still names the bundle and its sidecars.
	Reader io.Reader
	Size   int64
}

// Name is the tar's base name, as the technician sees it.
func (s Source) Name() string { return filepath.Base(s.Where()) }

// Where is the path the bundle is known by (Label, else Path).
func (s Source) Where() string {
	if s.Label != "" {
		return s.Label
	}
	return s.Path
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

// maxSigFile bounds a .minisig (a few hundred bytes with its comments).
const maxSigFile = 4 << 10

// readSignature reads a .minisig, bounded: it is passed on to peers.
func readSignature(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSigFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > maxSigFile {
		return nil, fmt.Errorf("%w: %s is over %d bytes: not a minisign signature", ErrInvalid, path, maxSigFile)
	}
	return b, nil
}
