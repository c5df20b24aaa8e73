package peer

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ferry-edge/ferry/internal/testca"
)

// TestBuild_OfferedToNodesOnly: a node's server offers the ferry build it
// was given (its digest, size, arch, version) and its bytes, to a client
// with a node's certificate only; a digest other than the build's is
// 404, and the bytes stay the ones hashed when the file is replaced by a
// rename, as the installer replaces ferry.
func TestBuild_OfferedToNodesOnly(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "ferry")
	body := []byte("#!/bin/sh\necho 'ferry v1.5.0'\n")
	if err := os.WriteFile(exe, body, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := OpenBuild(exe, "v1.5.0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// The installer's rename: a new file under the same name.
	if err := os.WriteFile(exe+".new", []byte("other bytes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(exe+".new", exe); err != nil {
		t.Fatal(err)
	}

	ca := testca.New(t, "kube-csr-signer")
	server := nodeTLS(t, ca, "a", ca)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	srv := NewServer(NewShelf(ShelfOptions{}), ServerOptions{TLS: server.ServerConfig(), Closed: true, Build: b})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	base := "https://" + ln.Addr().String()

	hc := NewNodeClient(nodeTLS(t, ca, "b", ca)).hc
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := hc.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, got
	}
	sum := sha256.Sum256(body)
	want := BuildOffer{Arch: UnameArch(runtime.GOARCH), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(body)), Version: "v1.5.0"}
	code, raw := get("/v1/ferry")
	var got BuildOffer
	if err := json.Unmarshal(raw, &got); code != http.StatusOK || err != nil {
		t.Fatalf("GET /v1/ferry: %d %s (%v)", code, raw, err)
	}
	if got != want || got.Arch == "" {
		t.Errorf("offer %+v, want %+v", got, want)
	}
	if code, bytes := get("/v1/ferry/" + want.SHA256); code != http.StatusOK || string(bytes) != string(body) {
		t.Errorf("GET the build: %d %q, want the bytes hashed at start %q", code, bytes, body)
	}
	other := sha256.Sum256([]byte("other bytes"))
	if code, _ := get("/v1/ferry/" + hex.EncodeToString(other[:])); code != http.StatusNotFound {
		t.Errorf("GET another build: %d, want 404", code)
	}

	// Not a node: no certificate at all.
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := anon.Get(base + "/v1/ferry/" + want.SHA256); err == nil {
		resp.Body.Close()
		t.Errorf("a client with no node certificate got %d", resp.StatusCode)
	}
}
