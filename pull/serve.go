package pull

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/reference"

	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// The pulling node serves its work tree to the other nodes while it
// pulls (Handler, on the peer server behind the peers' authentication):
// a read-only, content-addressed registry of exactly what the pull
// resolved, each blob once it lies verified in the tree, and the
// release's signatures as a signature store. A follower (Request.From)
// makes the same bundle from it, as it arrives.
//
//	GET /v2/                                   200: a registry
//	GET /v2/<name>/manifests/<digest|tag>      a manifest the pull resolved
//	GET /v2/<name>/blobs/<digest>              a blob (or manifest) of the pull
//	GET /v2/<name>/referrers/<digest>          404: the tag schema serves them
//	GET /v1/pull/signatures/sha256=<hex>/signature-<n>
//
// What the pull has not resolved or fetched yet is waited for, at most
// Options.ShareWait; a request that finds no pull under way, or waits longer, is
// 503 with Retry-After, so the follower asks again.

// SignaturePath is where Handler serves the release signatures, as a
// signature store (create.FetchSignatures) does.
const SignaturePath = "/v1/pull/signatures"

var (
	nameRE = regexp.MustCompile(`^(?:` + reference.NameRegexp.String() + `)$`)
	tagRE  = regexp.MustCompile(`^(?:` + reference.TagRegexp.String() + `)$`)
)

// shared is the pull under way as the other nodes see it; it is the
// run's create.Sharer.
type shared struct {
	bound time.Duration // of one request's wait
	stall time.Duration // a response that sends nothing for this long is cut
	mu    sync.Mutex
	// inflight are the requests let in while the run (gen) was served;
	// each run has its own, so that one run's slow follower never holds
	// the next.
	inflight *sync.WaitGroup
	gen      int
	waiting  int // requests waiting for blobs
	running  bool
	res      *create.Resolution
	have     map[digest.Digest]bool
	changed  chan struct{} // closed at each change, then replaced
	served   atomic.Int64  // bytes sent to followers
	// resolved, when set, is told each run's resolution (the puller's
	// status shows the extras' digests).
	resolved func(*create.Resolution)
}

func newShared(bound, stall time.Duration) *shared {
	return &shared{bound: bound, stall: stall, inflight: new(sync.WaitGroup), changed: make(chan struct{})}
}

// update changes the state under the lock and wakes the waiters.
func (s *shared) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// begin and end bracket a run whose work tree is served.
func (s *shared) begin() {
	s.update(func() {
		s.running, s.res, s.have = true, nil, map[digest.Digest]bool{}
		s.gen++
		s.inflight = new(sync.WaitGroup)
	})
}

// end stops letting requests in and returns at once: the pull is
// delivered whatever its followers do. The requests already let in are
// answered from the run's tree (a follower waiting for the last blob gets
// it); once they are (a stalled one is cut after stall), the tree is
// forgotten and, when remove is not "", removed, unless another run
// began meanwhile (it may reuse the tree).
func (s *shared) end(remove string) {
	var wg *sync.WaitGroup
	var gen int
	s.update(func() { s.running, wg, gen = false, s.inflight, s.gen })
	go func() {
		wg.Wait()
		s.mu.Lock()
		if s.gen == gen && !s.running {
			s.res, s.have = nil, nil
			if remove != "" {
				os.RemoveAll(remove)
			}
		}
		s.mu.Unlock()
	}()
}

// enter lets a request in while a run is served; the caller calls Done
// on the group it returns.
func (s *shared) enter() *sync.WaitGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	s.inflight.Add(1)
	return s.inflight
}

func (s *shared) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

func (s *shared) Resolved(r *create.Resolution) {
	s.update(func() { s.res = r })
	if s.resolved != nil {
		s.resolved(r)
	}
}

func (s *shared) Arrived(d digest.Digest) {
	s.update(func() {
		if s.have != nil {
			s.have[d] = true
		}
	})
}

// wait returns the run's resolution once ready says what it needs is
// there, or nil: the run ended without it, ctx ended, or the bound
// passed. A run that ends has resolved and fetched all it holds.
func (s *shared) wait(ctx context.Context, ready func(*create.Resolution, map[digest.Digest]bool) bool) *create.Resolution {
	t := time.NewTimer(s.bound)
	defer t.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting++
	defer func() { s.waiting-- }()
	for {
		if s.res != nil && ready(s.res, s.have) {
			return s.res
		}
		if !s.running {
			return nil
		}
		ch := s.changed
		s.mu.Unlock()
		expired := false
		select {
		case <-ch:
		case <-ctx.Done():
			expired = true
		case <-t.C:
			expired = true
		}
		s.mu.Lock()
		if expired {
			return nil
		}
	}
}

func resolved(*create.Resolution, map[digest.Digest]bool) bool { return true }

// Handler serves the pull under way to the other nodes (see above).
func (p *Puller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		w.Write([]byte("{}"))
	})
	mux.HandleFunc("GET /v2/", p.shared.serving(p.shared.registry))
	mux.HandleFunc("GET "+SignaturePath+"/{release}/{file}", p.shared.serving(p.shared.signature))
	return mux
}

// serving lets h answer while a run is served: the run's tree stays
// until it has.
func (s *shared) serving(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		wg := s.enter()
		if wg == nil {
			unavailable(w)
			return
		}
		defer wg.Done()
		h(w, r)
	}
}

