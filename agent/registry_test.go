package agent

import (
	"encoding/json"
	"github.com/ferry-edge/ferry/agent/machine"
	"github.com/ferry-edge/ferry/bundle"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// fakePuller records what the agent asks of its puller.
type fakePuller struct {
	mu         sync.Mutex
	ensured    []pullspec.Request
	unfollowed []string
}

func (f *fakePuller) Start(req pullspec.Request) error { return f.Ensure(req) }

func (f *fakePuller) Ensure(req pullspec.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.ensured); n == 0 || !sameRequest(f.ensured[n-1], req) {
		f.ensured = append(f.ensured, req)
	}
	return nil
}

func sameRequest(a, b pullspec.Request) bool {
	return a.Release == b.Release && a.From == b.From && a.FromNode == b.FromNode && a.Created.Equal(b.Created)
}

func (f *fakePuller) Unfollow(release string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unfollowed = append(f.unfollowed, release)
}

func (f *fakePuller) Status() *pullspec.Status { return nil }

func (f *fakePuller) asked() []pullspec.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ensured)
}

// A node that is not the one to pull a release follows the pulling
// node's pull at the peer address that node reports, with the
// UpgradeBundle's creation time, so both make the same bundle.
func TestAgent_ANodeNotPullingFollowsThePullerAtItsPeerAddress(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.cfg.Peer.Identity = PeerIdentityNode
	h.api = newFakeAPI()
	created := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)
	h.api.readiness = map[string]cluster.NodeReady{"node-0": {Ready: true}, "node-a": {Ready: true}}
	h.api.sources = []cluster.RegistrySource{{Bundle: "4.13.8-x86-64", Release: meta137.Release, Created: created}}
	fp, puller := newFakePeers(), &fakePuller{}
	fp.statuses["10.0.0.9:8090"] = peer.PeerStatus{Status: peer.Status{Node: "node-0"}, Verified: "node-0"}
	h.peers, h.puller = fp, puller
	h.start()
	got := waitAsked(t, puller)
	want := pullspec.Request{Release: meta137.Release, From: "10.0.0.9:8090", FromNode: "node-0", Created: created}
	if len(got) != 1 || !sameRequest(got[0], want) || got[0].Bundle != "4.13.8-x86-64" {
		t.Fatalf("asked the puller for %+v, want only %+v", got, want)
	}
}

