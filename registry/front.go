package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"

	"github.com/ferry-edge/ferry/bundle"
)

// Stats counts what the registry served. Every request arrives over TLS
// (the listener only speaks TLS); TLS counts the requests whose handshake
// completed, so a test can check TLS == Requests.
type Stats struct {
	Requests int64
	TLS      int64
	// Manifests and Blobs count GET and HEAD requests answered 2xx.
	Manifests int64
	Blobs     int64
	// Refused counts requests other than GET and HEAD (pushes, deletes).
	Refused int64
	// Failed counts answers 4xx and 5xx (unknown manifests among them).
	Failed int64
	// ByRepo counts manifests served per repository path.
	ByRepo map[string]int64
	// UserAgents counts manifest requests per User-Agent product
	// (the part before the first '/', e.g. "cri-o").
	UserAgents map[string]int64
}

type counter struct {
	mu sync.Mutex
	s  Stats
}

func newCounter() *counter {
	return &counter{s: Stats{ByRepo: map[string]int64{}, UserAgents: map[string]int64{}}}
}

func (c *counter) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s
	s.ByRepo = make(map[string]int64, len(c.s.ByRepo))
	for k, v := range c.s.ByRepo {
		s.ByRepo[k] = v
	}
	s.UserAgents = make(map[string]int64, len(c.s.UserAgents))
	for k, v := range c.s.UserAgents {
		s.UserAgents[k] = v
	}
	return s
}

// routeRE splits /v2/<name>/(manifests|blobs)/<reference>.
var routeRE = regexp.MustCompile(`^/v2/(.+)/(manifests|blobs)/([^/]+)$`)

// nameRE finds the repository of every request that names one.
var nameRE = regexp.MustCompile(`^/v2/(.+)/(?:manifests|blobs|tags|referrers)/`)

// front is the handler in front of distribution: it refuses writes,
// answers only for the repositories and tags the bundle lists, maps those
// tags to their digests, serves blobs from their files and counts
// requests.
type front struct {
	next   http.Handler
	blobs  blobFiles
	stats  *counter
	served func(n int64)
	listed listed
	log    *slog.Logger
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	var repo, kind, ref string
	var unknown error
	if m := nameRE.FindStringSubmatch(r.URL.Path); m != nil && !f.listed.repos[m[1]] {
		unknown = errcode.ErrorCodeNameUnknown.WithDetail(distribution.ErrRepositoryUnknown{Name: m[1]})
	}
	if m := routeRE.FindStringSubmatch(r.URL.Path); m != nil {
		repo, kind, ref = m[1], m[2], m[3]
		// A tag the bundle kept is served as the digest it was resolved
		// to when the bundle was made, whether or not the tree holds the
		// tag: metadata.json is what was verified. A tag it does not list
		// is unknown, whatever the tree holds.
		if kind == "manifests" && !strings.Contains(ref, ":") && unknown == nil {
			if d, ok := f.listed.tags[repo+":"+ref]; ok {
				r = r.Clone(r.Context())
				r.URL.Path = "/v2/" + repo + "/manifests/" + d
				r.URL.RawPath = ""
			} else {
				unknown = errcode.ErrorCodeManifestUnknown.WithDetail(distribution.ErrTagUnknown{Tag: ref})
			}
		}
	}
	readOnly := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch {
	case readOnly && unknown != nil:
		rec.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		errcode.ServeJSON(rec, unknown)
	case readOnly && kind == "blobs" && f.blobs.serve(rec, r, repo, ref):
	case readOnly:
		f.next.ServeHTTP(rec, r)
	default:
		rec.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		http.Error(rec, `{"errors":[{"code":"UNSUPPORTED","message":"ferry's embedded registry is read-only"}]}`, http.StatusMethodNotAllowed)
	}

	if f.served != nil {
		f.served(rec.n)
	}
	c := f.stats
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.Requests++
	if r.TLS != nil && r.TLS.HandshakeComplete {
		c.s.TLS++
	}
	ok := rec.status >= 200 && rec.status < 300
	switch {
	case !readOnly:
		c.s.Refused++
	case rec.status >= 400:
		c.s.Failed++
	case ok && kind == "manifests":
		c.s.Manifests++
		c.s.ByRepo[repo]++
		ua, _, _ := strings.Cut(r.UserAgent(), "/")
		c.s.UserAgents[ua]++
	case ok && kind == "blobs":
		c.s.Blobs++
	}
	if rec.status >= 400 {
		f.log.Debug("registry request failed", "method", r.Method, "path", r.URL.Path, "status", rec.status)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	n      int64 // bytes written
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wrote = true
	n, err := s.ResponseWriter.Write(b)
	s.n += int64(n)
	return n, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// listed is what metadata.json lists: the only repositories and tags
// served.
type listed struct {
	repos map[string]bool   // repository paths
	tags  map[string]string // "<repo path>:<tag>" → "sha256:…"
}

// readListed reads root/metadata.json for the repositories of the release
// and images, and the tags that custom images and signatures are listed
// by ("name:tag@sha256:…").
func readListed(root string) (listed, error) {
	p := filepath.Join(root, bundle.MetadataName)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return listed{}, fmt.Errorf("%w: %s has no %s, which lists what may be served", ErrNotBundle, root, bundle.MetadataName)
	}
	if err != nil {
		return listed{}, fmt.Errorf("registry: %w", err)
	}
	var md struct {
		Release    string   `json:"release"`
		Images     []string `json:"images"`
		Signatures []string `json:"signatures"`
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return listed{}, fmt.Errorf("%w: %s: %v", ErrNotBundle, p, err)
	}
	all := append([]string{md.Release}, md.Images...)
	paths := bundle.RepoPaths(all)
	l := listed{repos: map[string]bool{}, tags: map[string]string{}}
	for _, ref := range append(all, md.Signatures...) {
		name, tag, digest := bundle.SplitRef(ref)
		path, ok := paths[name]
		if !ok {
			continue // a signature outside the images' repositories
		}
		l.repos[path] = true
		if tag != "" && digest != "" {
			l.tags[path+":"+tag] = digest
		}
	}
	return l, nil
}
