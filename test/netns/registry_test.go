package netns

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// TestAgents_RegistryModeEachByteCrossesTheLinkOnce (issue 36): three
// agents with real CRI-Os and the real API server; the site's registry
// behind a link that carries 4 MiB/s and cuts every second large blob
// response midway, which every node's registries.conf mirrors quay.io to.
// The administrator creates an UpgradeBundle whose spec.source names the
// release by digest and an extra image: the first node pulls it, showing
// its progress in the resource, and serves what arrived to the others,
// which follow its pull, receiving blobs from it while it still pulls;
// every node ends loaded with every image pinned, on one digest, the
// others approving the bundle by what it holds; at most 1.05× one copy
// crossed the link; the link is then taken down and the upgrade proceeds
// (desiredUpdate written) as for a bundle.
func TestAgents_RegistryModeEachByteCrossesTheLinkOnce(t *testing.T) {
	e := kubeenv.Start(t, runningRelease)
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.8", PayloadImages: 6, ImageSize: 1 << 20, Seed: 36})
	e.ApproveRelease(release) // the administrator's one command for the cluster upgrade
	link := fixture.NewLink(t, reg, fixture.LinkOptions{CutEvery: 2, Rate: 4 << 20})
	f := registryFleet(t, e, link, 3)
	first := f.nodes[0]
	for _, n := range f.nodes[1:] {
		if n.Name < first.Name {
			first = n
		}
	}

	name := "4.13.8-x86-64"
	// Held, the link lets the pull resolve and fetch the small blobs,
	// not the images' layers: the others follow it while it is held.
	link.Hold()
	e.PatchBundleSpec(name, map[string]any{"source": map[string]any{"release": release, "extraImages": []string{"quay.io/my-company/my-workload:v1"}}})
	for _, n := range f.nodes {
		if n == first {
			continue
		}
		n.A.Wait(agentBound, n.Name+" following "+first.Name+"'s pull, with bytes from it", func(s agent.Status) bool {
			return s.Pull != nil && s.Pull.From == first.Name && s.Pull.State == pull.StateFetching && s.Pull.Bytes > 0
		})
	}
	if s, err := first.A.Status(t.Context()); err != nil || s.Pull == nil || s.Pull.State != pull.StateFetching || s.Pull.Shared == 0 {
		t.Fatalf("the others got bytes from %s's pull before it ended, yet its pull shows %+v (%v)", first.Name, s.Pull, err)
	}
	link.Release()
	waitFor(t, "the first node's pull in the UpgradeBundle, with its progress", func() bool {
		_, nodes := bundleStatus(e, name)
		n, _ := nodes[first.Name].(map[string]any)
		message, _ := n["message"].(string)
		return n["phase"] == "pulling" && n["reason"] == agent.ReasonPulling && message != ""
	})
	var meta *bundle.Metadata
	digest := ""
	var shared int64
	for _, n := range f.nodes {
		s := n.A.Wait(agentBound, n.Name+" cluster-ready", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseClusterReady) || s.Phase == string(agent.PhaseUpgrading)
		})
		switch {
		case s.Pull == nil:
			t.Errorf("%s shows no pull", n.Name)
		case n == first:
			shared = s.Pull.Shared
		case s.Pull.From != first.Name:
			t.Errorf("%s did not follow %s's pull: %+v", n.Name, first.Name, s.Pull)
		}
		if digest == "" {
			digest = string(s.Digest)
		} else if string(s.Digest) != digest {
			t.Fatalf("%s holds %s, another node %s", n.Name, s.Digest, digest)
		}
		for _, r := range s.Bundles {
			if r.Digest == s.Digest && r.Metadata != nil {
				meta = r.Metadata
			}
		}
	}
	if meta == nil || meta.Release != release || len(meta.Images) != 7 {
		t.Fatalf("the bundle pulled: %+v", meta)
	}
	for _, n := range f.nodes {
		n.checkPinned(t, meta, true)
	}
	// The puller serves its work tree only while its pull runs.
	t.Logf("%s served %d bytes to the nodes following its pull while it pulled", first.Name, shared)
	if link.Cuts() < 3 {
		t.Fatalf("the link cut %d responses: the test shows nothing", link.Cuts())
	}
	ratio := float64(link.Sent()) / float64(meta.SizeBytes)
	t.Logf("%d responses cut; %d bytes over the link for a %d-byte release, 3 nodes: %.3f×", link.Cuts(), link.Sent(), meta.SizeBytes, ratio)
	if ratio > 1.05 {
		t.Errorf("%.3f× one copy of the release crossed the link for 3 nodes, want ≤ 1.05×", ratio)
	}

	// The registry gone, the upgrade goes on as for a bundle.
	link.Close()
	waitFor(t, "desiredUpdate to name the pulled release", func() bool {
		du := e.DesiredUpdate()
		return du != nil && du["image"] == release
	})
}

