package peer

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Store is what the server needs from the node: the bundles it holds,
// whole or in part. Shelf implements it; so can a fake in tests.
type Store interface {
	// Offers lists every bundle served.
	Offers() []Offer
	// Open gives the tar's bytes; ErrUnknownBundle if not held. Only
	// verified pieces (Have) are ever read from it.
	Open(digest digest.Digest) (io.ReaderAt, int64, error)
	// Pieces is the bundle's piece list; ErrNotReady while it is computed.
	Pieces(digest digest.Digest) (*PieceList, error)
	// Have is the bitmap of verified pieces; ErrNotReady while the piece
	// list is computed (a whole bundle's pieces are then all held).
	Have(digest digest.Digest) (Have, error)
}

// ServerOptions configure NewServer.
type ServerOptions struct {
	// Token, when set, is required as "Authorization: Bearer <token>".
	Token string
	// TLS, when set, serves HTTPS with node identities (NodeTLS): a
	// client is whoever its certificate proves, and no token is asked.
	TLS *tls.Config
	// Closed refuses every request when there is no Token: a node serves
	// its bundles only to the cluster's nodes, never to anyone who can
	// reach the port (the agent's default; `peer.open = true` lifts it).
	Closed bool
	// Status reports this node's status for /v1/status; nil: 404.
	Status func() Status
	// Log receives one line per refused or failed request; nil: discard.
	Log *slog.Logger
	// MaxConns bounds concurrent connections (Serve); 0: 128. A fetcher
	// keeps up to 4 connections to each peer.
	MaxConns int
	// MaxConnsPerClient bounds concurrent connections from one address,
	// so that no one client (authenticated or not) can hold them all:
	// one over it is closed at once. 0: 16.
	MaxConnsPerClient int
	// IdleWrite is how long one write of the tar may block before the
	// connection is dropped; 0: 60s.
	IdleWrite time.Duration
	// Pacer, when set, pauses between the tar's chunks sent while the
	// node's other work stalls (internal/pacing).
	Pacer Pacer
	// HeaderTimeout is how long a client may take to send a request's
	// headers (and, between requests, to start the next); 0: 10s.
	HeaderTimeout time.Duration
	// Pull, when set, serves the registry pull under way to the nodes
	// following it (pull.Puller.Handler): /v2/ and /v1/pull/, behind the
	// same authentication as the bundles.
	Pull http.Handler
	// Metrics, when set, serves /metrics behind the same authentication
	// as the bundles; with TLS, the cluster's monitoring
	// (MetricsReader) reaches it too, and nothing else.
	Metrics http.Handler
	// Served, when set, is told of each tar byte sent to a peer.
	Served func(n int64)
	// Build, when set, offers the ferry build this node runs: GET
	// /v1/ferry and /v1/ferry/{sha256} (build.go), behind the same
	// authentication.
	Build *Build
}

// Server is the read-only peer HTTP handler. See the package comment for
// its routes.
type Server struct {
	store Store
	opts  ServerOptions
	token [32]byte
	mux   *http.ServeMux
	first firstCopies
}

// NewServer serves store.
func NewServer(store Store, opts ServerOptions) *Server {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 128
	}
	if opts.MaxConnsPerClient <= 0 {
		opts.MaxConnsPerClient = 16
	}
	if opts.HeaderTimeout <= 0 {
		opts.HeaderTimeout = 10 * time.Second
	}
	if opts.IdleWrite <= 0 {
		opts.IdleWrite = 60 * time.Second
	}
	s := &Server{store: store, opts: opts, token: sha256.Sum256([]byte(opts.Token)), mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /v1/bundles", s.list)
	s.mux.HandleFunc("GET /v1/bundles/{digest}/metadata", s.bundle(s.metadata))
	s.mux.HandleFunc("GET /v1/bundles/{digest}/pieces", s.bundle(s.pieces))
	s.mux.HandleFunc("GET /v1/bundles/{digest}/have", s.bundle(s.have))
	s.mux.HandleFunc("GET /v1/bundles/{digest}/tar", s.bundle(s.tar))
	s.mux.HandleFunc("GET /v1/status", s.status)
	if opts.Pull != nil {
		s.mux.Handle("GET /v2/", opts.Pull)
		s.mux.Handle("GET /v1/pull/", opts.Pull)
	}
	if opts.Metrics != nil {
		s.mux.Handle("GET /metrics", opts.Metrics)
	}
	if opts.Build != nil {
		opts.Build.routes(s)
	}
	return s
}

