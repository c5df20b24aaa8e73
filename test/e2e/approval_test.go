package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
)

// TestHost_AnUnapprovedBundleIsExtractedButNeverLoadedUntilApproved: with
// the default (approval = "required") and nothing approved, a real
// CRI-O node verifies and extracts the bundle and then waits, saying how
// to approve it: nothing is pulled or pinned, no mirror drop-in changes
// what a tag resolves to. Once the config approves its digest (a
// restart), it loads.
func TestHost_AnUnapprovedBundleIsExtractedButNeverLoadedUntilApproved(t *testing.T) {
	c := crioenv.Start(t)
	tarPath, meta := makeBundle(t, 2, 0)
	cfg := nodeConfig(t, c)
	cfg.Approval = "required"
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	s := a.Wait(bound, "waiting for approval", func(s agent.Status) bool {
		return s.Reason == agent.ReasonAwaitingApproval
	})
	// The digest to approve is what the technician acts on.
	if s.Phase != string(agent.PhaseExtracted) || !strings.Contains(s.Message, string(s.Digest)) {
		t.Fatalf("status %+v", s)
	}
	time.Sleep(2 * time.Second) // the loop turns: still nothing loaded
	if s, _ := a.Status(t.Context()); s.Phase != string(agent.PhaseExtracted) {
		t.Fatalf("an unapproved bundle went on to %s", s.Line)
	}
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, meta.DirName(), "metadata.json")); err != nil {
		t.Fatalf("not extracted: %v", err)
	}
	for _, dir := range []string{cfg.Paths.CRIOConfDir, cfg.Paths.RegistriesConfDir} {
		if _, err := os.Stat(filepath.Join(dir, "pin-upgrade.conf")); err == nil {
			t.Errorf("%s/pin-upgrade.conf written for an unapproved bundle", dir)
		}
	}
	cl := c.Client(t)
	for _, ref := range refsOf(meta) {
		if present, pinned, err := cl.Status(t.Context(), ref); err != nil || present || pinned {
			t.Errorf("%s: present=%v pinned=%v (%v) before approval", ref, present, pinned, err)
		}
	}

	a.Stop()
	cfg.ApprovedDigests = []string{string(s.Digest)}
	a = ferryenv.Start(t, cfg)
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, cl, refsOf(meta), true)
}