// registryFleet is n agents with real CRI-Os on e's API server, approval
// required, whose registries.conf mirrors quay.io to link (reached at
// the same address inside each node), as a site's nodes would be: each
// with its kubelet's credential and peer.identity = "node", which
// registry mode needs (issue 41).
func registryFleet(t testing.TB, e *kubeenv.Env, link *fixture.Link, n int, more ...func(*Node, *agent.Config)) *fleet {
	t.Helper()
	api, toLink := forwardAPI(t, e), forwardPort(t, linkPort(link))
	ident, _ := nodeIdentities(t, e)
	return newFleet(t, fleetOptions{Nodes: n, CRIO: true, Setup: func(nd *Node, cfg *agent.Config) {
		api(nd, cfg)
		ident(nd, cfg)
		toLink(nd)
		for _, f := range more {
			f(nd, cfg)
		}
		cfg.Approval = "required"
		link.TrustIn(t, cfg.Paths.CertsDir)
		crioenv.Write(t, filepath.Join(filepath.Dir(cfg.Paths.RegistriesConfDir), "registries.conf"), link.RegistriesConf())
	}})
}

// nodeIdentities returns the Setup that gives a node what an OpenShift
// node has for peer.identity = "node": the kubelet's client certificate
// kubeconfig (issued by e's client CA) and a serving certificate for its
// address from the kubelet serving CA, which e publishes as OpenShift
// does; no token. Call it after forwardAPI's Setup (it adds the Node).
// It returns the serving CA too, one per env.
func nodeIdentities(t testing.TB, e *kubeenv.Env) (func(n *Node, cfg *agent.Config), *testca.CA) {
	t.Helper()
	ca, loaded := servingCAs.LoadOrStore(e, testca.New(t, "kubelet-signer"))
	servingCA := ca.(*testca.CA)
	if !loaded {
		e.Create("/api/v1/namespaces/openshift-config-managed/configmaps", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "kubelet-serving-ca"}, "data": map[string]any{"ca-bundle.crt": string(servingCA.PEM)}})
	}
	return func(n *Node, cfg *agent.Config) {
		cfg.Cluster.Kubeconfig = e.NodeCertKubeconfig(n.Name)
		cert, key := servingCA.Serving(t, n.Name, n.IP)
		pki := filepath.Join(n.Dir, "kubelet-pki")
		if err := os.MkdirAll(pki, 0o700); err != nil {
			t.Fatal(err)
		}
		cfg.Peer.Cert = testca.WriteCurrent(t, pki, "kubelet-server", cert, key)
		cfg.Peer.Identity, cfg.Peer.TokenFile = agent.PeerIdentityNode, ""
	}, servingCA
}

// servingCAs is each env's kubelet serving CA (nodeIdentities).
var servingCAs sync.Map