// ServeHTTP checks the token, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every response is bounded; one that streams (a tar's range, the
	// pull's blobs) moves the deadline on as each piece leaves.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.opts.IdleWrite))
	if s.opts.TLS != nil {
		// The handshake checked the certificate; this only makes sure
		// no request comes in any other way.
		if s.opts.Metrics != nil && r.URL.Path == "/metrics" && MetricsReader(r) {
			s.opts.Metrics.ServeHTTP(w, r)
			return
		}
		if PeerNode(r) == "" {
			s.opts.Log.Warn("peer request refused: no node certificate", "remote", r.RemoteAddr, "path", r.URL.Path)
			http.Error(w, "this node serves bundles only to the cluster's nodes, over TLS with their kubelet certificates", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		s.mux.ServeHTTP(w, r)
		return
	}
	if s.opts.Token == "" && s.opts.Closed {
		s.opts.Log.Warn("peer request refused: this node has no peer token", "remote", r.RemoteAddr, "path", r.URL.Path)
		w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
		http.Error(w, "this node serves no bundle without a peer token: set the same peer.token_file on every node (or peer.open = true)", http.StatusUnauthorized)
		return
	}
	if s.opts.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
			s.opts.Log.Warn("peer request refused: wrong or missing token", "remote", r.RemoteAddr, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
			http.Error(w, "wrong or missing bearer token: set the same token_file on every node", http.StatusUnauthorized)
			return
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// Serve accepts connections on ln (at most MaxConns at once) until ctx
// ends, then shuts down, giving requests in flight 5s.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.opts.HeaderTimeout,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       max(s.opts.HeaderTimeout, 30*time.Second),
		ErrorLog:          slog.NewLogLogger(s.opts.Log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if hs.Shutdown(sctx) != nil {
				hs.Close()
			}
		case <-done:
		}
	}()
	var l net.Listener = netutil.LimitListener(&perClientListener{Listener: ln, max: s.opts.MaxConnsPerClient, n: map[string]int{}, log: s.opts.Log}, s.opts.MaxConns)
	if s.opts.TLS != nil {
		// The handshake runs in the connection's own goroutine, bounded
		// by ReadHeaderTimeout (net/http sets it for a *tls.Conn).
		l = tls.NewListener(l, s.opts.TLS)
	}
	err := hs.Serve(l)
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ListenAndServe listens on addr (host:port) and serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("peer server: listen on %s: %w (check peer.listen in the config)", addr, err)
	}
	return s.Serve(ctx, ln)
}

func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.opts.IdleWrite))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	offers := s.store.Offers()
	if offers == nil {
		offers = []Offer{}
	}
	s.writeJSON(w, r, offers)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	if s.opts.Status == nil {
		http.Error(w, "this node reports no status", http.StatusNotFound)
		return
	}
	s.writeJSON(w, r, s.opts.Status())
}

// bundle validates the digest in the path against the held bundles before
// h sees it: nothing from the path goes further than a map lookup.
func (s *Server) bundle(h func(http.ResponseWriter, *http.Request, Offer)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d, err := sha256digest.Parse(r.PathValue("digest"))
		if err != nil {
			http.Error(w, "not a bundle digest (sha256:<64 lowercase hex>)", http.StatusBadRequest)
			return
		}
		for _, o := range s.store.Offers() {
			if o.Digest == d {
				h(w, r, o)
				return
			}
		}
		http.Error(w, "bundle not held here", http.StatusNotFound)
	}
}

func (s *Server) metadata(w http.ResponseWriter, r *http.Request, o Offer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(o.Metadata)))
	_, _ = w.Write(o.Metadata)
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrNotReady) {
		w.Header().Set("Retry-After", "2")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if errors.Is(err, ErrUnknownBundle) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	s.opts.Log.Error("peer request failed", "path", r.URL.Path, "err", err)
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func (s *Server) pieces(w http.ResponseWriter, r *http.Request, o Offer) {
	p, err := s.store.Pieces(o.Digest)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.writeJSON(w, r, p)
}

func (s *Server) have(w http.ResponseWriter, r *http.Request, o Offer) {
	h, err := s.store.Have(o.Digest)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.writeJSON(w, r, h)
}

// tar serves the whole tar (200) or one range of it (206). Of a bundle
// still being received, only ranges lying inside verified pieces are
// served; anything else, a list of ranges included, is 416.
func (s *Server) tar(w http.ResponseWriter, r *http.Request, o Offer) {
	ra, size, err := s.store.Open(o.Digest)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	start, n := int64(0), size
	status := http.StatusOK
	if h := r.Header.Get("Range"); h != "" {
		if start, n, err = ParseRange(h, size); err != nil {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
			return
		}
		status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, start+n-1, size))
	}
	if !o.Complete {
		if err := s.verified(o.Digest, start, n); err != nil {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
			return
		}
	}
	if r.Header.Get(FirstCopyHeader) != "" && (o.Complete || s.live(o.Digest)) {
		if i, ok := s.wholePiece(o.Digest, start, n); ok {
			if !s.first.begin(o.Digest, i, time.Now()) {
				http.Error(w, fmt.Sprintf("piece %d is on its way to another fetcher: get it from that peer", i), http.StatusConflict)
				return
			}
			whole := false
			defer func() { s.first.end(o.Digest, i, whole, time.Now()) }() // also when copyRange panics
			whole = s.copyRange(w, r, o, ra, start, n, status)
			return
		}
	}
	s.copyRange(w, r, o, ra, start, n, status)
}

