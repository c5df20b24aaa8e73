// Package kubeenv runs a real Kubernetes API for tests: Debian's etcd and a
// kube-apiserver built from the Go module proxy (test/setup/
// build-apiserver.sh caches it with OpenShift's real ClusterVersion and
// MachineConfigPool CRDs), with token auth, RBAC on, and ServiceAccount
// tokens. Nothing acts on ClusterVersion or the pools: the test plays the
// cluster version operator by writing ClusterVersion's status, and the
// machine config operator by writing pools and Node annotations. With CI=true a missing piece fails the test, elsewhere it
// skips it.
package kubeenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/freeport"
)

const kubeVersion = "v1.34.4"

// Env is a running API server.
type Env struct {
	t       testing.TB
	Dir     string
	Port    int
	Server  string       // https://127.0.0.1:port
	Admin   *kube.Client // system:masters
	AdminKC string       // its kubeconfig
	// ClientCA is the API server's client CA (--client-ca-file): it signs
	// the kubelet-shaped certificates of NodeCertKubeconfig, as
	// OpenShift's csr-signer signs the kubelets'.
	ClientCA *testca.CA
	bin      string
	etcd     *exec.Cmd
	api      *exec.Cmd
	etcdURL  string
}

// Start starts etcd and kube-apiserver, installs the ClusterVersion CRD,
// the namespace signatures go to, and ClusterVersion "version" as an
// installed cluster has it (history: one Completed entry of current).
// In a package whose TestMain runs Main, the pair was started while the
// test before ran.
func Start(t testing.TB, current string) *Env {
	t.Helper()
	crioenv.Need(t, os.Geteuid() == 0, "needs root")
	cache := os.Getenv("FERRY_CACHE")
	if cache == "" {
		cache = "/var/cache/ferry-test"
	}
	bin := filepath.Join(cache, "kube-"+kubeVersion)
	_, err := os.Stat(filepath.Join(bin, "kube-apiserver"))
	crioenv.Need(t, err == nil, "no kube-apiserver in %s: run bash test/setup/build-apiserver.sh", bin)
	_, err = exec.LookPath("etcd")
	crioenv.Need(t, err == nil, "no etcd: apt-get install etcd-server (test/setup/install-deps.sh)")

	e := pool.take(t, bin)
	e.SetHistory(History{State: "Completed", Image: current, Version: "4.13.6"})
	return e
}

