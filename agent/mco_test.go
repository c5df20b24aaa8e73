package agent

import (
	"github.com/ferry-edge/ferry/agent/machine"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/cluster"
)

// The test plays the machine config operator (api.setNode) as well as
// the cluster version operator: ClusterVersion says Completed once the
// control plane is done, and a node keeps its bundle's registry and
// mirror until the MCO is done with it (docs/design.md, "After the upgrade").

const (
	oldConfig = "rendered-worker-0ld"
	newConfig = "rendered-worker-4ew"
)

// upgradedWhileTheMCOIsAtWork takes a bundle to ClusterVersion Completed
// on a node the MCO manages, which was Done on oldConfig before the
// upgrade; before stays the node's state until the test changes it.
func upgradedWhileTheMCOIsAtWork(t *testing.T, before cluster.NodeUpdate) (*harness, *fakeAPI) {
	t.Helper()
	h, api := apiHarness(t)
	api.setNode("node-a", cluster.NodeUpdate{Managed: true, State: "Done", Current: oldConfig, Desired: oldConfig, Pool: "worker", Target: oldConfig})
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(machine.PhaseClusterReady)
	h.waitFor("the config from before the upgrade recorded", func() bool { return h.record().MachineConfig == oldConfig })
	api.setNode("node-a", before)
	release := h.agent.Status().Release
	api.set(release, cluster.UpgradeStatus{State: cluster.UpgradeRunning, Message: "Working towards 4.13.7"})
	h.waitPhase(machine.PhaseUpgrading)
	api.set(release, cluster.UpgradeStatus{State: cluster.UpgradeCompleted, Message: "Cluster version is 4.13.7"})
	h.waitPhase(machine.PhaseUpgraded)
	return h, api
}

// record is the active bundle's record, as the status shows it.
func (h *harness) record() machine.Record {
	for _, r := range h.agent.Status().Bundles {
		if r.Name == "upgrade-4.13.7-x86_64.tar" {
			return r
		}
	}
	return machine.Record{}
}

// loads is how many loads the fake loader was asked for.
func (h *harness) loads() int {
	h.loader.mu.Lock()
	defer h.loader.mu.Unlock()
	return len(h.loader.loads)
}

func (h *harness) retires() int {
	h.loader.mu.Lock()
	defer h.loader.mu.Unlock()
	return len(h.loader.retires)
}

// keepsTheBundle checks that nothing was cleaned up and that the status
// and the Node say what the node waits for (why).
func (h *harness) keepsTheBundle(api *fakeAPI, why string) {
	h.t.Helper()
	r := h.waitWhy(why)
	h.waitFor("the waiting reason on the Node", func() bool {
		return api.annotation("node-a", machine.AnnotationReason) == machine.Annotations(h.agent.Status())[machine.AnnotationReason]
	})
	// That a reading of the node keeps it is the reducer's (its table:
	// "upgraded, the pool not at the node yet", "the MCO at work",
	// "paused", "done on the config from before"); here, that the wiring
	// shows it.
	if s := h.agent.Status(); r.Phase != machine.PhaseUpgraded || s.Reason != why || s.Message == "" || !strings.Contains(s.Line, s.Message) {
		h.t.Fatalf("status %+v", s)
	}
	if n := h.retires(); n != 0 {
		h.t.Fatalf("retired %d times while the node still needs the bundle", n)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); err != nil {
		h.t.Fatalf("the extracted tree went while the node still needs it: %v", err)
	}
	if got := api.annotation("node-a", machine.AnnotationPhase); got != "upgraded" {
		h.t.Fatalf("phase annotation %q", got)
	}
}

func (h *harness) retiresOnce() {
	h.t.Helper()
	h.waitFor("the bundle retired", func() bool {
		s := h.agent.Status()
		return s.Phase == "upgraded" && s.Reason == machine.ReasonUpgraded && h.record().Retirement == machine.RetirementDone
	})
	if n := h.retires(); n != 1 {
		h.t.Fatalf("retired %d times", n)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); err != nil || !h.record().Retained {
		h.t.Fatalf("the running release's tree is not kept after the cleanup: %v", err)
	}
}

func TestUpgrade_ARestartWhileWaitingForTheMCOWaitsAgain(t *testing.T) {
	h, api := upgradedWhileTheMCOIsAtWork(t, cluster.NodeUpdate{Managed: true, State: "Working", Current: oldConfig, Desired: newConfig, Pool: "worker", Target: newConfig})
	h.keepsTheBundle(api, machine.ReasonNodeUpdating)
	h.stop()
	h.start()
	h.keepsTheBundle(api, machine.ReasonNodeUpdating)
	api.setNode("node-a", cluster.NodeUpdate{Managed: true, State: "Done", Current: newConfig, Desired: newConfig, Pool: "worker", Target: newConfig})
	h.retiresOnce()
}
