// Package localapi is the agent's API on its node: a unix socket, root's
// only, that ferry status, load, cleanup and proceed talk to. ferry load
// passes the bundle as open files (SCM_RIGHTS), never a path.
package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/pull"
)

// Agent is the running agent as the local API serves it (*agent.Agent).
type Agent interface {
	Status() agent.Status
	Cluster() agent.ClusterStatus
	// Request asks it to "load" the bundle in m, "cleanup" or "proceed"
	// (m nil); it owns m from then on.
	Request(ctx context.Context, kind string, m agent.Medium) error
	// Pull asks for a release from the site's registry.
	Pull(req pull.Request) error
}

// Serve serves a's local API on a unix socket at path (mode 0600) until
// ctx ends.
func Serve(ctx context.Context, path string, a Agent, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	os.Remove(path)
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("status socket: %w", err)
	}
	l := fdListener{ul}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Status())
	})
	act := func(kind string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var m agent.Medium
			if kind == "load" {
				p, err := passedBundle(r)
				if err != nil {
					log.Warn("ferry load refused", "err", err)
					writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
					return
				}
				m = p
			}
			err := a.Request(r.Context(), kind, m)
			if err != nil {
				writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, a.Status())
		}
	}
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Cluster())
	})
	mux.HandleFunc("POST /v1/proceed", act("proceed"))
	mux.HandleFunc("POST /v1/load", act("load"))
	mux.HandleFunc("POST /v1/cleanup", act("cleanup"))
	mux.HandleFunc("POST /v1/pull", func(w http.ResponseWriter, r *http.Request) {
		// Root only, as for load: the request approves what it pulls.
		c, _ := r.Context().Value(fdConnKey{}).(*fdConn)
		if c == nil {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": ErrNotRoot.Error()})
			return
		}
		if err := c.fromRoot(); err != nil {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": err.Error()})
			return
		}
		q := r.URL.Query()
		req := pull.Request{Release: q.Get("release"), Extras: q["extra"]}
		if err := a.Pull(req); err != nil {
			log.Warn("ferry load --release refused", "err", err)
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, a.Status())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, fdConnKey{}, c)
		}}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	os.Remove(path)
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