// waitAsked waits until the puller was asked for something.
// readsAgain waits until the agent has read the sources from the API and
// polled the peers twice more each: what it would act on, it has seen
// (what a test then finds not done was decided against, not yet to come).
func readsAgain(t *testing.T, api *fakeAPI, fp *fakePeers) {
	t.Helper()
	counts := func() (int, int) {
		api.mu.Lock()
		defer api.mu.Unlock()
		fp.mu.Lock()
		defer fp.mu.Unlock()
		return api.sourceReads, fp.polls
	}
	reads, polls := counts()
	deadline := time.Now().Add(waitBound)
	for r, p := counts(); r < reads+2 || p < polls+2; r, p = counts() {
		if time.Now().After(deadline) {
			t.Fatalf("the agent read the sources %d times and polled the peers %d times since, want 2 each", r-reads, p-polls)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitAsked(t *testing.T, puller *fakePuller) []pullspec.Request {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for len(puller.asked()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return puller.asked()
}

// A peer with a valid node certificate for node-x that says it is the
// puller (node-0) and offers a bundle of the source whose tagged extra
// resolved otherwise is never followed, and its offer never taken: a
// node follows only the address whose certificate names the puller,
// and, for an extra given by tag, only once the puller published in its
// own entry of the UpgradeBundle the digest that tag resolved to, pinned
// in the request; it takes from the peers only the bundle the puller
// published there (issue 41).
func TestAgent_AFollowerFollowsOnlyThePullerItsCertificateAndEntryName(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.cfg.Peer.Identity = PeerIdentityNode
	h.cfg.Approval = machine.ApprovalModeRequired
	h.api = newFakeAPI()
	extra := "quay.io/my-company/my-workload:v1"
	pin := digest.Digest("sha256:" + strings.Repeat("a", 64))
	h.api.readiness = map[string]cluster.NodeReady{"node-0": {Ready: true}, "node-a": {Ready: true}}
	h.api.sources = []cluster.RegistrySource{{Bundle: "4.13.8-x86-64", Release: meta137.Release, Extras: []string{extra}}}
	fp, puller := newFakePeers(), &fakePuller{}
	// The liar answers first; the puller's own address comes later.
	fp.statuses["10.0.0.66:8090"] = peer.PeerStatus{Status: peer.Status{Node: "node-0"}, Verified: "node-x"}
	lying := meta137
	lying.Images = []string{extra + "@sha256:" + strings.Repeat("f", 64)}
	lmeta, err := json.Marshal(lying)
	if err != nil {
		t.Fatal(err)
	}
	fp.offers = []peer.PeerOffer{{Peer: "10.0.0.66:8090", Offer: peer.Offer{Digest: digest.Digest("sha256:" + strings.Repeat("e", 64)), Metadata: lmeta, Size: 1 << 20, Complete: true}}}
	h.peers, h.puller = fp, puller
	h.start()
	readsAgain(t, h.api, fp)
	if got := puller.asked(); len(got) != 0 {
		t.Fatalf("followed %+v: the liar's address, or before the puller published its tags", got)
	}
	// The puller's address, its certificate naming it, but no record yet.
	fp.mu.Lock()
	fp.statuses["10.0.0.9:8090"] = peer.PeerStatus{Status: peer.Status{Node: "node-0"}, Verified: "node-0"}
	fp.mu.Unlock()
	readsAgain(t, h.api, fp)
	if got := puller.asked(); len(got) != 0 {
		t.Fatalf("followed %+v before the puller published what its tag resolved to", got)
	}
	// The record of another node (the liar's, say) binds nothing.
	h.api.mu.Lock()
	h.api.pulls = map[string]cluster.PullRecord{"node-x": {Release: meta137.Release, Extras: map[string]digest.Digest{extra: pin}}}
	h.api.mu.Unlock()
	readsAgain(t, h.api, fp)
	if got := puller.asked(); len(got) != 0 {
		t.Fatalf("followed %+v on another node's record", got)
	}
	h.api.mu.Lock()
	h.api.pulls = map[string]cluster.PullRecord{"node-0": {Release: meta137.Release, Extras: map[string]digest.Digest{extra: pin}}}
	h.api.mu.Unlock()
	got := waitAsked(t, puller)
	if len(got) != 1 || got[0].From != "10.0.0.9:8090" || got[0].FromNode != "node-0" || got[0].Pins[extra] != pin {
		t.Fatalf("asked the puller for %+v, want node-0 at 10.0.0.9:8090 with %s pinned to %s", got, extra, pin)
	}
	// The puller's bundle published: the liar's offer is still not it.
	// (Each record a new map: the agent holds the one it read.)
	h.api.mu.Lock()
	h.api.pulls = map[string]cluster.PullRecord{"node-0": {Release: meta137.Release, Digest: digest.Digest("sha256:" + strings.Repeat("d", 64)), Extras: map[string]digest.Digest{extra: pin}}}
	h.api.mu.Unlock()
	readsAgain(t, h.api, fp)
	fp.mu.Lock()
	fetched, polls := fp.fetched, fp.polls
	fp.mu.Unlock()
	if fetched != 0 || polls == 0 {
		t.Fatalf("the liar's offer was fetched %d times (%d polls of the peers)", fetched, polls)
	}
}

// With the peers' shared token nothing binds a peer to a node: registry
// mode does not run (no pull, no following), and says what to set.
func TestAgent_RegistryModeRefusesTheSharedToken(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.api = newFakeAPI()
	h.api.readiness = map[string]cluster.NodeReady{"node-a": {Ready: true}}
	h.api.sources = []cluster.RegistrySource{{Bundle: "4.13.8-x86-64", Release: meta137.Release}}
	fp, puller := newFakePeers(), &fakePuller{}
	h.peers, h.puller = fp, puller
	h.start()
	readsAgain(t, h.api, fp)
	if got := puller.asked(); len(got) != 0 {
		t.Fatalf("pulled %+v on the shared token", got)
	}
	if !strings.Contains(ErrSourceNeedsNodeIdentity.Error(), `set peer.identity = "node"`) {
		t.Errorf("the refusal does not say what to set: %v", ErrSourceNeedsNodeIdentity)
	}
}

// The pulling node publishes its pull in its own entry: the release, the
// digests its tags resolved to, then the bundle's digest; a follower's
// pull, or another resource's, publishes nothing.
func TestWithPullRecord_OnlyThePullersOwnPull(t *testing.T) {
	d := digest.Digest("sha256:" + strings.Repeat("b", 64))
	extras := map[string]digest.Digest{"quay.io/x/y:v1": digest.Digest("sha256:" + strings.Repeat("c", 64))}
	rep := &machine.BundleReport{Name: "4.13.8-x86-64"}
	for name, tc := range map[string]struct {
		p    *pullspec.Status
		want *cluster.PullRecord
	}{
		"resolved":            {&pullspec.Status{Bundle: rep.Name, Release: meta137.Release, Extras: extras}, &cluster.PullRecord{Release: meta137.Release, Extras: extras}},
		"made":                {&pullspec.Status{Bundle: rep.Name, Release: meta137.Release, Extras: extras, Digest: d}, &cluster.PullRecord{Release: meta137.Release, Extras: extras, Digest: d}},
		"nothing resolved":    {&pullspec.Status{Bundle: rep.Name, Release: meta137.Release}, nil},
		"a follower's":        {&pullspec.Status{Bundle: rep.Name, Release: meta137.Release, Digest: d, From: "node-0"}, nil},
		"another resource's":  {&pullspec.Status{Bundle: "other", Release: meta137.Release, Digest: d}, nil},
		"ferry load's, local": {&pullspec.Status{Release: meta137.Release, Digest: d}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			got := withPullRecord(rep, tc.p).Entry.Pull
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// meta137 is the release the pulls here ask for.
var meta137 = bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@sha256:1111111111111111111111111111111111111111111111111111111111111111"}
