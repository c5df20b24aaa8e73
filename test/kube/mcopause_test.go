package kube

import (
	"testing"

	"github.com/ferry-edge/ferry/test/kubeenv"
)

// TestFollower_APoolPausedAfterTheUpgradeIsSeenAtTheNextReading: a
// node's kubelet identity follows the cluster; its worker pool is read
// unpaused after the upgrade, then the administrator pauses it. The very
// next reading of the node's machine config state says paused (the
// node's status names the pool as the reason it waits), not the pool as
// it was read before.
func TestFollower_APoolPausedAfterTheUpgradeIsSeenAtTheNextReading(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.InstallFerry()
	e.InstallMachineConfigPools()
	e.LabelNode("node-a", map[string]string{workerRole: ""})
	worker := kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: oldConfig, Machines: 1}
	e.SetPool(worker)
	e.SetMachineConfig("node-a", "Done", oldConfig, oldConfig)
	_, f := follower(t, e, "node-a")
	ctx := t.Context()

	waitUntil(t, "the node's machine config state read through the follower", func() bool {
		st, err := f.MachineConfigState(ctx, "node-a")
		return err == nil && st.Managed && st.Pool == "worker" && !st.Paused
	})
	// The pools listed just before (as each peer lookup does, for the
	// count of nodes).
	if n, known, err := f.MachineCount(ctx); n != 1 || !known || err != nil {
		t.Fatalf("MachineCount %d %v %v", n, known, err)
	}
	worker.Paused = true
	e.SetPool(worker)
	st, err := f.MachineConfigState(ctx, "node-a")
	if err != nil || !st.Paused || st.Pool != "worker" {
		t.Fatalf("right after the pause: %+v, %v; want pool worker paused", st, err)
	}
}
