// Package load puts ferry's two servers under load on loopback: the peer
// server (ranged reads of random pieces of a bundle, every byte checked)
// and the embedded registry (manifest and blob pulls of an extracted
// bundle, every digest checked), each by 64 concurrent clients for a
// bounded time. Each server runs in a child process (this test binary
// again); a test fails on any error or when that process's peak RSS during
// the load passes 256 MiB. It prints requests/s and that peak.
//
// FERRY_LOAD_SECONDS (default 5) and FERRY_LOAD_CLIENTS (default 64) set
// the run; `make bench` runs it for 20 s (test/bench/p5-load.sh). Root is
// not needed.
package load

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/test/bigbundle"
	"github.com/ferry-edge/ferry/test/fixture"
)

// maxRSS bounds the server process's peak RSS while under load.
const maxRSS = 256 << 20

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func duration() time.Duration { return time.Duration(envInt("FERRY_LOAD_SECONDS", 5)) * time.Second }
func clients() int            { return envInt("FERRY_LOAD_CLIENTS", 64) }

// result is what a load run measured.
type result struct {
	requests, bytes, errors atomic.Int64
	firstErr                atomic.Pointer[error]
}

func (r *result) fail(err error) {
	r.errors.Add(1)
	r.firstErr.CompareAndSwap(nil, &err)
}

// hammer runs n clients, each calling its own newClient() until d has
// passed.
func hammer(ctx context.Context, n int, d time.Duration, newClient func() func(ctx context.Context, rng *rand.Rand, res *result)) (*result, time.Duration) {
	res := &result{}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			one := newClient()
			for ctx.Err() == nil {
				one(ctx, rng, res)
			}
		}()
	}
	wg.Wait()
	return res, time.Since(start)
}

// peakRSS is VmHWM of process pid ("self" for this one), in bytes.
func peakRSS(pid string) (int64, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%s/status", pid)
}

