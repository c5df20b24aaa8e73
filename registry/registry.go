// Package registry serves an extracted bundle (its docker/registry/v2 tree)
// read-only over HTTPS on 127.0.0.1, with distribution's registry embedded
// as an http.Handler; a repository or tag its metadata.json does not list
// is unknown, whatever the tree holds. CRI-O pulls the bundle's images from it through the
// mirrors that package crio writes.
package registry

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the only driver used
	"golang.org/x/net/netutil"

	"github.com/ferry-edge/ferry/internal/atomicfile"
)

var (
	// ErrPortInUse means the port kept from the first start (or configured)
	// is taken by another program.
	ErrPortInUse = errors.New("registry port in use")
	// ErrNotBundle means the directory to serve holds no registry tree.
	ErrNotBundle = errors.New("not an extracted bundle")
)

// Registry is the embedded registry: a TLS listener on 127.0.0.1 bound by
// New and served by Serve.
type Registry struct {
	// Pacer, when set before Serve, paces the blobs served (CRI-O's
	// pulls): a pause per MiB while the node's workloads stall.
	Pacer Pacer
	// MaxConns bounds the connections served at once, set before Serve;
	// 0 is DefaultMaxConns. Those past it wait to be accepted.
	MaxConns int
	// Served, when set before Serve, is told of the bytes of each
	// answer sent (cmd/ferry counts them in metrics).
	Served func(n int64)

	log     *slog.Logger
	ln      net.Listener
	port    int
	cert    tls.Certificate
	certPEM []byte
	stats   *counter

	mu      sync.Mutex
	serving bool
	closed  bool
}

// New prepares the registry kept in stateDir (created 0700 if missing):
// it loads or makes the self-signed certificate (tls.crt, tls.key 0600)
// and binds 127.0.0.1:port. port 0 means the port chosen at first start,
// kept in stateDir/port; the first start listens on a free port and keeps
// it. A kept or given port that another program holds is ErrPortInUse:
// the caller decides whether to retry.
func New(stateDir string, port int, log *slog.Logger) (*Registry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("registry state directory: %w", err)
	}
	cert, certPEM, created, err := loadOrCreateCert(stateDir, time.Now())
	if err != nil {
		return nil, fmt.Errorf("registry certificate in %s: %w", stateDir, err)
	}
	if created {
		log.Info("made a new certificate for the embedded registry", "dir", stateDir)
	}
	kept := false
	if port == 0 {
		if port, err = keptPort(stateDir); err != nil {
			return nil, err
		}
		kept = port != 0
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			how := "set registry.port in the config to a free port"
			if kept {
				how = "stop the program that holds it, or remove " + filepath.Join(stateDir, portFile) + " so that ferry chooses a new port (ferry then rewrites the mirror drop-in)"
			}
			return nil, fmt.Errorf("%w: 127.0.0.1:%d is taken by another program: %s", ErrPortInUse, port, how)
		}
		return nil, fmt.Errorf("registry listen on 127.0.0.1:%d: %w", port, err)
	}
	if port == 0 {
		port = ln.Addr().(*net.TCPAddr).Port
		if err := atomicfile.WriteFile(filepath.Join(stateDir, portFile), []byte(strconv.Itoa(port)+"\n"), 0o644); err != nil {
			ln.Close()
			return nil, fmt.Errorf("keep registry port: %w", err)
		}
		log.Info("embedded registry port chosen", "port", port)
	}
	return &Registry{log: log, ln: ln, port: port, cert: cert, certPEM: certPEM, stats: newCounter()}, nil
}

// DefaultMaxConns is Registry.MaxConns's default: four times the most pull
// workers.
const DefaultMaxConns = 256

// Addr is "127.0.0.1:<port>".
func (r *Registry) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port is the port the registry listens on.
func (r *Registry) Port() int { return r.port }

// CACertPEM is the registry's certificate, which is its own CA: what goes
// into certs.d/127.0.0.1:<port>/ca.crt.
func (r *Registry) CACertPEM() []byte { return append([]byte(nil), r.certPEM...) }

// Stats returns what the registry has served so far.
func (r *Registry) Stats() Stats { return r.stats.snapshot() }

// Close releases the listener of a registry that is not serving.
func (r *Registry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	return r.ln.Close()
}

// Handler is the read-only registry over root (the directory that holds
// docker/registry/v2 and metadata.json) with the request counter: what
// Serve serves, for tests that drive it without TLS. It answers only for
// the repositories and tags metadata.json lists.
func (r *Registry) Handler(ctx context.Context, root string) (http.Handler, func(), error) {
	if fi, err := os.Stat(filepath.Join(root, "docker", "registry", "v2")); err != nil || !fi.IsDir() {
		return nil, nil, fmt.Errorf("%w: %s has no docker/registry/v2 directory", ErrNotBundle, root)
	}
	listed, err := readListed(root)
	if err != nil {
		return nil, nil, err
	}
	stopLogs := forwardDistributionLogs(r.log)
	app, err := newApp(ctx, root)
	if err != nil {
		stopLogs()
		return nil, nil, err
	}
	h := &front{next: app, blobs: blobFiles{root: root, pacer: r.Pacer}, stats: r.stats, served: r.Served, listed: listed, log: r.log}
	return h, func() { app.Shutdown(); stopLogs() }, nil
}

// Serve serves root over HTTPS until ctx ends, then shuts down gracefully.
// It returns nil when ctx ended it.
func (r *Registry) Serve(ctx context.Context, root string) error {
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return errors.New("registry: Serve after Close")
	case r.serving:
		r.mu.Unlock()
		return errors.New("registry: Serve called twice")
	}
	r.serving = true
	r.mu.Unlock()

	h, shutdown, err := r.Handler(ctx, root)
	if err != nil {
		r.Close()
		return err
	}
	defer shutdown()
	// CRI-O's pulls use a few connections each (crio.pull_workers at most
	// 64); a local program opening thousands waits for its turn instead of
	// costing ferry a file descriptor and a goroutine each.
	ln := netutil.LimitListener(r.ln, cmp.Or(r.MaxConns, DefaultMaxConns))
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{r.cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:          slog.NewLogLogger(r.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	r.log.Info("embedded registry serving", "addr", r.Addr(), "root", root)
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		r.Close()
		return fmt.Errorf("registry on %s: %w", r.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return nil
}

// newApp builds distribution's app in Go (no config file, no REGISTRY_*
// environment): filesystem driver at root, read-only, no redis, no
// notifications, no upload purging (which would write into the bundle).
func newApp(ctx context.Context, root string) (app *handlers.App, err error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	cfg := &configuration.Configuration{}
	cfg.Log.Level = "warn"
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.Storage = configuration.Storage{
		"filesystem": configuration.Parameters{"rootdirectory": root},
		"maintenance": configuration.Parameters{
			"uploadpurging": map[any]any{"enabled": false},
			"readonly":      map[any]any{"enabled": true},
		},
		"cache":    configuration.Parameters{"blobdescriptor": "inmemory"},
		"redirect": configuration.Parameters{"disable": true},
	}
	defer func() {
		// NewApp reports bad configuration by panicking.
		if p := recover(); p != nil {
			app, err = nil, fmt.Errorf("embedded registry over %s: %v", root, p)
		}
	}()
	return handlers.NewApp(ctx, cfg), nil
}
