package kube

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// jwt is an unsigned token with the claims a ServiceAccount token bound
// to a Node carries (ferry reads them, the API server checks them).
func jwt(t *testing.T, iat, exp time.Time, node string) string {
	t.Helper()
	c := map[string]any{"iat": iat.Unix(), "exp": exp.Unix(), "kubernetes.io": map[string]any{
		"namespace": "openshift-ferry", "serviceaccount": map[string]any{"name": "ferry"}}}
	if node != "" {
		c["kubernetes.io"].(map[string]any)["node"] = map[string]any{"name": node}
	}
	b, _ := json.Marshal(c)
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(b) + ".c2ln"
}

func TestLoadKubeconfig_RefusesPlainHTTPAndFlagsInsecure(t *testing.T) {
	dir := t.TempDir()
	write := func(server, extra string) string {
		p := filepath.Join(dir, "kc")
		os.WriteFile(p, []byte(`
clusters: [{name: c, cluster: {server: "`+server+`"`+extra+`}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x`), 0o600)
		return p
	}
	for _, server := range []string{"http://api:6443", "api:6443", "tcp://api:6443"} {
		_, err := loadKubeconfig(write(server, ""))
		if !errors.Is(err, ErrPlainHTTP) || !strings.Contains(err.Error(), "https://") {
			t.Errorf("server %s: %v, want a refusal naming https://", server, err)
		}
	}
	c, err := New(write("https://api:6443", ", insecure-skip-tls-verify: true"), nil)
	if err != nil || !c.Insecure() || !strings.Contains(InsecureWarning(c.Server()), "insecure-skip-tls-verify") {
		t.Fatalf("insecure: %v, %v", c, err)
	}
	if c, err := New(write("https://api:6443", ""), nil); err != nil || c.Insecure() {
		t.Fatalf("verified: %v, %v", c, err)
	}
}

// TestClient_SendsTheTokenFileAsItIsNow: a token written anew to the
// tokenFile (by ferry or by an administrator) is sent from the next
// request on, without a restart.
func TestClient_SendsTheTokenFileAsItIsNow(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		mu.Unlock()
		w.Write([]byte(`{"items":[]}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("first\n"), 0o600)
	kc := filepath.Join(dir, "kc")
	os.WriteFile(kc, []byte(`
clusters: [{name: c, cluster: {server: "`+srv.URL+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {tokenFile: token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]`), 0o600)
	c, err := New(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	c.NodeAddresses(ctx)
	if err := writeToken(tok, "second"); err != nil {
		t.Fatal(err)
	}
	c.NodeAddresses(ctx)
	os.WriteFile(tok, nil, 0o600) // half-written by hand: keep the last good one
	c.NodeAddresses(ctx)
	if strings.Join(seen, ",") != "first,second,second" {
		t.Fatalf("tokens sent: %v", seen)
	}
	if fi, _ := os.Stat(tok); fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v", fi.Mode())
	}
}

func TestRenewToken_AsksForTheSameNodeAndLifeAndWritesTheFile(t *testing.T) {
	now := time.Now()
	old := jwt(t, now.Add(-20*time.Hour), now.Add(4*time.Hour), "node-a")
	renewed := jwt(t, now, now.Add(24*time.Hour), "node-a")
	var got map[string]any
	var path string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		json.NewDecoder(r.Body).Decode(&got)
		json.NewEncoder(w).Encode(map[string]any{"status": map[string]any{"token": renewed}})
	}))
	defer srv.Close()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte(old), 0o600)
	kc := filepath.Join(dir, "kc")
	os.WriteFile(kc, []byte(`
clusters: [{name: c, cluster: {server: "`+srv.URL+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {tokenFile: `+tok+`}}]
contexts: [{name: x, context: {cluster: c, user: u}}]`), 0o600)
	c, err := New(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := parseClaims(old)
	if !cl.renewable() || !cl.renewAt().Before(now) {
		t.Fatalf("a token 20 h into its 24 h is due: %+v", cl)
	}
	exp, err := c.RenewToken(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := got["spec"].(map[string]any)
	ref, _ := spec["boundObjectRef"].(map[string]any)
	if path != "/api/v1/namespaces/openshift-ferry/serviceaccounts/ferry/token" || spec["expirationSeconds"] != float64(86400) ||
		ref["kind"] != "Node" || ref["name"] != "node-a" {
		t.Fatalf("asked %s for %v", path, got)
	}
	if b, _ := os.ReadFile(tok); strings.TrimSpace(string(b)) != renewed || exp.Unix() != now.Add(24*time.Hour).Unix() {
		t.Fatalf("token file %q, expiry %v", b, exp)
	}

	// Tokens ferry cannot renew: bound to no Node, not a JWT.
	os.WriteFile(tok, []byte(jwt(t, now, now.Add(time.Hour), "")), 0o600)
	if _, err := c.RenewToken(context.Background()); !errors.Is(err, ErrNotRenewable) {
		t.Errorf("a token bound to no Node: %v", err)
	}
	os.WriteFile(tok, []byte("opaque"), 0o600)
	if _, err := c.RenewToken(context.Background()); !errors.Is(err, ErrNotRenewable) {
		t.Errorf("an opaque token: %v", err)
	}
}
