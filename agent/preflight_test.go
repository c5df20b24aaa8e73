package agent

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/cluster"
)

func TestPreflight_ARefusalRejectsTheStickBeforeItIsRead(t *testing.T) {
	h, api := apiHarness(t)
	api.pre = cluster.Preflight{Current: "4.13.7", Refusals: []string{"the cluster is at 4.13.7 already: this bundle would change nothing"}}
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseRejected)
	if !strings.Contains(s.Reason, "at 4.13.7 already") || !strings.Contains(s.Reason, ErrPreflight.Error()) {
		t.Fatalf("reason %q", s.Reason)
	}
	api.mu.Lock()
	if !slices.Equal(api.preAsked, []string{"4.13.7"}) {
		t.Errorf("preflight asked about %v", api.preAsked)
	}
	api.mu.Unlock()
	if _, err := os.Stat(h.cfg.Paths.ExtractDir + "/4.13.7-x86_64"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("extracted although refused: %v", err)
	}
	h.loader.mu.Lock()
	defer h.loader.mu.Unlock()
	if len(h.loader.loads) != 0 {
		t.Errorf("loads of a refused bundle: %v", h.loader.loads)
	}
}

// TestPreflight_ARefusalShowsTheWarningsFoundBesideIt: a bundle refused
// for one reason still shows every warning the same preflight found, in
// the status and in the report for the UpgradeBundle, so that the
// technician learns of them on this visit, not the next.
func TestPreflight_ARefusalShowsTheWarningsFoundBesideIt(t *testing.T) {
	h, api := apiHarness(t)
	api.pre = cluster.Preflight{Current: "4.12.9",
		Refusals: []string{"the cluster is not upgradeable to a new minor version (Upgradeable=False, AdminAckRequired): Kubernetes 1.27 removes APIs in use"},
		Warnings: []string{"workloads pull with imagePullPolicy Always an image the bundle does not carry, and fail to start if restarted without a registry: shop/front/main (quay.io/my-company/front:latest)",
			"machine config pool worker is paused: …"}}
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseRejected)
	if !strings.Contains(s.Reason, "Upgradeable=False") {
		t.Fatalf("reason %q", s.Reason)
	}
	if !slices.Equal(s.Preflight, api.pre.Warnings) {
		t.Fatalf("the refused bundle's status shows warnings %q, want %q", s.Preflight, api.pre.Warnings)
	}
	if rep := h.agent.snap.Load().bundle; rep == nil || !slices.Equal(rep.sum.Warnings, api.pre.Warnings) {
		t.Fatalf("the UpgradeBundle report %+v, want the warnings %q", rep, api.pre.Warnings)
	}
}

func TestPreflight_WarningsAreShownAndDoNotBlock(t *testing.T) {
	h, api := apiHarness(t)
	api.pre = cluster.Preflight{Current: "4.13.6", Warnings: []string{"machine config pool worker is paused: …"}}
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseClusterReady)
	if !slices.Equal(s.Preflight, api.pre.Warnings) {
		t.Fatalf("warnings %q, want %q", s.Preflight, api.pre.Warnings)
	}
}

func TestPreflight_AnAPIThatCannotBeAskedIsAWarning(t *testing.T) {
	h, api := apiHarness(t)
	api.preErr = errors.New("the cluster's API at https://api:6443 cannot be reached")
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseClusterReady)
	if len(s.Preflight) != 1 || !strings.Contains(s.Preflight[0], "preflight could not run") {
		t.Fatalf("warnings %q", s.Preflight)
	}
}