// report prints the machine-readable line test/bench/p5-load.sh reads and
// fails the test on errors or when the server's peak RSS passes maxRSS.
func report(t *testing.T, what string, res *result, took time.Duration, n int, srv *server) {
	t.Helper()
	rss, err := peakRSS(strconv.Itoa(srv.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	self, _ := peakRSS("self")
	reqs := res.requests.Load()
	fmt.Printf("LOAD %s: clients=%d seconds=%.1f requests=%d rps=%.0f mib_s=%.1f errors=%d peak_rss_mib=%d clients_rss_mib=%d\n",
		what, n, took.Seconds(), reqs, float64(reqs)/took.Seconds(), float64(res.bytes.Load())/(1<<20)/took.Seconds(),
		res.errors.Load(), rss>>20, self>>20)
	if e := res.firstErr.Load(); e != nil {
		t.Errorf("%d errors; the first: %v", res.errors.Load(), *e)
	}
	if reqs == 0 {
		t.Error("no request completed")
	}
	if rss > maxRSS {
		t.Errorf("the %s server's peak RSS was %d MiB under load, want < %d MiB", what, rss>>20, maxRSS>>20)
	}
}

// TestLoad_PeerServerRangedReads: 64 clients read random pieces (whole, by
// the piece list, and random sub-ranges) of a 256 MiB bundle from the peer
// server; every byte is checked against the piece digests or the file.
func TestLoad_PeerServerRangedReads(t *testing.T) {
	const size, blob = 256 << 20, 8 << 20
	tarPath, err := bigbundle.Make(size, blob, filepath.Join(os.TempDir(), "ferry-test-bundles"))
	if err != nil {
		t.Fatal(err)
	}
	sha, err := os.ReadFile(strings.TrimSuffix(tarPath, ".tar") + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	digest := digest.Digest("sha256:" + string(sha[:64]))
	ctx := t.Context()
	srv := startServer(t, "peer", "FERRY_LOAD_TAR="+tarPath, "FERRY_LOAD_DIGEST="+string(digest))
	addr := srv.addr
	n := clients()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n}}
	t.Cleanup(hc.CloseIdleConnections)
	cl := peer.NewClient("", hc)
	pl, err := cl.Pieces(ctx, addr, digest, srv.size)
	if err != nil {
		t.Fatal(err)
	}
	// The clients check ranges against their own copy of the file.
	local, err := os.Open(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()

	res, took := hammer(ctx, n, duration(), func() func(context.Context, *rand.Rand, *result) {
		// Each client reuses its buffers.
		var buf bytes.Buffer
		want := make([]byte, pl.PieceSize)
		return func(ctx context.Context, rng *rand.Rand, res *result) {
			i := rng.IntN(pl.N())
			off, k := pl.Bounds(i)
			whole := rng.IntN(4) != 0
			if !whole { // a random sub-range of the piece
				a := rng.Int64N(k)
				off, k = off+a, 1+rng.Int64N(k-a)
			}
			buf.Reset()
			err := cl.CopyRange(ctx, addr, digest, off, k, &buf)
			if ctx.Err() != nil {
				return // the run ended mid-request
			}
			if err != nil {
				res.fail(err)
				return
			}
			if whole {
				err = pl.Check(i, buf.Bytes())
			} else {
				if _, rerr := local.ReadAt(want[:k], off); rerr != nil {
					err = rerr
				} else if !bytes.Equal(want[:k], buf.Bytes()) {
					err = fmt.Errorf("range %d+%d: wrong bytes", off, k)
				}
			}
			if err != nil {
				res.fail(err)
				return
			}
			res.requests.Add(1)
			res.bytes.Add(k)
		}
	})
	report(t, "peer", res, took, n, srv)
}

// TestLoad_RegistryManifestsAndBlobs: 64 clients pull manifests and blobs
// by digest from the embedded registry over TLS (trusting only its CA),
// serving a bundle made by `bundle create` from the fixture registry and
// extracted; every body's sha256 is checked against its digest.
func TestLoad_RegistryManifestsAndBlobs(t *testing.T) {
	ctx := t.Context()
	dir, meta := extractedBundle(t, 40, 64<<10)

	srv := startServer(t, "registry", "FERRY_LOAD_DIR="+dir)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(srv.ca) {
		t.Fatal("the registry's CA is not PEM")
	}
	n := clients()
	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool},
		MaxIdleConnsPerHost: n, MaxConnsPerHost: n,
	}}
	t.Cleanup(hc.CloseIdleConnections)
	base := "https://" + srv.addr + "/v2/"

	// Every image's manifest and the blobs it names, found once.
	type object struct{ path, digest string }
	var manifests, blobs []object
	for _, img := range meta.AllImages() {
		name, d, ok := strings.Cut(img, "@")
		if !ok {
			continue
		}
		repo := bundle.RepoPath(name)
		body, err := get(ctx, hc, base+repo+"/manifests/"+d, d)
		if err != nil {
			t.Fatalf("%s: %v", img, err)
		}
		manifests = append(manifests, object{repo + "/manifests/" + d, d})
		var m struct {
			Config    struct{ Digest string }   `json:"config"`
			Layers    []struct{ Digest string } `json:"layers"`
			Manifests []struct{ Digest string } `json:"manifests"`
		}
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("%s: manifest: %v", img, err)
		}
		for _, c := range m.Manifests {
			manifests = append(manifests, object{repo + "/manifests/" + c.Digest, c.Digest})
		}
		if m.Config.Digest != "" {
			blobs = append(blobs, object{repo + "/blobs/" + m.Config.Digest, m.Config.Digest})
		}
		for _, l := range m.Layers {
			blobs = append(blobs, object{repo + "/blobs/" + l.Digest, l.Digest})
		}
	}
	if len(blobs) == 0 {
		t.Fatal("no blobs found through the manifests")
	}
	t.Logf("%d images: %d manifests and %d blobs to pull", len(meta.AllImages()), len(manifests), len(blobs))

	res, took := hammer(ctx, n, duration(), func() func(context.Context, *rand.Rand, *result) {
		return func(ctx context.Context, rng *rand.Rand, res *result) {
			o := blobs[rng.IntN(len(blobs))]
			if rng.IntN(2) == 0 {
				o = manifests[rng.IntN(len(manifests))]
			}
			body, err := get(ctx, hc, base+o.path, o.digest)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				res.fail(err)
				return
			}
			res.requests.Add(1)
			res.bytes.Add(int64(len(body)))
		}
	})
	report(t, "registry", res, took, n, srv)
}

var acceptManifests = strings.Join([]string{
	"application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.list.v2+json", "application/vnd.docker.distribution.manifest.v2+json",
}, ", ")

// get fetches url and checks that the body's sha256 is digest.
func get(ctx context.Context, hc *http.Client, url, digest string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", acceptManifests)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	sum := sha256.Sum256(body)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return nil, fmt.Errorf("GET %s: body hashes to %s", url, got)
	}
	return body, nil
}

