package agent

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull"
)

// fakePuller records what the agent asks of its puller.
type fakePuller struct {
	mu         sync.Mutex
	ensured    []pull.Request
	unfollowed []string
}

func (f *fakePuller) Start(req pull.Request) error { return f.Ensure(req) }

func (f *fakePuller) Ensure(req pull.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.ensured); n == 0 || !sameRequest(f.ensured[n-1], req) {
		f.ensured = append(f.ensured, req)
	}
	return nil
}

func sameRequest(a, b pull.Request) bool {
	return a.Release == b.Release && a.From == b.From && a.FromNode == b.FromNode && a.Created.Equal(b.Created)
}

func (f *fakePuller) Unfollow(release string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unfollowed = append(f.unfollowed, release)
}

func (f *fakePuller) Status() *pull.Status { return nil }

func (f *fakePuller) asked() []pull.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ensured)
}

// A node that is not the one to pull a release follows the pulling
// node's pull at the peer address that node reports, with the
// UpgradeBundle's creation time, so both make the same bundle.
func TestAgent_ANodeNotPullingFollowsThePullerAtItsPeerAddress(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.api = newFakeAPI()
	created := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)
	h.api.readiness = map[string]cluster.NodeReady{"node-0": {Ready: true}, "node-a": {Ready: true}}
	h.api.sources = []cluster.RegistrySource{{Bundle: "4.13.8-x86-64", Release: meta137.Release, Created: created}}
	fp, puller := newFakePeers(), &fakePuller{}
	fp.statuses["10.0.0.9:8090"] = peer.PeerStatus{Status: peer.Status{Node: "node-0"}}
	h.peers, h.puller = fp, puller
	h.start()
	deadline := time.Now().Add(waitBound)
	for len(puller.asked()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := puller.asked()
	want := pull.Request{Release: meta137.Release, From: "10.0.0.9:8090", FromNode: "node-0", Created: created}
	if len(got) != 1 || !sameRequest(got[0], want) || got[0].Bundle != "4.13.8-x86-64" {
		t.Fatalf("asked the puller for %+v, want only %+v", got, want)
	}
}
