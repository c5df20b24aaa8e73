package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/test/cvoverify"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// demoRunning is the release the demo's cluster runs before the upgrade.
const demoRunning = "quay.io/openshift-release-dev/ocp-release@sha256:1111111111111111111111111111111111111111111111111111111111111111"

// demoAPI is the demo's cluster: a real kube-apiserver on the host, which
// the node reaches at APIAddr through its QEMU's forward to sock.
type demoAPI struct {
	t    *testing.T
	env  *kubeenv.Env
	sock string
}

func startDemoAPI(t *testing.T) *demoAPI {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := kubeenv.Start(t, demoRunning)
	e.InstallFerry()
	e.InstallUpgradeBundles(filepath.Join(root, "packaging/upgradebundle-crd.yaml"))
	e.AddNode("node1", "10.0.2.15")
	return &demoAPI{t: t, env: e, sock: fixture.ForwardUnix(t, strings.TrimPrefix(e.Server, "https://"))}
}

// files are what the node's kubelet would have: its client certificate
// (system:node:NAME, from the API server's client CA) and the API's CA,
// and ferry's kubeconfig naming them, the API at its forwarded address.
func (a *demoAPI) files(node string) Layer {
	kc := a.env.NodeCertKubeconfig(node)
	pem, err := os.ReadFile(filepath.Join(filepath.Dir(kc), "pki", "kubelet-client-current.pem"))
	if err != nil {
		a.t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(a.env.Dir, "certs", "apiserver.crt"))
	if err != nil {
		a.t.Fatal(err)
	}
	guestKC := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster: {server: "https://%s", certificate-authority: /var/lib/kubelet/ca.crt, tls-server-name: "127.0.0.1"}
users:
- name: kubelet
  user: {client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem, client-key: /var/lib/kubelet/pki/kubelet-client-current.pem}
contexts: [{name: kubelet, context: {cluster: cluster, user: kubelet}}]
current-context: kubelet
`, APIAddr)
	return Layer{
		"/var/lib/kubelet/kubeconfig":                     {Data: []byte(guestKC), Mode: 0o600},
		"/var/lib/kubelet/ca.crt":                         {Data: ca},
		"/var/lib/kubelet/pki/kubelet-client-current.pem": {Data: pem, Mode: 0o600},
	}
}

// nodeConfig is the node's config with the cluster's API: approval
// required (the administrator's, in the UpgradeBundle), the upgrade
// started by ferry once every node is loaded.
func (a *demoAPI) nodeConfig(node string) string {
	return fmt.Sprintf("node_name = %q\n\n[peer]\nlisten = \"\"\n\n[cluster]\nschedule = \"Automatic\"\nkubeconfig = \"/var/lib/kubelet/kubeconfig\"\n", node)
}

// getUpgradeBundles prints the UpgradeBundles as oc get does, with the
// CRD's printer columns.
func (a *demoAPI) getUpgradeBundles() string {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Status map[string]any `json:"status"`
		} `json:"items"`
	}
	if err := a.env.Admin.Raw(context.Background(), "GET", "/apis/ferry.io/v1alpha1/upgradebundles", "", nil, &list); err != nil {
		a.t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s %-9s %-14s %-12s %s\n", "NAME", "VERSION", "PHASE", "NODES READY", "APPROVED")
	for _, it := range list.Items {
		st := func(k string) string { v, _ := it.Status[k].(string); return v }
		fmt.Fprintf(&b, "%-16s %-9s %-14s %-12s %s\n", it.Metadata.Name, st("version"), st("phase"), st("nodesReady"), st("approved"))
	}
	return b.String()
}

// getNodes prints nodes with their ferry.io/phase label and digest, as
// oc get nodes -L ferry.io/phase does.
func (a *demoAPI) getNodes(names ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %-12s %s\n", "NAME", "PHASE", "FERRY.IO/DIGEST")
	for _, n := range names {
		fmt.Fprintf(&b, "%-8s %-12s %s\n", n, a.env.NodeLabels(n)["ferry.io/phase"], sha256digest.Short(a.env.Annotations(n)["ferry.io/digest"]))
	}
	return b.String()
}

// TestDemo is `make demo` (test/vm/demo.sh): the main job end to end,
// narrated for a person watching — a bundle made with `ferry bundle
// create`, written to a USB stick, plugged into a node VM with real
// systemd, udev, D-Bus and CRI-O, and every image ending pinned. It runs
// only with FERRY_DEMO=1; the scenarios prove the same with assertions.
func TestDemo(t *testing.T) {
	if os.Getenv("FERRY_DEMO") != "1" {
		t.Skip("the narrated demo runs with FERRY_DEMO=1 (make demo)")
	}
	say := func(format string, a ...any) { fmt.Printf("\n==> "+format+"\n", a...) }
	show := func(text string) {
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			fmt.Println("    " + l)
		}
	}
	demoStart := time.Now()
	say("Preparing the node image (Debian 12 + systemd + udev + D-Bus + CRI-O 1.34; cached after the first run)")
	e := setup(t)
	ctx := t.Context()
	fmt.Printf("    accelerator: %s (%s)\n", e.accel, e.why())

	n := 20
	fmt.Sscan(os.Getenv("FERRY_VM_IMAGES"), &n)
	say("Making an upgrade bundle: a synthetic OpenShift release with %d payload images, served by a local registry", n)
	b := makeBundle(t, ctx, e, "4.13.7", n, 1<<20)
	if b.Command != "" {
		fmt.Println("    $ " + b.Command)
		show(b.Output)
	}
	fmt.Printf("    %s  %.1f MiB  %s\n", filepath.Base(b.Tar), float64(b.Bytes)/(1<<20), b.Digest)

	say("Writing it to a USB stick (FAT32): %s and %s", filepath.Base(b.Tar), filepath.Base(b.SHA))
	stick := filepath.Join(t.TempDir(), "stick.img")
	if err := MakeVFATStick(ctx, stick, b.Tar, b.SHA); err != nil {
		t.Fatal(err)
	}

	say("Starting the cluster's API: a real kube-apiserver and etcd with OpenShift's ClusterVersion CRD, and what ferry ships for it (packaging/upgradebundle-crd.yaml, rbac.yaml, admission.yaml)")
	api := startDemoAPI(t)
	fmt.Printf("    %s, running %s\n", api.env.Server, demoRunning)

	say("Booting node1 under QEMU; ferry runs as a systemd service with its packaged unit, as the node's kubelet (system:node:node1) towards the API")
	v := e.bootWith(t, ctx, Node{Name: "node1", Addr: "10.0.2.15/24", Config: api.nodeConfig("node1"), Extra: api.files("node1")},
		Config{Name: "node1", CPUs: 2, API: api.sock})
	bi, err := v.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("    booted in %.0fs; system %s\n", bi.HostSeconds, bi.SystemState)
	fmt.Println("    $ systemctl is-active crio ferry")
	show(try(t, ctx, v, "systemctl is-active crio ferry").Stdout)
	fmt.Println("    $ ferry status")
	show(try(t, ctx, v, "ferry status").Stdout)

	say("Plugging the stick into node1 (QMP: device_add usb-storage on the xhci bus)")
	start := time.Now()
	if err := v.PlugUSB(ctx, "stick", stick, true); err != nil {
		t.Fatal(err)
	}
	last := ""
	follow := func(done func(ferryStatus) bool) {
		waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool {
			if s.Line != last && s.Line != "" {
				fmt.Printf("    %5.1fs  %-13s %s\n", time.Since(start).Seconds(), s.Phase, s.Line)
				last = s.Line
			}
			return done(s)
		}, func(s ferryStatus) bool { return s.Phase == "rejected" || s.Phase == "failed" || s.Phase == "conflict" })
	}
	follow(func(s ferryStatus) bool {
		return s.Phase == "extracted" && s.Digest == b.Digest && s.Reason == "AwaitingApproval"
	})
	bundleName := "4.13.7-x86-64"
	// No UpgradeBundle yet (a node creates none): the node says so on
	// its Node.
	fmt.Println("    $ oc get nodes -L ferry.io/phase")
	show(api.getNodes("node1"))

	say("The administrator creates the UpgradeBundle with the engineer's digest (from the bundle's .sha256, never from a node): ferry approve, or")
	fmt.Printf("    $ oc apply -f - <<<'{\"apiVersion\":\"ferry.io/v1alpha1\",\"kind\":\"UpgradeBundle\",\"metadata\":{\"name\":\"%s\"},\"spec\":{\"approvedDigest\":\"%s\"}}'\n", bundleName, b.Digest)
	api.env.PatchBundleSpec(bundleName, map[string]any{"approvedDigest": b.Digest})
	say("And the release for the cluster upgrade, once (ferry bundle verify prints the command)")
	fmt.Println("    $ " + cluster.ApproveCommand(b.Meta.Release))
	api.env.ApproveRelease(b.Meta.Release)
	follow(func(s ferryStatus) bool { return s.loadedWith(b.Digest) })
	took := time.Since(start)
	fmt.Printf("    loaded %.1fs after the plug\n", took.Seconds())

	say("What a technician sees: systemctl status ferry")
	show(try(t, ctx, v, "systemctl status ferry --no-pager -l -n 8").Stdout)

	say("Images in CRI-O (crictl, through the CRI socket)")
	imgs := guestImages(t, ctx, v)
	pinned := 0
	for _, ref := range b.Refs {
		state := "MISSING"
		for _, im := range imgs {
			for _, d := range im.RepoDigests {
				if d == ref {
					state = map[bool]string{true: "pinned", false: "NOT PINNED"}[im.Pinned]
				}
			}
		}
		if state == "pinned" {
			pinned++
		}
		fmt.Printf("    %-10s %s\n", state, ref)
	}
	fmt.Printf("    %d of %d images present and pinned\n", pinned, len(b.Refs))
	if pinned != len(b.Refs) {
		t.Errorf("%d of %d images pinned", pinned, len(b.Refs))
	}

	say("Every node loaded: ferry asks the cluster for the upgrade (the release's signatures as a ConfigMap, then ClusterVersion's desiredUpdate)")
	var du map[string]any
	for deadline := time.Now().Add(loadTimeout); du == nil || du["image"] != b.Meta.Release; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("no desiredUpdate for %s: %v", b.Meta.Release, du)
		}
		du = api.env.DesiredUpdate()
	}
	fmt.Println("    $ oc get clusterversion version -o jsonpath='{.spec.desiredUpdate}'")
	fmt.Printf("    %v\n", du)
	// What the version operator does first: verify the release's
	// signature, from ferry's ConfigMap, against the key it trusts.
	cvo, err := cvoverify.Trusting(releasesig.Test().PublicArmored(), api.env.Admin)
	if err == nil {
		err = cvo.VerifyDesiredUpdate(ctx)
	}
	if err != nil {
		t.Fatalf("the version operator's verifier refuses the release: %v", err)
	}
	fmt.Println("    the version operator's verifier accepts the release's signature (the test key as Red Hat's)")

	say("The demo plays the cluster version operator: the upgrade runs, then completes")
	api.env.SetHistory(kubeenv.History{State: "Partial", Image: b.Meta.Release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: demoRunning, Version: "4.13.6"})
	api.env.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "True", Message: "Working towards 4.13.7: 412 of 841 done (48% complete)"})
	follow(func(s ferryStatus) bool {
		return s.Phase == "upgrading" && s.ClusterMessage == "Working towards 4.13.7: 412 of 841 done (48% complete)"
	})
	// The operator's last word first, then the history's: the node takes
	// the message it sees with the completed entry.
	api.env.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "False", Message: "Cluster version is 4.13.7"})
	api.env.SetHistory(kubeenv.History{State: "Completed", Image: b.Meta.Release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: demoRunning, Version: "4.13.6"})
	follow(func(s ferryStatus) bool { return s.Phase == "upgraded" })
	fmt.Println("    $ oc get upgradebundles")
	show(api.getUpgradeBundles())
	fmt.Println("    $ oc get nodes -L ferry.io/phase")
	show(api.getNodes("node1"))
	fmt.Println("    $ ferry status")
	show(try(t, ctx, v, "ferry status").Stdout)
	if got := api.env.NodeLabels("node1")["ferry.io/phase"]; got != "upgraded" {
		t.Errorf("node1's ferry.io/phase is %q, want upgraded", got)
	}

	say("Pulling the stick out: the node keeps its images")
	if err := v.UnplugUSB(ctx, "stick"); err != nil {
		t.Fatal(err)
	}
	fmt.Println("    $ ferry status")
	show(try(t, ctx, v, "sleep 1; ferry status").Stdout)

	say("Done: stick plugged -> %d images pinned in %.1fs -> the cluster upgraded through its API (demo took %.0fs)", len(b.Refs), took.Seconds(), time.Since(demoStart).Seconds())
}