// live reports whether digest is offered while its source reads it: a
// source like a node holding it whole, whose uplink should carry each
// piece once.
func (s *Server) live(digest digest.Digest) bool {
	h, err := s.store.Have(digest)
	return err == nil && h.Live
}

// wholePiece is the index of the piece that [start, start+n) is exactly.
func (s *Server) wholePiece(digest digest.Digest, start, n int64) (int, bool) {
	p, err := s.store.Pieces(digest)
	if err != nil || p.PieceSize <= 0 || start%p.PieceSize != 0 {
		return 0, false
	}
	i := int(start / p.PieceSize)
	if i >= p.N() {
		return 0, false
	}
	if _, pn := p.Bounds(i); pn != n {
		return 0, false
	}
	return i, true
}

// copyRange sends [start, start+n) of ra; true once every byte is written.
func (s *Server) copyRange(w http.ResponseWriter, r *http.Request, o Offer, ra io.ReaderAt, start, n int64, status int) bool {
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Accept-Ranges", "bytes")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	buf := make([]byte, 256<<10)
	for off, end := start, start+n; off < end; {
		k := min(int64(len(buf)), end-off)
		m, err := ra.ReadAt(buf[:k], off)
		if int64(m) < k && err == nil {
			err = io.ErrUnexpectedEOF
		}
		if m > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(s.opts.IdleWrite))
			if _, werr := w.Write(buf[:m]); werr != nil {
				s.opts.Log.Debug("peer tar write stopped", "remote", r.RemoteAddr, "digest", o.Digest, "err", werr)
				return false
			}
			if s.opts.Served != nil {
				s.opts.Served(int64(m))
			}
			if s.opts.Pacer != nil && s.opts.Pacer.Pace(r.Context(), m) != nil {
				return false
			}
		}
		if err != nil && int64(m) < k {
			s.opts.Log.Error("peer tar read failed", "digest", o.Digest, "offset", off+int64(m), "err", err)
			panic(http.ErrAbortHandler) // the client sees a short body, not a wrong one
		}
		off += int64(m)
	}
	return true
}

func (s *Server) verified(digest digest.Digest, start, n int64) error {
	p, err := s.store.Pieces(digest)
	if err != nil {
		return err
	}
	h, err := s.store.Have(digest)
	if err != nil {
		return err
	}
	for i := int(start / p.PieceSize); int64(i)*p.PieceSize < start+n; i++ {
		if !h.Has(i) {
			return fmt.Errorf("%w: piece %d is not held here yet", ErrBadRange, i)
		}
	}
	return nil
}

// perClientListener closes, as soon as it is accepted, a connection from
// an address that already holds max: a client that opens connections and
// sends nothing (or drips) keeps only its own share, never the server's
// whole MaxConns. Header and idle deadlines (Serve) end the ones it holds.
type perClientListener struct {
	net.Listener
	max int
	log *slog.Logger

	mu sync.Mutex
	n  map[string]int
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := c.RemoteAddr().String()
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		l.mu.Lock()
		if l.n[host] >= l.max {
			l.mu.Unlock()
			l.log.Debug("peer server: too many connections from one client; closed", "client", host, "max", l.max)
			c.Close()
			continue
		}
		l.n[host]++
		l.mu.Unlock()
		return &countedConn{Conn: c, done: sync.OnceFunc(func() {
			l.mu.Lock()
			if l.n[host]--; l.n[host] <= 0 {
				delete(l.n, host)
			}
			l.mu.Unlock()
		})}, nil
	}
}

// countedConn gives its client's slot back when closed.
type countedConn struct {
	net.Conn
	done func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.done()
	return err
}
