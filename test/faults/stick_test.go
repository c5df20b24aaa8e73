//go:build faults

package faults

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/udevenv"
)

// TestFaults_StickPulledMidRead: an ext4 stick (a loop device, real udev)
// is pulled while the agent reads it: the node is left unchanged (nothing
// published, the state says to plug it in again); put back, the bundle
// ends extracted with the right digest.
func TestFaults_StickPulledMidRead(t *testing.T) {
	needRoot(t)
	udevenv.Require(t)
	c := newCampaign(t, "stick-pulled")
	tarPath, digest, blobs := bigBundle(t, 256, 8)
	files := []udevenv.File{
		{Name: filepath.Base(tarPath), Path: tarPath},
		{Name: strings.TrimSuffix(filepath.Base(tarPath), ".tar") + ".sha256", Path: strings.TrimSuffix(tarPath, ".tar") + ".sha256"},
	}
	cfg := ferryenv.Config(t.TempDir())
	a := ferryenv.Start(t, cfg)
	n := &node{a: a, cfg: cfg, digest: digest, wantBlobs: blobs}
	if _, err := waitFor(a, bound, "idle", phaseIs("idle")); err != nil {
		t.Fatal(err)
	}
	for i := range trials("stick-pulled", 3) {
		c.trial(i, func() error {
			ensureRunning(a)
			if err := cleanupNode(a); err != nil {
				return err
			}
			first := udevenv.Ext4Image(t, "FERRY", files...)
			loop := udevenv.Attach(t, first)
			_, err := waitFor(a, bound, "reading the stick", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseDetected) && s.Progress != nil && s.Progress.Done > 0 ||
					s.Phase == string(agent.PhaseExtracted)
			})
			if err != nil {
				return err
			}
			loop.Pull()
			s, err := waitFor(a, bound, "the pull to be noticed", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseDetected) && s.Reason == agent.ReasonCopyInterrupted ||
					s.Phase == string(agent.PhaseExtracted)
			})
			if err != nil {
				return err
			}
			if s.Phase == string(agent.PhaseExtracted) {
				return fmt.Errorf("%w: the copy finished before the stick was pulled", errNotExercised)
			}
			t.Logf("pulled: %s", s.Reason)
			if err := n.invariants(t.Context()); err != nil {
				return err
			}
			if err := emptyExtractDir(n); err != nil {
				return err
			}
			second := udevenv.Ext4Image(t, "FERRY", files...)
			again := udevenv.Attach(t, second)
			defer exec.Command("losetup", "-d", again.Dev).Run() // the next trial's stick is the only one
			return n.converged(t.Context(), agent.PhaseExtracted)
		})
	}
}