// extractedBundle pushes a release of images payload images to the
// fixture registry, makes a bundle of it with create.Run, and extracts
// it; it returns the extracted dir and the metadata.
func extractedBundle(t *testing.T, images int, size int64) (string, *bundle.Metadata) {
	t.Helper()
	ctx := t.Context()
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: images, ImageSize: size})
	reg.PushImage(t, "my-company/my-workload", "v1")
	tr, err := create.NewTransport(reg.CertsDir, true)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res, err := create.Run(ctx, create.Options{
		WorkDir:     t.TempDir(),
		Release:     release,
		ExtraImages: []string{fixture.Upstream + "/my-company/my-workload:v1"},
		Mirrors:     []create.Mirror{{Prefix: fixture.Upstream + "/", Location: reg.Host + "/"}},
		Transport:   tr,
		OutputDir:   out,
		Log:         slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	src, err := bundle.FindSource(res.TarPath, "")
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "bundle")
	ext, err := bundle.Extract(ctx, src, dest, bundle.Options{Policy: bundle.Policy{SpaceFactor: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if ext.Metadata == nil {
		t.Fatal(errors.New("extract returned no metadata"))
	}
	return dest, ext.Metadata
}

// The servers run in a child process (this test binary again, with
// FERRY_LOAD_SERVE set) so that their memory is measured apart from the
// clients'.
func TestMain(m *testing.M) {
	if mode := os.Getenv("FERRY_LOAD_SERVE"); mode != "" {
		if err := serve(mode); err != nil {
			fmt.Fprintln(os.Stderr, "load server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// server is a child process serving on addr.
type server struct {
	cmd  *exec.Cmd
	addr string
	size int64  // peer: the tar's size
	ca   []byte // registry: its CA certificate
}

// startServer runs the child and reads what it serves from its stdout.
func startServer(t *testing.T, mode string, env ...string) *server {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "FERRY_LOAD_SERVE="+mode), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // closed: the child stops
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the %s server: %v", mode, err)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("the %s server did not stop", mode)
		}
	})
	var line string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if sc.Scan() {
		line = sc.Text()
	}
	var ca string
	if _, err := fmt.Sscanf(line, "SERVING %s %d %s", &s.addr, &s.size, &ca); err != nil {
		t.Fatalf("the %s server said %q: %v", mode, line, err)
	}
	if ca != "-" {
		b, err := hex.DecodeString(ca)
		if err != nil {
			t.Fatal(err)
		}
		s.ca = b
	}
	go io.Copy(io.Discard, stdout)
	return s
}

// serve is the child: it serves until its stdin closes. It prints
// "SERVING <addr> <size> <hex of the CA PEM or ->" once ready, after
// resetting its peak RSS so that VmHWM measures the load alone.
func serve(mode string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	log := slog.New(slog.DiscardHandler)
	var run func() error
	size, ca := int64(0), "-"
	var addr string
	switch mode {
	case "peer":
		tarPath, digest := os.Getenv("FERRY_LOAD_TAR"), digest.Digest(os.Getenv("FERRY_LOAD_DIGEST"))
		f, err := os.Open(tarPath)
		if err != nil {
			return err
		}
		fi, _ := f.Stat()
		size = fi.Size()
		meta, err := bundle.InspectFile(tarPath)
		if err != nil {
			return err
		}
		mb, _ := json.Marshal(meta)
		shelf := peer.NewShelf(peer.ShelfOptions{PieceSize: 1 << 20, Log: log})
		defer shelf.Close()
		if err := shelf.Add(digest, mb, f, size); err != nil {
			return err
		}
		if _, err := shelf.WaitPieces(ctx, digest); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr = ln.Addr().String()
		// Every load client dials from loopback, standing for one peer
		// each: the per-client limit (a hostile client's bound, tested in
		// peer) would turn most of them away.
		srv := peer.NewServer(shelf, peer.ServerOptions{Log: log, MaxConnsPerClient: clients(), MaxConns: max(128, clients())})
		run = func() error { return srv.Serve(ctx, ln) }
	case "registry":
		reg, err := registry.New(filepath.Join(os.TempDir(), fmt.Sprintf("ferry-load-registry-%d", os.Getpid())), 0, log)
		if err != nil {
			return err
		}
		defer os.RemoveAll(filepath.Join(os.TempDir(), fmt.Sprintf("ferry-load-registry-%d", os.Getpid())))
		addr, ca = reg.Addr(), hex.EncodeToString(reg.CACertPEM())
		dir := os.Getenv("FERRY_LOAD_DIR")
		run = func() error { return reg.Serve(ctx, dir) }
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // VmHWM from here on
	fmt.Printf("SERVING %s %d %s\n", addr, size, ca)
	return run()
}
