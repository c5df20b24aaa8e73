package bundle_test

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
)

// cuttingProxy is a poor link in front of reg: an HTTPS reverse proxy that
// cuts every second blob response over 64 KiB in the middle, and counts
// the bytes it sends.
type cuttingProxy struct {
	srv      *httptest.Server
	sent     atomic.Int64
	cuts     atomic.Int64
	mu       sync.Mutex
	bigSeen  int
	certsDir string
}

func newCuttingProxy(t *testing.T, reg *fixture.Registry) *cuttingProxy {
	t.Helper()
	up, _ := url.Parse(reg.URL)
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = reg.Transport()
	p := &cuttingProxy{}
	p.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &cutWriter{ResponseWriter: w, p: p, blob: r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:")}
		rp.ServeHTTP(cw, r)
	}))
	t.Cleanup(p.srv.Close)
	// The proxy's certificate, where --cert-dir looks for its host.
	host := strings.TrimPrefix(p.srv.URL, "https://")
	p.certsDir = t.TempDir()
	if err := os.MkdirAll(filepath.Join(p.certsDir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(p.certsDir, host, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *cuttingProxy) host() string { return strings.TrimPrefix(p.srv.URL, "https://") }

// cutWriter counts what goes out and, for every second big blob, aborts
// the response once half of it is sent.
type cutWriter struct {
	http.ResponseWriter
	p       *cuttingProxy
	blob    bool
	cutAt   int64 // 0: not cut
	written int64
	decided bool
}

func (w *cutWriter) WriteHeader(code int) {
	if w.blob && code == http.StatusOK && !w.decided {
		w.decided = true
		if n := w.contentLength(); n > 64<<10 {
			w.p.mu.Lock()
			w.p.bigSeen++
			cut := w.p.bigSeen%2 == 1
			w.p.mu.Unlock()
			if cut {
				w.cutAt = n / 2
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *cutWriter) contentLength() int64 {
	var n int64
	for _, c := range w.Header().Get("Content-Length") {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

func (w *cutWriter) Write(b []byte) (int, error) {
	if w.cutAt > 0 && w.written+int64(len(b)) > w.cutAt {
		b = b[:w.cutAt-w.written]
		n, _ := w.ResponseWriter.Write(b)
		w.written += int64(n)
		w.p.sent.Add(int64(n))
		w.p.cuts.Add(1)
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		panic(http.ErrAbortHandler) // the connection drops mid-body
	}
	n, err := w.ResponseWriter.Write(b)
	w.written += int64(n)
	w.p.sent.Add(int64(n))
	return n, err
}

func (w *cutWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// TestCreateCLI_ThroughALinkThatCutsBlobsMidwayResumesEachOnce (issue 36,
// item 4): ferry bundle create through a proxy that cuts every second large
// blob response in the middle completes, each cut blob resumed where it
// stopped, with at most 1.05× one copy of the bundle over the link; the
// bundle verifies.
func TestCreateCLI_ThroughALinkThatCutsBlobsMidwayResumesEachOnce(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 6, ImageSize: 1 << 20})
	p := newCuttingProxy(t, reg)
	out := t.TempDir()
	code, stderr := ferry(t, out, "bundle", "create", "--release", release,
		"--mirror", fixture.Upstream+"/="+p.host()+"/", "--cert-dir", p.certsDir, "--output", out, "--quiet", "--rate-limit", "64M")
	if code != 0 {
		t.Fatalf("bundle create through the cutting link: exit %d\n%s", code, stderr)
	}
	tars, _ := filepath.Glob(filepath.Join(out, "upgrade-*.tar"))
	if len(tars) != 1 {
		t.Fatalf("wrote %v", tars)
	}
	meta, err := bundle.InspectFile(tars[0])
	if err != nil {
		t.Fatal(err)
	}
	if p.cuts.Load() < 3 {
		t.Fatalf("the proxy cut %d responses: the test shows nothing", p.cuts.Load())
	}
	sent, size := p.sent.Load(), meta.SizeBytes
	if size <= 0 {
		fi, _ := os.Stat(tars[0])
		size = fi.Size()
	}
	ratio := float64(sent) / float64(size)
	t.Logf("%d responses cut; %d bytes over the link for a %d-byte bundle: %.3f×", p.cuts.Load(), sent, size, ratio)
	if ratio > 1.05 {
		t.Errorf("%.3f× one copy of the bundle crossed the link, want ≤ 1.05×", ratio)
	}
	if code, stderr := ferry(t, out, "bundle", "verify", tars[0], "--arch", meta.Arch); code != 0 {
		t.Fatalf("the bundle made through the cutting link does not verify: %d\n%s", code, stderr)
	}
}
