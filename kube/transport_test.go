package kube

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// tokenKubeconfig writes a kubeconfig for server (srv's URL when "")
// that trusts srv's certificate and gives a token, with extra appended to
// its cluster (", tls-server-name: …"); it returns its path.
func tokenKubeconfig(t *testing.T, srv *httptest.Server, server, extra string) string {
	t.Helper()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o600)
	os.WriteFile(filepath.Join(dir, "token"), []byte("t\n"), 0o600)
	if server == "" {
		server = srv.URL
	}
	p := filepath.Join(dir, "kc")
	os.WriteFile(p, []byte(`
clusters: [{name: c, cluster: {server: "`+server+`", certificate-authority: ca.crt`+extra+`}}]
users: [{name: u, user: {tokenFile: token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x`), 0o600)
	return p
}

// newClientFor is a Client made by New, as the agent makes it, for a TLS
// test server (its certificate trusted through the kubeconfig).
func newClientFor(t *testing.T, srv *httptest.Server) *Client {
	t.Helper()
	c, err := New(tokenKubeconfig(t, srv, "", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Backoff = 0
	return c
}

// Every request, watches included, goes over HTTP/2 on one connection,
// as client-go's do; over HTTP/1.1 each open watch holds a connection.
func TestClient_SpeaksHTTP2OnOneConnection(t *testing.T) {
	var mu sync.Mutex
	protos, conns := map[string]int{}, map[string]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos[r.Proto]++
		conns[r.RemoteAddr] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"kind":"Status"}`))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := newClientFor(t, srv)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var v map[string]any
			if err := c.Raw(t.Context(), "GET", "/version", "", nil, &v); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if protos["HTTP/2.0"] != 8 || len(protos) != 1 {
		t.Fatalf("protocols seen: %v; want 8 requests over HTTP/2.0", protos)
	}
	if len(conns) != 1 {
		t.Fatalf("%d connections for 8 requests; want one", len(conns))
	}
}

// A POST that may have reached the server is sent once: a 5xx after it
// could mean the object exists, and a second POST would make another (an
// Event twice). A 429 says it was turned away, so it is sent again.
func TestClient_PostIsRetriedOnlyWhenTheServerTurnedItAway(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		want   int32
	}{
		{"5xx", http.StatusInternalServerError, 1},
		{"429", http.StatusTooManyRequests, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var posts, gets atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == "POST" {
					posts.Add(1)
				} else {
					gets.Add(1)
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			c := newClientFor(t, srv)
			if err := c.Raw(t.Context(), "POST", "/api/v1/namespaces/default/events", jsonType, map[string]string{}, nil); err == nil {
				t.Fatal("a failing POST reported success")
			}
			if got := posts.Load(); got != tc.want {
				t.Fatalf("POST sent %d times after a %d; want %d", got, tc.status, tc.want)
			}
			// A GET is retried after either.
			c.Raw(t.Context(), "GET", "/version", "", nil, nil)
			if got := gets.Load(); got != int32(c.Attempts) {
				t.Fatalf("GET sent %d times after a %d; want %d", got, tc.status, c.Attempts)
			}
		})
	}
}
