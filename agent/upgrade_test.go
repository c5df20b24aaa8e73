package agent

import (
	"context"
	"errors"
	"github.com/ferry-edge/ferry/agent/machine"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/cluster"
)

// fakeAPI is the cluster's API as the agent sees it: the test plays the
// cluster version operator by setting the upgrade's status.
type fakeAPI struct {
	mu       sync.Mutex
	nodes    map[string]map[string]string // node → annotations
	writes   int
	starts   []cluster.Upgrade
	failN    int // fail this many more StartUpgrade calls
	status   map[string]cluster.UpgradeStatus
	history  []map[string]string // every annotation write, in order
	annoFail int
	addrs    map[string]string
	machines int                           // the MCO's count of nodes (0: no MCO)
	mco      map[string]cluster.NodeUpdate // node → the MCO's state (zero: no MCO)
	mcoReads int
	// sourceReads counts the reads of the UpgradeBundles' sources.
	sourceReads int
	labels      map[string]map[string]string  // node → labels
	sources     []cluster.RegistrySource      // the UpgradeBundles' spec.source
	pulls       map[string]cluster.PullRecord // the pull records in the nodes' entries, by node
	followAll   bool                          // FollowEntries(true) last
	// the UpgradeBundle resources, by name; readiness of the Nodes
	bundles   map[string]*fakeBundle
	readiness map[string]cluster.NodeReady
	events    []string          // type/reason/message of each Event
	pre       cluster.Preflight // what Preflight answers
	preErr    error
	preAsked  []string // the versions asked about
	changed   signal   // fired as a watch would: the test changed the cluster
}

func (f *fakeAPI) Changes() <-chan struct{} { return f.changed.c() }

func newFakeAPI() *fakeAPI {
	return &fakeAPI{nodes: map[string]map[string]string{}, status: map[string]cluster.UpgradeStatus{}}
}

func (f *fakeAPI) Preflight(_ context.Context, version string, _ []string) (cluster.Preflight, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.preAsked = append(f.preAsked, version)
	return f.pre, f.preErr
}

func (f *fakeAPI) Annotate(_ context.Context, node string, ann, labels map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.labels == nil {
		f.labels = map[string]map[string]string{}
	}
	if f.labels[node] == nil {
		f.labels[node] = map[string]string{}
	}
	maps.Copy(f.labels[node], labels)
	if f.annoFail > 0 {
		f.annoFail--
		return errors.New("the API server is down")
	}
	n := f.nodes[node]
	if n == nil {
		n = map[string]string{}
		f.nodes[node] = n
	}
	for k, v := range ann {
		if v == "" {
			delete(n, k)
		} else {
			n[k] = v
		}
	}
	f.writes++
	f.history = append(f.history, maps.Clone(n))
	return nil
}

func (f *fakeAPI) StartUpgrade(_ context.Context, u cluster.Upgrade) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failN > 0 {
		f.failN--
		return errors.New("connection refused")
	}
	f.starts = append(f.starts, u)
	if _, ok := f.status[u.Release]; !ok {
		f.status[u.Release] = cluster.UpgradeStatus{State: cluster.UpgradePending}
	}
	return nil
}

func (f *fakeAPI) UpgradeStatus(_ context.Context, release string) (cluster.UpgradeStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status[release], nil
}

func (f *fakeAPI) NodeAddresses(context.Context) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.addrs), nil
}

func (f *fakeAPI) MachineCount(context.Context) (int, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.machines, f.machines > 0, nil
}

func (f *fakeAPI) NodeUpdate(_ context.Context, node string) (cluster.NodeUpdate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mcoReads++
	return f.mco[node], nil
}

// setNode plays the machine config operator on node.
func (f *fakeAPI) setNode(node string, st cluster.NodeUpdate) {
	f.mu.Lock()
	if f.mco == nil {
		f.mco = map[string]cluster.NodeUpdate{}
	}
	f.mco[node] = st
	f.mu.Unlock()
	f.changed.fire()
}