// registry routes /v2/<name>/<kind>/<ref>: the name may hold slashes.
func (s *shared) registry(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/v2/")
	i := strings.LastIndexByte(rest, '/')
	j := strings.LastIndexByte(rest[:max(i, 0)], '/')
	if i < 0 || j < 0 || !nameRE.MatchString(rest[:j]) {
		http.Error(w, "not a repository this node serves", http.StatusNotFound)
		return
	}
	name, kind, ref := rest[:j], rest[j+1:i], rest[i+1:]
	switch kind {
	case "manifests":
		s.manifest(w, r, name, ref)
	case "blobs":
		s.blob(w, r, ref)
	default: // referrers among them: the follower falls back to the tag schema
		http.Error(w, "not served here", http.StatusNotFound)
	}
}

func unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "5")
	http.Error(w, "this node's pull does not hold it yet: ask again", http.StatusServiceUnavailable)
}

// manifest answers a manifest by digest or, once the pull resolved its
// tags, by tag: every follower gets the digest the puller got.
func (s *shared) manifest(w http.ResponseWriter, r *http.Request, name, ref string) {
	if !sha256digest.Valid(ref) && !tagRE.MatchString(ref) {
		http.Error(w, "not a digest or tag", http.StatusNotFound)
		return
	}
	res := s.wait(r.Context(), resolved)
	if res == nil {
		unavailable(w)
		return
	}
	d := digest.Digest(ref)
	if !sha256digest.Valid(ref) {
		d = res.Tags[name+":"+ref]
	}
	m, ok := res.Manifests[d]
	if !ok {
		http.Error(w, "not in this node's pull", http.StatusNotFound)
		return
	}
	s.send(w, m.MediaType, d, m.Body)
}

func (s *shared) send(w http.ResponseWriter, mediaType string, d digest.Digest, body []byte) {
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", d.String())
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	s.paced(w).Write(body)
}

// paced is w as a response to a follower is written: in pieces, each
// of which must leave within stall, counted as served. A follower that
// stops reading is cut off, never holding the pull's tree or the
// serving goroutine for longer.
func (s *shared) paced(w http.ResponseWriter) io.Writer {
	return pacedWriter{w: w, rc: http.NewResponseController(w), stall: s.stall, n: &s.served}
}

// blob answers a blob of the pull once it lies verified in the work
// tree: the path is made of a checked digest the pull resolved, never of
// the request's bytes, and partial downloads lie elsewhere.
func (s *shared) blob(w http.ResponseWriter, r *http.Request, ref string) {
	if !sha256digest.Valid(ref) {
		http.Error(w, "not a digest", http.StatusNotFound)
		return
	}
	d := digest.Digest(ref)
	res := s.wait(r.Context(), func(res *create.Resolution, have map[digest.Digest]bool) bool {
		_, blob := res.Blobs[d]
		return !blob || have[d]
	})
	if res == nil {
		unavailable(w)
		return
	}
	if m, ok := res.Manifests[d]; ok {
		s.send(w, m.MediaType, d, m.Body)
		return
	}
	if _, ok := res.Blobs[d]; !ok {
		http.Error(w, "not in this node's pull", http.StatusNotFound)
		return
	}
	f, err := os.Open(create.BlobPath(res.WorkDir, d))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", d.String())
	http.ServeContent(pacedResponse{w, s.paced(w)}, r, "", time.Time{}, f)
}

// signature serves the release's signature files as the pull got them,
// so that every follower's bundle carries the same.
func (s *shared) signature(w http.ResponseWriter, r *http.Request) {
	hex, ok := strings.CutPrefix(r.PathValue("release"), "sha256=")
	nth, ok2 := strings.CutPrefix(r.PathValue("file"), "signature-")
	n, err := strconv.Atoi(nth)
	if !ok || !ok2 || err != nil || n < 1 || !sha256digest.Valid("sha256:"+hex) {
		http.Error(w, "not a release signature", http.StatusNotFound)
		return
	}
	res := s.wait(r.Context(), resolved)
	switch {
	case res == nil:
		unavailable(w)
	case res.Release.String() != "sha256:"+hex || n > len(res.ReleaseSignatures):
		http.Error(w, "no such signature", http.StatusNotFound)
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		s.paced(w).Write(res.ReleaseSignatures[n-1])
	}
}

// pacedWriter writes to a follower in pieces of pacedPiece, each with
// its own write deadline, and counts what it sent: a minimum rate of a
// piece per stall.
type pacedWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	n     *atomic.Int64
}

const pacedPiece = 64 << 10

func (p pacedWriter) Write(b []byte) (int, error) {
	sent := 0
	for len(b) > 0 {
		k := min(len(b), pacedPiece)
		_ = p.rc.SetWriteDeadline(time.Now().Add(p.stall))
		n, err := p.w.Write(b[:k])
		sent += n
		p.n.Add(int64(n))
		if err != nil {
			return sent, err
		}
		b = b[k:]
	}
	return sent, nil
}

// pacedResponse is a ResponseWriter whose body goes through a
// pacedWriter (http.ServeContent writes to it).
type pacedResponse struct {
	http.ResponseWriter
	body io.Writer
}

func (p pacedResponse) Write(b []byte) (int, error) { return p.body.Write(b) }
