package peer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"time"
)

// Build is the ferry build a node runs, offered to its peers so that a
// node whose installer asks (ferry-install --peers) can install it: one
// plug updates every node. The offer is only a digest and the bytes; a
// node installs them only if its own trust list names that digest, so
// nothing here is trusted by anyone.
type Build struct {
	Offer BuildOffer
	file  *os.File
}

// BuildOffer is what GET /v1/ferry says, in one flat JSON object (the
// installer is a shell script and reads it without a JSON parser).
type BuildOffer struct {
	// Arch is what `uname -m` prints on a node that runs it: the stick's
	// ferry-<arch> name.
	Arch string `json:"arch"`
	// SHA256 is the build's digest, hex: the one name it is fetched and
	// trusted by.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Version is what the build says of itself: a peer's word, good for
	// choosing which offer to fetch first, never for trusting one.
	Version string `json:"version"`
}

// UnameArch is `uname -m` for a Go architecture ("" for one ferry is
// not built for).
func UnameArch(goarch string) string {
	return map[string]string{"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x"}[goarch]
}

// OpenBuild opens the executable at path (the running one:
// /proc/self/exe) and hashes it. The file stays open: the installer
// replaces ferry by a rename, never in place, so these bytes stay the
// ones hashed for as long as this process serves them.
func OpenBuild(path, version string) (*Build, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("offer this node's ferry build: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("offer this node's ferry build: read %s: %w", path, err)
	}
	return &Build{file: f, Offer: BuildOffer{Arch: UnameArch(runtime.GOARCH), SHA256: hex.EncodeToString(h.Sum(nil)), Size: n, Version: version}}, nil
}

// Close closes the build's file.
func (b *Build) Close() error { return b.file.Close() }

// routes adds GET /v1/ferry (the offer) and GET /v1/ferry/{sha256} (its
// bytes) to mux, behind the server's own authentication.
func (b *Build) routes(s *Server) {
	s.mux.HandleFunc("GET /v1/ferry", func(w http.ResponseWriter, r *http.Request) { s.writeJSON(w, r, b.Offer) })
	s.mux.HandleFunc("GET /v1/ferry/{sha256}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("sha256") != b.Offer.SHA256 {
			http.Error(w, "this node runs ferry sha256 "+b.Offer.SHA256+", not that build: ask GET /v1/ferry", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(b.Offer.Size, 10))
		// The write deadline moves on with each chunk: a slow fetcher of
		// tens of MiB is not cut off, a stalled one is.
		rc := http.NewResponseController(w)
		buf := make([]byte, 256<<10)
		for off := int64(0); off < b.Offer.Size; {
			n, err := b.file.ReadAt(buf[:min(int64(len(buf)), b.Offer.Size-off)], off)
			if n == 0 && err != nil {
				s.opts.Log.Warn("serving this node's ferry build", "err", err)
				return
			}
			_ = rc.SetWriteDeadline(time.Now().Add(s.opts.IdleWrite))
			if _, err := w.Write(buf[:n]); err != nil {
				return
			}
			off += int64(n)
		}
	})
}
