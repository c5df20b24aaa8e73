package registry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"

	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/registry/registrytest"
)

// TestServe_BlobAnswersMatchDistributions: the blobs ferry serves from
// their files get the status, headers and bytes distribution's own blob
// server gives, for whole blobs, HEAD, ranges and conditional GETs, and
// what it does not serve itself (unknown blobs, blobs of another
// repository, bad digests) is distribution's answer. (Repositories the
// bundle does not list are ferry's own answer: TestServe_OnlyWhatMetadataLists.)
func TestServe_BlobAnswersMatchDistributions(t *testing.T) {
	tree := registrytest.NewTree(t)
	const repo, other = "openshift-release-dev/ocp-v4.0-art-dev", "my-company/app"
	tree.Push(t, repo, "", 300<<10, 1)
	tree.Push(t, other, "", 1024, 1)
	blob := blobsOf(t, tree.Root, repo)[0]
	foreign := blobsOf(t, tree.Root, other)
	slices.Sort(foreign)
	otherBlob := foreign[len(foreign)-1]
	if slices.Contains(blobsOf(t, tree.Root, repo), otherBlob) {
		t.Fatal("test setup: the other repository's blob is linked in both")
	}

	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ours, shutdown, err := r.Handler(t.Context(), tree.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	theirs := distributionApp(t, tree.Root)

	for _, c := range []struct {
		name, method, path string
		header             map[string]string
	}{
		{"whole blob", "GET", "/v2/" + repo + "/blobs/" + blob, nil},
		{"HEAD", "HEAD", "/v2/" + repo + "/blobs/" + blob, nil},
		{"range", "GET", "/v2/" + repo + "/blobs/" + blob, map[string]string{"Range": "bytes=100-4195"}},
		{"open range", "GET", "/v2/" + repo + "/blobs/" + blob, map[string]string{"Range": "bytes=300000-"}},
		{"unsatisfiable range", "GET", "/v2/" + repo + "/blobs/" + blob, map[string]string{"Range": "bytes=999999999-"}},
		{"etag matches", "GET", "/v2/" + repo + "/blobs/" + blob, map[string]string{"If-None-Match": `"` + blob + `"`}},
		{"another repository's blob", "GET", "/v2/" + repo + "/blobs/" + otherBlob, nil},
		{"unknown blob", "GET", "/v2/" + repo + "/blobs/sha256:" + strings.Repeat("0", 64), nil},
		{"bad digest", "GET", "/v2/" + repo + "/blobs/sha256:xyz", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			do := func(h http.Handler) *http.Response {
				req := httptest.NewRequest(c.method, c.path, nil)
				for k, v := range c.header {
					req.Header.Set(k, v)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w.Result()
			}
			got, want := do(ours), do(theirs)
			gb, _ := io.ReadAll(got.Body)
			wb, _ := io.ReadAll(want.Body)
			if got.StatusCode != want.StatusCode || string(gb) != string(wb) {
				t.Errorf("got %d (%d bytes), distribution %d (%d bytes)", got.StatusCode, len(gb), want.StatusCode, len(wb))
			}
			got.Header.Del("Date")
			want.Header.Del("Date")
			for k := range want.Header {
				if !slices.Equal(got.Header.Values(k), want.Header.Values(k)) {
					t.Errorf("header %s: got %q, distribution %q", k, got.Header.Values(k), want.Header.Values(k))
				}
			}
			for k := range got.Header {
				if _, ok := want.Header[k]; !ok {
					t.Errorf("header %s: got %q, distribution sends none", k, got.Header.Values(k))
				}
			}
		})
	}
}

// distributionApp is distribution's own read-only registry over root.
func distributionApp(t *testing.T, root string) http.Handler {
	cfg := &configuration.Configuration{}
	cfg.HTTP.Secret = "test"
	cfg.Log.AccessLog.Disabled = true
	cfg.Storage = configuration.Storage{
		"filesystem":  configuration.Parameters{"rootdirectory": root},
		"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}, "readonly": map[any]any{"enabled": true}},
		"redirect":    configuration.Parameters{"disable": true},
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return handlers.NewApp(ctx, cfg)
}

// countingPacer records the bytes it was asked to pace.
type countingPacer struct {
	mu    sync.Mutex
	bytes int
	calls int
}

func (p *countingPacer) Pace(ctx context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bytes += n
	p.calls++
	return nil
}

// TestServe_BlobsGoAtThePacersPace: with a Pacer, every byte of a blob
// served (whole or a range) passes through it, in reads no larger than
// net/http's copy buffer, so a pause per MiB slows the pull evenly; the
// bytes served are unchanged.
func TestServe_BlobsGoAtThePacersPace(t *testing.T) {
	tree := registrytest.NewTree(t)
	const repo = "openshift-release-dev/ocp-v4.0-art-dev"
	tree.Push(t, repo, "", 3<<20, 1)
	blobs := blobsOf(t, tree.Root, repo)
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := &countingPacer{}
	r.Pacer = p
	h, shutdown, err := r.Handler(t.Context(), tree.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	var biggest int
	var total int
	var layer string
	for _, b := range blobs {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v2/"+repo+"/blobs/"+b, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d", b, rec.Code)
		}
		total += rec.Body.Len()
		if rec.Body.Len() > biggest {
			biggest, layer = rec.Body.Len(), b
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/v2/"+repo+"/blobs/"+layer, nil)
	req.Header.Set("Range", "bytes=10-1033")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusPartialContent || rec.Body.Len() != 1024 {
		t.Fatalf("range: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	total += 1024
	if p.bytes != total {
		t.Errorf("paced %d bytes, served %d", p.bytes, total)
	}
	if biggest < 3<<20 || p.calls < (3<<20)/(32<<10) {
		t.Errorf("a %d-byte blob was paced in %d calls: want reads of at most 32 KiB", biggest, p.calls)
	}
}