func (f *fakeAPI) set(release string, st cluster.UpgradeStatus) {
	f.mu.Lock()
	f.status[release] = st
	f.mu.Unlock()
	f.changed.fire()
}

func (f *fakeAPI) annotation(node, key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[node][key]
}

func (f *fakeAPI) sawPhase(node, phase string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.history {
		if h[machine.AnnotationPhase] == phase {
			return true
		}
	}
	return false
}

func apiHarness(t *testing.T) (*harness, *fakeAPI) {
	h := newHarness(t, t.TempDir())
	api := newFakeAPI()
	h.api = api
	return h, api
}

func TestUpgrade_StartsFollowsAndCleansUpThroughTheAPI(t *testing.T) {
	h, api := apiHarness(t)
	marker := filepath.Join(t.TempDir(), "hook.out")
	h.cfg.Cluster.OnReady = []string{"/bin/sh", "-c", "echo $FERRY_VERSION $FERRY_RELEASE $FERRY_DIGEST >> " + marker}
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(machine.PhaseClusterReady)
	h.waitFor("the upgrade asked for", func() bool { api.mu.Lock(); defer api.mu.Unlock(); return len(api.starts) == 1 })
	release := h.agent.Status().Release
	if u := api.starts[0]; u.Release != release || u.Version != "4.13.7" || u.Force {
		t.Fatalf("asked for %+v", u)
	}
	hookSaw := "4.13.7 " + release + " " + string(digest) + "\n"
	h.waitFor("the hook after the API", func() bool { b, _ := os.ReadFile(marker); return string(b) == hookSaw })

	const working = "Working towards 4.13.7: 106 of 841 done (12% complete)"
	api.set(release, cluster.UpgradeStatus{State: cluster.UpgradeRunning, Message: working})
	s := h.waitPhase(machine.PhaseUpgrading)
	if s.Reason != machine.ReasonUpgrading || s.ClusterMessage != working || !strings.Contains(s.Line, s.ClusterMessage) {
		t.Fatalf("status %+v", s)
	}
	h.waitFor("the progress annotated", func() bool {
		return api.annotation("node-a", machine.AnnotationProgress) == working
	})
	api.set(release, cluster.UpgradeStatus{State: cluster.UpgradeCompleted, Message: "Cluster version is 4.13.7"})
	s = h.waitPhase(machine.PhaseUpgraded)
	h.waitFor("the bundle retired", func() bool { s := h.agent.Status(); return s.Phase == "upgraded" && s.Reason == machine.ReasonUpgraded })
	h.loader.mu.Lock()
	if len(h.loader.retires) != 1 {
		t.Errorf("retired %d times", len(h.loader.retires))
	}
	h.loader.mu.Unlock()
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); err != nil || !h.record().Retained {
		t.Fatalf("the running release's tree is not kept after the upgrade: %v", err)
	}
	h.waitFor("upgraded annotated", func() bool { return api.annotation("node-a", machine.AnnotationPhase) == "upgraded" })
	for _, p := range []string{"detected", "loading", "cluster-ready", "upgrading", "upgraded"} {
		if !api.sawPhase("node-a", p) {
			t.Errorf("the Node was never annotated %s", p)
		}
	}
	if got := api.annotation("node-a", machine.AnnotationDigest); got != string(digest) {
		t.Errorf("digest annotation %q", got)
	}
	if got := api.annotation("node-a", machine.AnnotationBundle); got != "4.13.7-x86_64" {
		t.Errorf("bundle annotation %q", got)
	}
	// Nothing changes, nothing is written: once the Node shows the final
	// status (a progress-only change may still be held back), no write.
	h.waitFor("the Node to show the final status", func() bool {
		for k, v := range machine.Annotations(h.agent.Status()) {
			if api.annotation("node-a", k) != v {
				return false
			}
		}
		return true
	})
	api.mu.Lock()
	n := api.writes
	api.mu.Unlock()
	h.annotateTakesTwice()
	api.mu.Lock()
	defer api.mu.Unlock()
	if api.writes != n {
		t.Errorf("%d annotation writes while nothing changed", api.writes-n)
	}
	if len(api.starts) != 1 {
		t.Errorf("the upgrade was asked for %d times", len(api.starts))
	}
}

