//go:build faults

package faults

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/freeport"
)

// TestFaults_AFetchThatFillsTheDiskIsAbandoned: a node fetches the bundle
// from a peer into an extract dir on a small filesystem (a tmpfs) that
// passes the room check, and something else fills it mid-fetch. The
// fetch hits ENOSPC: it is abandoned with a reason that says what to do,
// what it wrote is removed, and it is not retried into the same disk
// (no new staging dir, the phase stays failed) until a restart.
func TestFaults_AFetchThatFillsTheDiskIsAbandoned(t *testing.T) {
	needRoot(t)
	tarPath, digest, blobs := bigBundle(t, 256, 8)
	_, src := source(t, tarPath, digest, blobs)
	cfg := ferryenv.Config(t.TempDir())
	cfg.NodeName = "fetcher-full"
	cfg.Peer.Open = true
	cfg.Peer.Listen = "127.0.0.2:" + strconv.Itoa(freeport.Port(t, "127.0.0.2"))
	cfg.Peer.Peers = []string{src}
	small := cfg.Paths.ExtractDir
	mountTmpfs(t, small, 700<<20) // > 2 × 256 MiB: passes the room check
	filler := filepath.Join(small, "filler")
	a := ferryenv.Start(t, cfg)
	staging := func() []string { m, _ := filepath.Glob(filepath.Join(small, ".staging-*")); return m }
	deadline := time.Now().Add(bound)
	for len(staging()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no staging dir appeared")
		}
		time.Sleep(time.Millisecond)
	}
	if err := fill(filler); err != nil {
		t.Fatal(err)
	}
	s, err := waitFor(a, bound, "the fetch to end", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseFailed) || s.Phase == string(agent.PhaseExtracted)
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Phase != string(agent.PhaseFailed) || s.Reason != agent.ReasonFetchAbandoned {
		t.Fatalf("a fetch that filled the disk ended %s: %s: %q", s.Phase, s.Reason, s.Message)
	}
	t.Logf("abandoned: %s", s.Message)
	// Two retry periods of the old behaviour (every 10 s): nothing again.
	for end := time.Now().Add(25 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if m := staging(); len(m) > 0 {
			t.Fatalf("the abandoned fetch was retried into the same disk: %v", m)
		}
		if s, err := a.Status(t.Context()); err == nil && s.Phase != string(agent.PhaseFailed) {
			t.Fatalf("the abandoned fetch went on: %s", s.Line)
		}
	}
	ents, _ := os.ReadDir(small)
	for _, e := range ents {
		if e.Name() != "filler" {
			t.Errorf("the abandoned fetch left %s in the extract dir", e.Name())
		}
	}
}