// boot starts etcd and kube-apiserver for Start, and creates the CRD, the
// namespaces and ClusterVersion "version" (no status yet).
func boot(t testing.TB, bin string) *Env {
	t.Helper()
	e := &Env{t: t, Dir: t.TempDir(), bin: bin}
	eport, port := freeport.Port(t, "127.0.0.1"), freeport.Port(t, "127.0.0.1")
	e.Port = port
	e.Server = "https://127.0.0.1:" + strconv.Itoa(port)
	e.etcdURL = "http://127.0.0.1:" + strconv.Itoa(eport)
	must(t, os.WriteFile(filepath.Join(e.Dir, "tokens.csv"), []byte("admintoken,admin,admin,system:masters\nnobodytoken,nobody,nobody\n"), 0o600))
	e.ClientCA = testca.New(t, "kube-csr-signer")
	must(t, os.WriteFile(filepath.Join(e.Dir, "client-ca.crt"), e.ClientCA.PEM, 0o600))
	run(t, "openssl", "genrsa", "-out", filepath.Join(e.Dir, "sa.key"), "2048")
	run(t, "openssl", "rsa", "-in", filepath.Join(e.Dir, "sa.key"), "-pubout", "-out", filepath.Join(e.Dir, "sa.pub"))
	e.etcd = e.spawn("etcd.log", "etcd", "--data-dir", filepath.Join(e.Dir, "etcd"),
		"--listen-client-urls", e.etcdURL, "--advertise-client-urls", e.etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(freeport.Port(t, "127.0.0.1")))
	e.StartAPIServer()
	t.Cleanup(e.stop)

	e.AdminKC = e.kubeconfig("admin", "admintoken", true)
	var err error
	e.Admin, err = kube.New(e.AdminKC, nil)
	must(t, err)
	e.waitReady()
	e.ApplyFile(filepath.Join(bin, "clusterversions.crd.yaml"))
	e.waitCRD()
	for _, ns := range []string{"openshift-config-managed", "openshift-config"} {
		e.Create("/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	}
	e.Create("/apis/config.openshift.io/v1/clusterversions", map[string]any{
		"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion", "metadata": map[string]any{"name": "version"},
		"spec": map[string]any{"clusterID": "0b4f5b1e-5d7a-4c62-8a5e-2f2f1a7f4c11", "channel": "stable-4.13"},
	})
	return e
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the
// same port and etcd.
func (e *Env) StartAPIServer() {
	e.api = e.spawn("apiserver.log", filepath.Join(e.bin, "kube-apiserver"),
		"--etcd-servers="+e.etcdURL, "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(e.Port),
		"--cert-dir="+filepath.Join(e.Dir, "certs"), "--token-auth-file="+filepath.Join(e.Dir, "tokens.csv"),
		"--client-ca-file="+filepath.Join(e.Dir, "client-ca.crt"),
		// As OpenShift: the Node authorizer gives kubelets their rights;
		// NodeRestriction is left out, so that ferry's own policies are
		// what refuses a node writing another's Node.
		"--authorization-mode=Node,RBAC", "--service-account-issuer=https://kubernetes.default.svc",
		// As OpenShift: only who may delete an object sets its owners
		// (ferry's Leases, owned by their Nodes).
		"--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
		"--service-account-key-file="+filepath.Join(e.Dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(e.Dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24")
	if e.Admin != nil {
		e.waitReady()
	}
}

// Kubectl is the path of the kubectl built beside kube-apiserver, of the
// same release (test/setup/build-apiserver.sh): the docs' commands and
// oc wait's run with it, never with whatever kubectl a machine has.
func (e *Env) Kubectl() string {
	p := filepath.Join(e.bin, "kubectl")
	_, err := os.Stat(p)
	crioenv.Need(e.t, err == nil, "no kubectl in %s: run bash test/setup/build-apiserver.sh", e.bin)
	return p
}

// StopAPIServer stops kube-apiserver (etcd stays): the API is down.
func (e *Env) StopAPIServer() {
	if e.api != nil && e.api.Process != nil {
		e.api.Process.Signal(syscall.SIGTERM)
		e.api.Wait()
		e.api = nil
	}
}

func (e *Env) stop() {
	e.StopAPIServer()
	if e.etcd != nil && e.etcd.Process != nil {
		e.etcd.Process.Kill()
		e.etcd.Wait()
	}
}

func (e *Env) spawn(logName, name string, args ...string) *exec.Cmd {
	e.t.Helper()
	f, err := os.Create(filepath.Join(e.Dir, logName))
	must(e.t, err)
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(e.t, cmd.Start())
	return cmd
}

// Log is the API server's log, for a failing test.
func (e *Env) Log() string {
	b, _ := os.ReadFile(filepath.Join(e.Dir, "apiserver.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (e *Env) waitReady() {
	e.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := e.Admin.Raw(context.Background(), "GET", "/readyz", "", nil, nil)
		if err == nil || strings.Contains(err.Error(), "not the JSON expected") {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("kube-apiserver not ready after 90 s: %v\n%s", err, e.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (e *Env) waitCRD() {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := e.Admin.Raw(context.Background(), "GET", "/apis/config.openshift.io/v1/clusterversions", "", nil, nil); err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the ClusterVersion CRD never became established")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kubeconfig writes a kubeconfig for token; with the API server's own
// certificate as its CA (verified), or insecure for the harness itself.
func (e *Env) kubeconfig(name, token string, insecure bool) string {
	cluster := fmt.Sprintf("{server: %q, insecure-skip-tls-verify: true}", e.Server)
	if !insecure {
		cluster = fmt.Sprintf("{server: %q, certificate-authority: %q}", e.Server, filepath.Join(e.Dir, "certs", "apiserver.crt"))
	}
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: %s}]\nusers: [{name: u, user: {token: %q}}]\ncontexts: [{name: t, context: {cluster: t, user: u}}]\ncurrent-context: t\n", cluster, token)
	p := filepath.Join(e.Dir, name+".kubeconfig")
	must(e.t, os.WriteFile(p, []byte(kc), 0o600))
	return p
}

// ServiceAccountKubeconfig is a kubeconfig with a real token of the
// ServiceAccount ns/name (TokenRequest), checking the server's certificate.
func (e *Env) ServiceAccountKubeconfig(ns, name string) string {
	e.t.Helper()
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	body := map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{"expirationSeconds": 3600}}
	must(e.t, e.Admin.Raw(context.Background(), "POST", fmt.Sprintf("/api/v1/namespaces/%s/serviceaccounts/%s/token", ns, name), "application/json", body, &tr))
	return e.kubeconfig(ns+"-"+name, tr.Status.Token, false)
}

// NodeToken is a token of ferry's ServiceAccount (openshift-ferry/ferry)
// bound to the Node named node, as an administrator makes it with
//
//	oc create token ferry -n openshift-ferry --bound-object-kind Node --bound-object-name NODE --duration 24h
//
// valid for seconds.
func (e *Env) NodeToken(node string, seconds int) string {
	e.t.Helper()
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	body := map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{
		"expirationSeconds": seconds,
		"boundObjectRef":    map[string]any{"apiVersion": "v1", "kind": "Node", "name": node},
	}}
	must(e.t, e.Admin.Raw(context.Background(), "POST", "/api/v1/namespaces/openshift-ferry/serviceaccounts/ferry/token", "application/json", body, &tr))
	return tr.Status.Token
}

// NodeKubeconfig is the kubeconfig of ferry on node: its token (NodeToken,
// an hour long) in a file of its own that the kubeconfig names as
// tokenFile, as docs/admin.md sets a node up; the server's certificate is
// checked. Call InstallFerry first.
func (e *Env) NodeKubeconfig(node string) string {
	e.t.Helper()
	dir := filepath.Join(e.Dir, "node-"+node)
	must(e.t, os.MkdirAll(dir, 0o700))
	tok := filepath.Join(dir, "token")
	must(e.t, os.WriteFile(tok, []byte(e.NodeToken(node, 3600)+"\n"), 0o600))
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]\nusers: [{name: ferry, user: {tokenFile: token}}]\ncontexts: [{name: t, context: {cluster: t, user: ferry}}]\ncurrent-context: t\n",
		e.Server, filepath.Join(e.Dir, "certs", "apiserver.crt"))
	p := filepath.Join(dir, "kubeconfig")
	must(e.t, os.WriteFile(p, []byte(kc), 0o600))
	return p
}

// NodeCertKubeconfig is node's kubelet kubeconfig as RHCOS has it
// (/var/lib/kubelet/kubeconfig): a client certificate CN
// system:node:NODE, O system:nodes, issued by the API server's client CA,
// in pki/kubelet-client-current.pem (a link to the dated file, named as
// both client-certificate and client-key); the server's certificate is
// checked. RotateNodeCert puts a new certificate there.
func (e *Env) NodeCertKubeconfig(node string) string {
	e.t.Helper()
	dir := filepath.Join(e.Dir, "kubelet-"+node)
	must(e.t, os.MkdirAll(filepath.Join(dir, "pki"), 0o700))
	cur := e.RotateNodeCert(node)
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]\nusers: [{name: kubelet, user: {client-certificate: %q, client-key: %q}}]\ncontexts: [{name: t, context: {cluster: t, user: kubelet}}]\ncurrent-context: t\n",
		e.Server, filepath.Join(e.Dir, "certs", "apiserver.crt"), cur, cur)
	p := filepath.Join(dir, "kubeconfig")
	must(e.t, os.WriteFile(p, []byte(kc), 0o600))
	return p
}

// RotateNodeCert issues node a new kubelet client certificate, as the
// kubelet rotates its own, and returns the -current.pem link's path.
func (e *Env) RotateNodeCert(node string) string {
	e.t.Helper()
	cert, key := e.ClientCA.Node(e.t, node)
	return testca.WriteCurrent(e.t, filepath.Join(e.Dir, "kubelet-"+node, "pki"), "kubelet-client", cert, key)
}

// InstallFerry applies what ferry ships for the cluster, exactly:
// packaging/rbac.yaml and packaging/admission.yaml, and waits until the
// API server enforces every admission policy (they take effect a moment
// after they are created).
func (e *Env) InstallFerry() {
	e.t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	e.ApplyFile(filepath.Join(root, "packaging", "rbac.yaml"))
	e.ApplyFile(filepath.Join(root, "packaging", "admission.yaml"))
	// A token of ferry bound to no Node may write nothing once the
	// policies hold: probe each until it is refused.
	kc := e.ServiceAccountKubeconfig("openshift-ferry", "ferry")
	c, err := kube.New(kc, nil)
	must(e.t, err)
	c.Attempts = 1
	ctx := context.Background()
	e.Create("/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "ferry-probe"}})
	defer e.Admin.Raw(ctx, "DELETE", "/api/v1/nodes/ferry-probe", "", nil, nil)
	probes := []struct {
		policy string
		try    func() error
		undo   func()
	}{
		{"ferry-node", func() error {
			return c.Raw(ctx, "PATCH", "/api/v1/nodes/ferry-probe", "application/merge-patch+json", map[string]any{"metadata": map[string]any{"annotations": map[string]any{"ferry.io/probe": "x"}}}, nil)
		}, func() {}},
		{"ferry-clusterversion", func() error {
			return c.Raw(ctx, "PATCH", "/apis/config.openshift.io/v1/clusterversions/version", "application/merge-patch+json", map[string]any{"metadata": map[string]any{"labels": map[string]any{"ferry-probe": "x"}}}, nil)
		}, func() {
			e.Admin.Raw(ctx, "PATCH", "/apis/config.openshift.io/v1/clusterversions/version", "application/merge-patch+json", map[string]any{"metadata": map[string]any{"labels": map[string]any{"ferry-probe": nil}}}, nil)
		}},
		{"ferry-release-signatures", func() error {
			return c.Raw(ctx, "POST", "/api/v1/namespaces/openshift-config-managed/configmaps", "application/json", map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "ferry-probe"}}, nil)
		}, func() {
			e.Admin.Raw(ctx, "DELETE", "/api/v1/namespaces/openshift-config-managed/configmaps/ferry-probe", "", nil, nil)
		}},
		{"ferry-events", func() error {
			return c.Raw(ctx, "POST", "/api/v1/namespaces/default/events", "application/json", map[string]any{"apiVersion": "v1", "kind": "Event",
				"metadata": map[string]any{"name": "ferry-probe"}, "involvedObject": map[string]any{"kind": "UpgradeBundle", "name": "ferry-probe"}, "reason": "Probe", "message": "probe"}, nil)
		}, func() {
			e.Admin.Raw(ctx, "DELETE", "/api/v1/namespaces/default/events/ferry-probe", "", nil, nil)
		}},
		{"ferry-lease", func() error {
			return c.Raw(ctx, "POST", "/apis/coordination.k8s.io/v1/namespaces/openshift-ferry/leases", "application/json", map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
				"metadata": map[string]any{"name": "ferry-probe"}, "spec": map[string]any{"holderIdentity": "ferry-probe"}}, nil)
		}, func() {
			e.Admin.Raw(ctx, "DELETE", "/apis/coordination.k8s.io/v1/namespaces/openshift-ferry/leases/ferry-probe", "", nil, nil)
		}},
		{"ferry-token", func() error {
			return c.Raw(ctx, "POST", "/api/v1/namespaces/openshift-ferry/serviceaccounts/ferry/token", "application/json", map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{}}, nil)
		}, func() {}},
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range probes {
		for {
			err := p.try()
			if errors.Is(err, kube.ErrForbidden) && strings.Contains(err.Error(), p.policy) {
				break
			}
			p.undo()
			if time.Now().After(deadline) {
				e.t.Fatalf("admission policy %s not enforced after 30 s (last answer: %v)\n%s", p.policy, err, e.Log())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// ApproveRelease is what the administrator does, once per release, before
// ferry may start the cluster upgrade to release (name@sha256:<hex>):
// the one command ferry prints (cluster.ApproveCommand), a key
// sha256-<hex> in ConfigMap openshift-ferry/ferry-admission. It waits
// until both policies that read it enforce it (they read the ConfigMap
// through a cache), probing with dry runs as a kubelet.
func (e *Env) ApproveRelease(release string) {
	e.t.Helper()
	key, ok := cluster.ApprovalKey(release)
	if !ok {
		e.t.Fatalf("ApproveRelease: %q is not a release by digest", release)
	}
	ctx := context.Background()
	must(e.t, e.Admin.Raw(ctx, "PATCH", "/api/v1/namespaces/openshift-ferry/configmaps/ferry-admission", "application/merge-patch+json",
		map[string]any{"data": map[string]any{key: "approved"}}, nil))
	c, err := kube.New(e.NodeCertKubeconfig("ferry-probe"), nil)
	must(e.t, err)
	c.Attempts = 1
	sigs := map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata":   map[string]any{"name": key, "namespace": "openshift-config-managed", "labels": map[string]any{kube.SignatureLabel: ""}},
		"binaryData": map[string]any{key + "-1": "cHJvYmU="}}
	probes := map[string]func() error{
		"ferry-release-signatures": func() error {
			err := c.Raw(ctx, "POST", "/api/v1/namespaces/openshift-config-managed/configmaps?dryRun=All", "application/json", sigs, nil)
			if kube.IsConflict(err) {
				return nil // it exists: admitted
			}
			return err
		},
		"ferry-clusterversion": func() error {
			return c.Raw(ctx, "PATCH", "/apis/config.openshift.io/v1/clusterversions/version?dryRun=All", "application/merge-patch+json",
				map[string]any{"spec": map[string]any{"desiredUpdate": map[string]any{"image": release, "version": "0.0.0"}}}, nil)
		},
	}
	deadline := time.Now().Add(30 * time.Second)
	for policy, try := range probes {
		for {
			err := try()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("policy %s does not admit release %s 30 s after its approval: %v", policy, release, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// NobodyKubeconfig is a user with no rights at all.
func (e *Env) NobodyKubeconfig() string { return e.kubeconfig("nobody", "nobodytoken", false) }

// Create posts obj to path (a collection); an existing object is fine.
func (e *Env) Create(path string, obj any) {
	e.t.Helper()
	if err := e.Admin.Raw(context.Background(), "POST", path, "application/json", obj, nil); err != nil && !kube.IsConflict(err) {
		e.t.Fatalf("create at %s: %v", path, err)
	}
}

// ApplyFile creates every object of a (multi-document) YAML file.
func (e *Env) ApplyFile(path string) {
	e.t.Helper()
	b, err := os.ReadFile(path)
	must(e.t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err == io.EOF {
			break
		} else if err != nil {
			e.t.Fatalf("%s: %v", path, err)
		}
		if obj == nil {
			continue
		}
		e.Create(collection(e.t, obj), obj)
	}
}

// collection is the REST path that objects of obj's kind are created at.
func collection(t testing.TB, obj map[string]any) string {
	kind, _ := obj["kind"].(string)
	md, _ := obj["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	switch kind {
	case "Namespace":
		return "/api/v1/namespaces"
	case "ServiceAccount":
		return "/api/v1/namespaces/" + ns + "/serviceaccounts"
	case "ClusterRole", "ClusterRoleBinding":
		return "/apis/rbac.authorization.k8s.io/v1/" + strings.ToLower(kind) + "s"
	case "Role", "RoleBinding":
		return "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/" + strings.ToLower(kind) + "s"
	case "CustomResourceDefinition":
		return "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
	case "ConfigMap":
		return "/api/v1/namespaces/" + ns + "/configmaps"
	case "ValidatingAdmissionPolicy":
		return "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
	case "ValidatingAdmissionPolicyBinding":
		return "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
	case "UpgradeBundle":
		return "/apis/ferry.io/v1alpha1/upgradebundles"
	}
	t.Fatalf("kubeenv: no REST path known for kind %q", kind)
	return ""
}

// AddNode creates a Node with an InternalIP (there is no kubelet).
func (e *Env) AddNode(name, ip string) {
	e.t.Helper()
	e.Create("/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}})
	patch := map[string]any{"status": map[string]any{"addresses": []any{map[string]any{"type": "InternalIP", "address": ip}}}}
	must(e.t, e.Admin.Raw(context.Background(), "PATCH", "/api/v1/nodes/"+name+"/status", "application/merge-patch+json", patch, nil))
}

// Annotations are a Node's annotations.
func (e *Env) Annotations(node string) map[string]string {
	e.t.Helper()
	var n struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", "/api/v1/nodes/"+node, "", nil, &n))
	return n.Metadata.Annotations
}

// History is one entry of ClusterVersion's status.history.
type History struct {
	State   string // Partial or Completed
	Image   string
	Version string
}

// Condition is one of ClusterVersion's status.conditions.
type Condition struct {
	Type, Status, Reason, Message string
}

// SetHistory writes status.history (newest first) as the version operator
// does, through the status subresource.
func (e *Env) SetHistory(h ...History) {
	e.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	var entries []any
	for _, x := range h {
		ent := map[string]any{"state": x.State, "image": x.Image, "version": x.Version, "startedTime": now, "verified": true}
		if x.State == "Completed" {
			ent["completionTime"] = now
		} else {
			ent["completionTime"] = nil
		}
		entries = append(entries, ent)
	}
	e.patchStatus(map[string]any{"history": entries, "desired": map[string]any{"image": h[0].Image, "version": h[0].Version},
		"observedGeneration": 1, "versionHash": "x", "availableUpdates": []any{}})
}

// SetConditions writes status.conditions.
func (e *Env) SetConditions(cs ...Condition) {
	e.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	var out []any
	for _, c := range cs {
		out = append(out, map[string]any{"type": c.Type, "status": c.Status, "reason": c.Reason, "message": c.Message, "lastTransitionTime": now})
	}
	e.patchStatus(map[string]any{"conditions": out})
}

// patchStatus replaces the given keys of ClusterVersion's status with a
// PUT of the whole object, as the operator's client does (a merge patch
// would drop the nulls the CRD requires, e.g. completionTime: null).
func (e *Env) patchStatus(status map[string]any) {
	e.t.Helper()
	const path = "/apis/config.openshift.io/v1/clusterversions/version"
	for range 5 {
		var cv map[string]any
		must(e.t, e.Admin.Raw(context.Background(), "GET", path, "", nil, &cv))
		st, _ := cv["status"].(map[string]any)
		if st == nil {
			st = map[string]any{}
		}
		for k, v := range status {
			st[k] = v
		}
		cv["status"] = st
		err := e.Admin.Raw(context.Background(), "PUT", path+"/status", "application/json", cv, nil)
		if err == nil {
			return
		}
		if !kube.IsConflict(err) {
			e.t.Fatalf("writing ClusterVersion status as the version operator: %v", err)
		}
	}
	e.t.Fatal("writing ClusterVersion status: conflicts every time")
}

// DesiredUpdate is ClusterVersion's spec.desiredUpdate (nil when unset).
func (e *Env) DesiredUpdate() map[string]any {
	e.t.Helper()
	var cv struct {
		Spec struct {
			DesiredUpdate map[string]any `json:"desiredUpdate"`
		} `json:"spec"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", "/apis/config.openshift.io/v1/clusterversions/version", "", nil, &cv))
	return cv.Spec.DesiredUpdate
}

// ConfigMap returns a ConfigMap's labels and binaryData (decoded), or
// false when it does not exist.
func (e *Env) ConfigMap(ns, name string) (labels map[string]string, data map[string][]byte, ok bool) {
	e.t.Helper()
	var cm struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		BinaryData map[string][]byte `json:"binaryData"`
	}
	err := e.Admin.Raw(context.Background(), "GET", "/api/v1/namespaces/"+ns+"/configmaps/"+name, "", nil, &cm)
	if kube.IsNotFound(err) {
		return nil, nil, false
	}
	must(e.t, err)
	return cm.Metadata.Labels, cm.BinaryData, true
}

// Generation is ClusterVersion's metadata.generation: it grows with each
// change of its spec, so a test counts ferry's patches with it.
func (e *Env) Generation() int64 {
	e.t.Helper()
	var cv struct {
		Metadata struct {
			Generation int64 `json:"generation"`
		} `json:"metadata"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", "/apis/config.openshift.io/v1/clusterversions/version", "", nil, &cv))
	return cv.Metadata.Generation
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// MachineConfigPool is one pool as the test plays the machine config
// operator: the admin's spec (nodeSelector, paused), the render
// controller's spec.configuration (Target), and the operator's status.
type MachineConfigPool struct {
	Name         string
	NodeSelector map[string]string // matchLabels
	Paused       bool
	Target       string // spec.configuration.name: the rendered config its nodes go to
	Current      string // status.configuration.name: the one they all run
	Machines     int    // status.machineCount
	Updated      int    // status.updatedMachineCount
}

const poolsPath = "/apis/machineconfiguration.openshift.io/v1/machineconfigpools"

// InstallMachineConfigPools applies OpenShift's MachineConfigPool CRD (the
// Default featureset's, cached by test/setup/build-apiserver.sh).
func (e *Env) InstallMachineConfigPools() {
	e.t.Helper()
	crd := filepath.Join(e.bin, "machineconfigpools.crd.yaml")
	_, err := os.Stat(crd)
	crioenv.Need(e.t, err == nil, "no MachineConfigPool CRD in %s (a cache from before it was added): run bash test/setup/build-apiserver.sh", e.bin)
	e.ApplyFile(crd)
	deadline := time.Now().Add(30 * time.Second)
	for e.Admin.Raw(context.Background(), "GET", poolsPath, "", nil, nil) != nil {
		if time.Now().After(deadline) {
			e.t.Fatal("the MachineConfigPool CRD never became established")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// SetPool creates or updates a pool, spec then status (through the
// status subresource, as the operator writes it).
func (e *Env) SetPool(p MachineConfigPool) {
	e.t.Helper()
	ctx := context.Background()
	path := poolsPath + "/" + p.Name
	spec := map[string]any{
		"nodeSelector":          map[string]any{"matchLabels": p.NodeSelector},
		"machineConfigSelector": map[string]any{"matchLabels": map[string]any{"machineconfiguration.openshift.io/role": p.Name}},
		"paused":                p.Paused,
		"configuration":         map[string]any{"name": p.Target},
	}
	err := e.Admin.Raw(ctx, "PATCH", path, "application/merge-patch+json", map[string]any{"spec": spec}, nil)
	if kube.IsNotFound(err) {
		err = e.Admin.Raw(ctx, "POST", poolsPath, "application/json", map[string]any{
			"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
			"metadata": map[string]any{"name": p.Name}, "spec": spec}, nil)
	}
	if err != nil {
		e.t.Fatalf("writing machineconfigpool %s: %v", p.Name, err)
	}
	status := map[string]any{
		"observedGeneration": 1, "configuration": map[string]any{"name": p.Current},
		"machineCount": p.Machines, "updatedMachineCount": p.Updated, "readyMachineCount": p.Updated,
		"unavailableMachineCount": 0, "degradedMachineCount": 0,
	}
	if err := e.Admin.Raw(ctx, "PATCH", path+"/status", "application/merge-patch+json", map[string]any{"status": status}, nil); err != nil {
		e.t.Fatalf("writing machineconfigpool %s status: %v", p.Name, err)
	}
}

// LabelNode sets labels on a Node (e.g. node-role.kubernetes.io/worker).
func (e *Env) LabelNode(node string, labels map[string]string) {
	e.t.Helper()
	patch := map[string]any{"metadata": map[string]any{"labels": labels}}
	must(e.t, e.Admin.Raw(context.Background(), "PATCH", "/api/v1/nodes/"+node, "application/merge-patch+json", patch, nil))
}

// SetMachineConfig writes a Node's machine config annotations as the
// machine config daemon (state, currentConfig) and the node controller
// (desiredConfig) do.
func (e *Env) SetMachineConfig(node, state, current, desired string) {
	e.t.Helper()
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		"machineconfiguration.openshift.io/state":         state,
		"machineconfiguration.openshift.io/currentConfig": current,
		"machineconfiguration.openshift.io/desiredConfig": desired,
	}}}
	must(e.t, e.Admin.Raw(context.Background(), "PATCH", "/api/v1/nodes/"+node, "application/merge-patch+json", patch, nil))
}