func TestUpgrade_AnUnreachableAPIIsRetriedAndNothingIsLost(t *testing.T) {
	h, api := apiHarness(t)
	api.failN = 2
	api.annoFail = 3
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(machine.PhaseClusterReady)
	// Waited on, not read once: the fake counts the ask that succeeds
	// before the agent hears of it (the retries' backoff is real time,
	// 1 s then 2 s; only the bound limits how long that may take).
	h.waitFor("the ask accepted after the failures, in the record", func() bool {
		rec := upgradeRun(h.agent.Status())
		return rec != nil && !rec.Accepted.IsZero() && rec.Error == ""
	})
	h.waitFor("the phase annotated once the API answers", func() bool { return api.annotation("node-a", machine.AnnotationPhase) == "cluster-ready" })
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.starts) != 1 || api.failN != 0 || api.annoFail != 0 {
		t.Fatalf("%d accepted asks (want 1), %d failures and %d failed annotations left (want 0)", len(api.starts), api.failN, api.annoFail)
	}
}

// annotateTakesTwice turns the loop twice (a proceed it refuses: the
// status is the same) and waits each time for annotate to take what the
// turn published. annotate takes one at a time: once it took the second,
// it has done with the first, written or not; no sleep needed to see
// that nothing was written.
func (h *harness) annotateTakesTwice() {
	h.t.Helper()
	for range 2 {
		if err := h.agent.Request(h.t.Context(), "proceed", nil); err == nil {
			h.t.Fatal("proceed accepted")
		}
		h.waitFor("annotate to take the newest annotations", func() bool { return len(h.agent.annotations) == 0 })
	}
}

// upgradeRun is the ask for the cluster upgrade of the bundle that has
// one, nil when none.
func upgradeRun(s machine.Status) *machine.UpgradeRun {
	for _, r := range s.Bundles {
		if r.Upgrade != nil {
			return r.Upgrade
		}
	}
	return nil
}

func TestUpgrade_PeersComeFromTheAPIWhenTheConfigNamesNone(t *testing.T) {
	h, api := apiHarness(t)
	api.addrs = map[string]string{"node-a": "10.0.0.1", "node-b": "10.0.0.2", "node-c": "10.0.0.3"}
	p := newFakePeers()
	h.peers = p
	h.cfg.Peer.Listen = ":9000"
	h.start()
	h.waitFor("the peer list from the API", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return strings.Join(p.peerList, " ") == "10.0.0.2:9000 10.0.0.3:9000"
	})
	// With peers, loading waits for them to hold the bundle.
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	r := h.waitWhy(machine.ReasonPeersNotHolding)
	if !strings.Contains(r.Condition.Message, "10.0.0.2:9000") || r.Phase != machine.PhaseExtracted {
		t.Fatalf("record %s %+v", r.Phase, r.Condition)
	}
}

