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
	"github.com/ferry-edge/ferry/test/releasesig"
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
	one := string(releasesig.Test().Sign(bundle.ReleaseRepo+":4.13.7-x86_64", "sha256:"+hex))
	two := string(releasesig.NewKey().Sign(bundle.ReleaseRepo+":4.13.7-x86_64", "sha256:"+hex))
	srv, asked := store(t, hex, one, two)
	sigs, err := create.FetchSignatures(t.Context(), srv.Client(), srv.URL, "sha256:"+hex)
	if err != nil || len(sigs) != 2 || string(sigs[0]) != one || string(sigs[1]) != two || *asked != 3 {
		t.Fatalf("sigs %q, err %v, %d requests", sigs, err, *asked)
	}
	if _, err := create.FetchSignatures(t.Context(), srv.Client(), srv.URL, "latest"); err == nil {
		t.Fatal("a non-digest was accepted")
	}
}

func TestCreate_CarriesTheReleaseSignaturesOrSaysLoudlyItHasNone(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})

	// The store serves the release's signature as Red Hat's does: the
	// bundle carries it byte for byte, and it verifies as a node checks it.
	o := createFrom(t, reg, release)
	o.SignatureStore = reg.SignatureStore(t)
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	got := res.Metadata.ReleaseSignatures
	if len(got) != 1 {
		t.Fatalf("signatures %q", got)
	}
	_, _, d := bundle.SplitRef(release)
	if v, err := releasesig.Test().Verify(got[0], reg.Manifest(t, release), bundle.ReleaseRepo+":4.13.7-x86_64"); err != nil || v != d {
		t.Fatalf("the carried signature verifies for %q, %v; want %s", v, err, d)
	}
	m, err := bundle.InspectFile(res.TarPath)
	if err != nil || len(m.ReleaseSignatures) != 1 || !bytes.Equal(m.ReleaseSignatures[0], got[0]) {
		t.Fatalf("metadata.json read back: %+v, %v", m, err)
	}

	// Files given win over the store.
	given := [][]byte{releasesig.Test().SignRelease(release, "4.13.7", "x86_64"), releasesig.NewKey().SignRelease(release, "4.13.7", "x86_64")}
	o = createFrom(t, reg, release)
	o.SignatureStore = reg.SignatureStore(t)
	o.ReleaseSignatures = given
	if res, err = create.Run(t.Context(), o); err != nil || len(res.Metadata.ReleaseSignatures) != 2 ||
		!bytes.Equal(res.Metadata.ReleaseSignatures[0], given[0]) || !bytes.Equal(res.Metadata.ReleaseSignatures[1], given[1]) {
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
