package agent

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle/bundletest"
)

// statusHarness runs an agent with its status socket.
func statusHarness(t *testing.T) (*harness, *Client) {
	h := newHarness(t, t.TempDir())
	h.cfg.Paths.Socket = filepath.Join(t.TempDir(), "ferry.sock")
	h.start()
	go h.agent.ServeStatus(t.Context(), h.cfg.Paths.Socket)
	c := NewClient(h.cfg.Paths.Socket)
	for range 200 {
		if _, err := c.Status(t.Context()); err == nil {
			return h, c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the status socket does not answer")
	return nil, nil
}

// ferry load passes open files: the agent reads the bundle through them,
// so a file it could not open by its path (here: gone from every
// directory once the caller opened it, as /root is to a ProtectHome unit)
// loads, with its .sha256 checked.
func TestLoad_TheAgentReadsThePassedFilesNotThePath(t *testing.T) {
	h, c := statusHarness(t)
	dir := t.TempDir()
	tarPath, digest := bundletest.Write(t, dir, bundletest.Options{})
	p, err := OpenBundle(tarPath)
	must(t, err)
	defer p.Close()
	if p.SHA256 == nil {
		t.Fatal("the .sha256 beside the tar was not opened")
	}
	must(t, os.RemoveAll(dir))
	s, err := c.pass(t.Context(), p)
	must(t, err)
	if !strings.Contains(s.Line, "upgrade-4.13.7-x86_64.tar") {
		t.Errorf("status names %q, not the bundle", s.Line)
	}
	if got := h.waitPhase(PhaseClusterReady); got.Digest != digest {
		t.Fatalf("digest %s, want %s", got.Digest, digest)
	}
	for _, r := range h.agent.Status().Bundles {
		if r.Digest == digest && r.Source != tarPath {
			t.Errorf("the record says it came from %q, want the caller's %q", r.Source, tarPath)
		}
	}
}

// A load request that carries no files is refused: the agent opens no
// path a caller names (a path in the query is ignored).
func TestLoad_ARequestWithoutFilesIsRefused(t *testing.T) {
	h, c := statusHarness(t)
	tarPath, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	_, err := raw(t.Context(), c.hc, http.MethodPost, "/v1/load?path="+tarPath)
	if err == nil || !strings.Contains(err.Error(), "ferry load PATH") {
		t.Fatalf("got %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if s := h.agent.Status(); s.Phase != string(PhaseIdle) {
		t.Fatalf("the agent took a path: %+v", s)
	}
	if _, err := c.Load(t.Context(), filepath.Join(t.TempDir(), "none.tar")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
}