// TestUpgrade_WaitsForANodeWithoutFerryUntilExcluded: the machine config
// operator counts 2 nodes, only this one has a record: loaded, the node
// stays loaded saying why, the summary counts the other, nothing is asked;
// the administrator excludes it by name and the upgrade is asked.
func TestUpgrade_WaitsForANodeWithoutFerryUntilExcluded(t *testing.T) {
	h, api := apiHarness(t)
	api.addrs, api.machines = map[string]string{"node-a": "10.0.0.1"}, 2
	api.create(ResourceName("4.13.7", "x86_64"))
	h.peers = newFakePeers()
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	r := h.waitWhy(machine.ReasonNodesWithoutFerry)
	if r.Phase != machine.PhaseLoaded {
		t.Fatalf("record %s %+v", r.Phase, r.Condition)
	}
	name := machine.ResourceName("4.13.7", "x86_64")
	h.waitFor("nodesReady 1/2", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.bundles[name] != nil && api.bundles[name].sum.NodesReady == "1/2"
	})
	api.mu.Lock()
	asked := len(api.starts)
	api.mu.Unlock()
	if asked != 0 {
		t.Fatalf("the upgrade asked with a node without ferry")
	}
	api.setPolicy(name, cluster.BundlePolicy{ExcludedNodes: []string{"node-b"}})
	h.waitPhase(machine.PhaseClusterReady)
	h.waitFor("the upgrade asked", func() bool { api.mu.Lock(); defer api.mu.Unlock(); return len(api.starts) == 1 })
}

// fakeBundle is an UpgradeBundle as the fake API holds it.
type fakeBundle struct {
	policy cluster.BundlePolicy
	sum    cluster.BundleSummary
	nodes  map[string]cluster.BundleNodeEntry
}

func (f *fakeAPI) UpgradeBundle(_ context.Context, name string) (cluster.BundleView, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bundles[name]
	if b == nil {
		return cluster.BundleView{}, false, nil
	}
	return cluster.BundleView{UID: "uid-" + name, Policy: b.policy, Nodes: maps.Clone(b.nodes)}, true, nil
}

// create plays the administrator creating an UpgradeBundle with an
// empty spec (a node creates none).
func (f *fakeAPI) create(name string) {
	f.setPolicy(name, cluster.BundlePolicy{})
}

func (f *fakeAPI) PublishBundle(_ context.Context, name string, sum *cluster.BundleSummary, node string, e cluster.BundleNodeEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bundles[name]
	if b == nil {
		return errors.New("upgradebundle " + name + " not found")
	}
	b.nodes[node] = e
	if sum != nil {
		b.sum = *sum
	}
	return nil
}

func (f *fakeAPI) FollowEntries(all bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.followAll = all
}

func (f *fakeAPI) PullRecord(_ context.Context, _, node string) (*cluster.PullRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rec, ok := f.pulls[node]; ok {
		return &rec, nil
	}
	return nil, nil
}

func (f *fakeAPI) BundleEvent(_ context.Context, name, uid, node, typ, reason, msg string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, typ+"/"+reason+"/"+msg)
	return nil
}

func (f *fakeAPI) NodeReadiness(context.Context) (map[string]cluster.NodeReady, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readiness == nil {
		return map[string]cluster.NodeReady{"node-a": {Ready: true}}, nil
	}
	return maps.Clone(f.readiness), nil
}

// setPolicy plays the administrator writing an UpgradeBundle's spec.
func (f *fakeAPI) setPolicy(name string, p cluster.BundlePolicy) {
	defer f.changed.fire()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bundles == nil {
		f.bundles = map[string]*fakeBundle{}
	}
	if f.bundles[name] == nil {
		f.bundles[name] = &fakeBundle{nodes: map[string]cluster.BundleNodeEntry{}}
	}
	f.bundles[name].policy = p
}

func (f *fakeAPI) bundle(name string) (fakeBundle, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bundles[name]
	if b == nil {
		return fakeBundle{}, false
	}
	c := *b
	c.nodes = maps.Clone(b.nodes)
	return c, true
}

func (f *fakeAPI) Sources(context.Context) ([]cluster.RegistrySource, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sourceReads++
	return slices.Clone(f.sources), nil
}

func (f *fakeAPI) Approvals(context.Context) ([]cluster.Approval, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cluster.Approval
	for name, b := range f.bundles {
		if b.policy.ApprovedDigest != "" {
			out = append(out, cluster.Approval{Bundle: name, Digest: b.policy.ApprovedDigest})
		}
	}
	return out, nil
}
