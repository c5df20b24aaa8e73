package registry_test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/registry/registrytest"
)

// blobsOf lists the blobs (layers and configs) linked in a repository
// of a tree.
func blobsOf(t testing.TB, root, repo string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, "docker", "registry", "v2", "repositories", repo, "_layers", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, "sha256:"+e.Name())
	}
	return out
}

// pullLoad is clients concurrent HTTPS clients (one connection each)
// fetching every blob of the repository once, checking each digest. It
// returns the bytes the process allocated meanwhile and the highest heap
// in use seen.
func pullLoad(t testing.TB, r *registry.Registry, repo string, blobs []string, clients int) (alloc, peakHeap uint64) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CACertPEM())
	stop := make(chan struct{})
	var peak atomic.Uint64
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
			defer hc.CloseIdleConnections()
			for i := range blobs {
				d := blobs[(i+c)%len(blobs)]
				resp, err := hc.Get("https://" + r.Addr() + "/v2/" + repo + "/blobs/" + d)
				if err != nil {
					errs <- err
					return
				}
				h := sha256.New()
				_, err = io.Copy(h, resp.Body)
				resp.Body.Close()
				if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); err != nil || resp.StatusCode != 200 || got != d {
					errs <- fmt.Errorf("blob %s: %s, %v, got %s", d, resp.Status, err, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	close(stop)
	sampler.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return after.TotalAlloc - before.TotalAlloc, peak.Load()
}

// aloneEnv marks the test process runAlone starts.
const aloneEnv = "FERRY_REGISTRY_TEST_ALONE"

// runAlone runs t's test again in a process of its own, that one test
// only, and fails t as it fails.
func runAlone(t *testing.T) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), aloneEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a process of its own:\n%s", out)
	if err != nil {
		t.Fatalf("%s in a process of its own: %v", t.Name(), err)
	}
}

// TestServe_BlobsStreamWithoutABufferPerRequest: serving a blob costs
// the registry kilobytes, not the megabytes of a read buffer per request
// (distribution's blob server reads through a 4 MiB bufio.Reader per GET,
// which made the agent's heap grow with every concurrent layer pull).
//
// The process's allocations are read, so the measurement runs in a test
// process of its own (this test run again, alone), never beside the
// package's other tests.
func TestServe_BlobsStreamWithoutABufferPerRequest(t *testing.T) {
	if os.Getenv(aloneEnv) == "" {
		runAlone(t)
		return
	}
	tree := registrytest.NewTree(t)
	const repo = "openshift-release-dev/ocp-v4.0-art-dev"
	for range 4 {
		tree.Push(t, repo, "", 1<<20, 2)
	}
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, r, tree.Root)
	blobs := blobsOf(t, tree.Root, repo)
	const clients = 8
	alloc, peak := pullLoad(t, r, repo, blobs, clients)
	gets := uint64(clients * len(blobs))
	t.Logf("%d blob GETs by %d clients: %d KiB allocated per GET, heap in use peaked at %d MiB", gets, clients, alloc/gets>>10, peak>>20)
	if per := alloc / gets; per > 512<<10 {
		t.Errorf("%d KiB allocated per blob GET, want < 512 KiB", per>>10)
	}
	if p := os.Getenv("FERRY_HEAP_PROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		pprof.Lookup("allocs").WriteTo(f, 0)
	}
}