// TestAgents_RegistryModeFollowsNoLiar (issue 41): three agents and a
// fourth party on the peers' network with a valid node certificate,
// node-x's, which offers a real bundle of the release the UpgradeBundle
// asks for whose tagged extra (quay.io/my-company/my-workload:v1) is
// another image than the site registry's, made from another registry,
// and says in its status that it is the pulling node. Every node refuses
// its status (its certificate names another node) and so looks at none of
// its offers (which would be refused anyway: not the bundle the puller
// published through the API); the others follow the node the API names,
// at the address whose certificate names it; nobody asks the liar for a
// byte; all three load the puller's bundle, the tag resolved to the site
// registry's digest on each, in its pins and in the UpgradeBundle. The
// liar holds the gate (a peer the gate cannot read might be a node that
// holds nothing), named on every node and in the UpgradeBundle with the
// administrator's lever, until the administrator excludes it.
func TestAgents_RegistryModeFollowsNoLiar(t *testing.T) {
	e := kubeenv.Start(t, runningRelease)
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	const tag = "quay.io/my-company/my-workload:v1"
	reg := fixture.NewRegistry(t)
	site := reg.PushImage(t, "my-company/my-workload", "v1")
	siteDigest := site[strings.LastIndex(site, "@")+1:]
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.8", PayloadImages: 3, ImageSize: 256 << 10, Seed: 41})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{Rate: 4 << 20})
	_, servingCA := nodeIdentities(t, e)

	// The liar's bundle: the release from the site's registry, the extra
	// under the same tag from another registry, with another image.
	other := fixture.NewRegistry(t)
	forged, err := other.Image(t.Context(), "my-company/my-workload", "v1", "amd64", 8192)
	if err != nil || forged == site {
		t.Fatalf("the other registry's %s: %s (%v), the site's %s: the test shows nothing", tag, forged, err, site)
	}
	lieTar, lieMeta, lieDigest := liarBundle(t, release, tag, reg, other)
	if !slices.Contains(lieMeta.Images, tag+"@"+forged[strings.LastIndex(forged, "@")+1:]) {
		t.Fatalf("the liar's bundle holds %v, want %s at the other registry's digest", lieMeta.Images, tag)
	}

	// The liar: node-x's kubelet certificates, on the host, reached by
	// every node at the same address; it serves its bundle with the peer
	// protocol the agents use and counts every request but its status and
	// its list of offers.
	cert, key := servingCA.Serving(t, "node-x", "127.0.0.1")
	serving := testca.KeyPair(t, cert, key)
	clientCAs := testca.Pool(e.ClientCA)
	liarTLS := &peer.NodeTLS{Serving: func() *tls.Certificate { return &serving }, ClientCAs: func() *x509.CertPool { return clientCAs }}
	var puller atomic.Value // the node it says it is
	puller.Store("")
	var asked, statused atomic.Int64
	var askedFor sync.Map
	shelf := peer.NewShelf(peer.ShelfOptions{})
	t.Cleanup(func() { shelf.Close() })
	tf, err := os.Open(lieTar)
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	fi, _ := tf.Stat()
	metaJSON, _ := json.Marshal(lieMeta)
	if err := shelf.Add(digest.Digest(lieDigest), metaJSON, tf, fi.Size()); err != nil {
		t.Fatal(err)
	}
	srv := peer.NewServer(shelf, peer.ServerOptions{TLS: liarTLS.ServerConfig(),
		Status: func() peer.Status {
			return peer.Status{Node: puller.Load().(string), Phase: "loaded", Digest: digest.Digest(lieDigest), Release: release}
		},
		Pull: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })})
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/status":
			statused.Add(1)
		case "/v1/bundles":
		default:
			asked.Add(1)
			askedFor.Store(r.URL.Path, true)
		}
		srv.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Handshakes fail until node-x has its record (peers refuse it): quiet.
	hs := &http.Server{Handler: counted, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go hs.Serve(tls.NewListener(ln, liarTLS.ServerConfig()))
	t.Cleanup(func() { hs.Close() })
	liar := ln.Addr().String()
	toLiar := forwardPort(t, ln.Addr().(*net.TCPAddr).Port)
	f := registryFleet(t, e, link, 3, func(n *Node, cfg *agent.Config) {
		toLiar(n)
		cfg.Peer.Peers = append(cfg.Peer.Peers, liar)
	})
	first := f.nodes[0]
	for _, n := range f.nodes[1:] {
		if n.Name < first.Name {
			first = n
		}
	}
	puller.Store(first.Name)
	// node-x is a node of the cluster (its Node, its record): its
	// certificate passes every check but the one that binds what it says
	// to the node it names.
	e.AddNode("node-x", "127.0.0.1")
	e.RecordNode("node-x", "127.0.0.1")

	// Held, the link lets the pull resolve, not fetch the layers: the
	// others follow it meanwhile, the liar offering its bundle.
	link.Hold()
	name := "4.13.8-x86-64"
	e.PatchBundleSpec(name, map[string]any{"source": map[string]any{"release": release, "node": first.Name, "extraImages": []string{tag}}})
	for _, n := range f.nodes {
		if n != first {
			n.A.Wait(agentBound, n.Name+" following "+first.Name+"'s pull, with bytes from it", func(s agent.Status) bool {
				return s.Pull != nil && s.Pull.From == first.Name && s.Pull.State == pull.StateFetching && s.Pull.Bytes > 0
			})
		}
	}
	link.Release()
	// The liar holds the gate (it might be a node that holds nothing),
	// named for what it is, with the administrator's lever, on every node
	// and in the UpgradeBundle; once the administrator excludes it, it
	// holds nothing.
	for _, n := range f.nodes {
		n.A.Wait(agentBound, n.Name+" waiting for the liar, named", func(s agent.Status) bool {
			return strings.Contains(s.Message, `certificate names node node-x`) && strings.Contains(s.Message, "spec.excludedNodes")
		})
	}
	waitFor(t, "the UpgradeBundle's entries to name the liar", func() bool {
		_, nodes := bundleStatus(e, name)
		for _, n := range f.nodes {
			entry, _ := nodes[n.Name].(map[string]any)
			if message, _ := entry["message"].(string); !strings.Contains(message, "node-x") {
				return false
			}
		}
		return true
	})
	e.PatchBundleSpec(name, map[string]any{"excludedNodes": []string{"node-x"}})
	held := ""
	var meta *bundle.Metadata
	for _, n := range f.nodes {
		s := n.A.Wait(agentBound, n.Name+" loaded", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseLoaded) || s.Phase == string(agent.PhaseClusterReady) || s.Phase == string(agent.PhaseUpgrading)
		})
		if held == "" {
			held = string(s.Digest)
		} else if string(s.Digest) != held {
			t.Fatalf("%s holds %s, another node %s", n.Name, s.Digest, held)
		}
		if n != first && (s.Pull == nil || s.Pull.From != first.Name) {
			t.Errorf("%s followed %+v, want %s's pull", n.Name, s.Pull, first.Name)
		}
		meta = nil
		for _, r := range s.Bundles {
			if r.Digest == s.Digest && r.Metadata != nil {
				meta = r.Metadata
			}
			if string(r.Digest) == lieDigest {
				t.Errorf("%s acted on the liar's offer: %+v", n.Name, r)
			}
		}
		if meta == nil || !slices.Contains(meta.Images, tag+"@"+siteDigest) {
			t.Fatalf("%s loaded %+v, want %s at the site registry's %s", n.Name, meta, tag, siteDigest)
		}
		n.checkPinned(t, meta, true)
	}
	if held == lieDigest {
		t.Fatalf("the nodes hold the liar's bundle %s", lieDigest)
	}
	// The tag's resolution, as the puller published it for every node.
	_, nodes := bundleStatus(e, name)
	entry, _ := nodes[first.Name].(map[string]any)
	pulled, _ := entry["pull"].(map[string]any)
	extras, _ := pulled["extras"].([]any)
	if len(extras) != 1 || extras[0].(map[string]any)["image"] != tag || extras[0].(map[string]any)["digest"] != siteDigest {
		t.Errorf("%s's UpgradeBundleNode's pull record: %v, want %s resolved to %s", first.Name, pulled, tag, siteDigest)
	}
	if statused.Load() == 0 {
		t.Fatal("no node asked the liar for its status: the test shows nothing")
	}
	if n := asked.Load(); n != 0 {
		var paths []string
		askedFor.Range(func(k, _ any) bool { paths = append(paths, k.(string)); return true })
		t.Fatalf("the liar was asked %d times for its bundle or the pull: %v", n, paths)
	}
	for _, n := range f.nodes {
		c, err := n.cluster(t)
		p, ok := c.Peers[liar]
		if err != nil || !ok || !strings.Contains(p.Unreachable, "its certificate names \"node-x\"") {
			t.Errorf("%s's view of the liar: %+v (%v, %v), want its status refused for the node its certificate names", n.Name, p, ok, err)
		}
	}
}

