package create_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/test/fixture"
)

// store serves signature-1..n for one digest, 404 after, and counts asks.
func store(t *testing.T, hex string, sigs ...string) (*httptest.Server, *int) {
	var mu sync.Mutex
	asked := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked++
		mu.Unlock()
		for i, s := range sigs {
			if r.URL.Path == "/sha256="+hex+"/signature-"+string(rune('1'+i)) {
				w.Write([]byte(s))
				return
			}
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &asked
}

func TestFetchSignatures_UntilTheFirst404(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	srv, asked := store(t, hex, "one", "two")
	sigs, err := create.FetchSignatures(t.Context(), srv.Client(), srv.URL, "sha256:"+hex)
	if err != nil || len(sigs) != 2 || string(sigs[0]) != "one" || string(sigs[1]) != "two" || *asked != 3 {
		t.Fatalf("sigs %q, err %v, %d requests", sigs, err, *asked)
	}
	if _, err := create.FetchSignatures(t.Context(), srv.Client(), srv.URL, "latest"); err == nil {
		t.Fatal("a non-digest was accepted")
	}
}

func TestCreate_CarriesTheReleaseSignaturesOrSaysLoudlyItHasNone(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	hex := release[strings.LastIndex(release, "sha256:")+7:]
	srv, _ := store(t, hex, "sig-a")

	o := createFrom(t, reg, release)
	o.SignatureStore = srv.URL
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Metadata.ReleaseSignatures; len(got) != 1 || string(got[0]) != "sig-a" {
		t.Fatalf("signatures %q", got)
	}
	m, err := bundle.InspectFile(res.TarPath)
	if err != nil || len(m.ReleaseSignatures) != 1 || string(m.ReleaseSignatures[0]) != "sig-a" {
		t.Fatalf("metadata.json read back: %+v, %v", m, err)
	}

	// Files given win over the store.
	o = createFrom(t, reg, release)
	o.SignatureStore = srv.URL
	o.ReleaseSignatures = [][]byte{[]byte("given-1"), []byte("given-2")}
	if res, err = create.Run(t.Context(), o); err != nil || len(res.Metadata.ReleaseSignatures) != 2 {
		t.Fatalf("given: %v, %v", res, err)
	}

	// An unreachable store is a loud warning, not a failure.
	var logs bytes.Buffer
	o = createFrom(t, reg, release)
	o.SignatureStore = "http://127.0.0.1:1"
	o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	res, err = create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Metadata.ReleaseSignatures) != 0 || !strings.Contains(logs.String(), "NO release signature") || !strings.Contains(logs.String(), "cannot be read") {
		t.Fatalf("signatures %d; log:\n%s", len(res.Metadata.ReleaseSignatures), logs.String())
	}
}