// liarBundle makes, with `ferry bundle create`, a bundle of release from
// reg whose extra tag comes from other: what a party with another
// registry would offer under the workload's name.
func liarBundle(t *testing.T, release, tag string, reg, other *fixture.Registry) (string, *bundle.Metadata, string) {
	t.Helper()
	certs := t.TempDir()
	for _, r := range []*fixture.Registry{reg, other} {
		if err := os.MkdirAll(filepath.Join(certs, r.Host), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(certs, r.Host, "ca.crt"), r.CAPEM, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	cmd := exec.Command(ferryenv.Binary(t), "bundle", "create", "--release", release, "--extra-image", tag,
		"--mirror", reg.Mirror(), "--mirror", fixture.Upstream+"/my-company/="+other.Host+"/my-company/",
		"--cert-dir", certs, "--signature-store", "", "--output", out, "--quiet")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ferry bundle create: %v\n%s", err, b)
	}
	tarPath := filepath.Join(out, "upgrade-4.13.8-x86_64.tar")
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, meta, sidecarDigest(t, tarPath)
}

// linkPort is the port link listens on (on the host's loopback).
func linkPort(link *fixture.Link) int {
	port, _ := strconv.Atoi(link.Host()[strings.LastIndex(link.Host(), ":")+1:])
	return port
}
