package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ferry"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func TestLoadKubeconfig_TokenFileCertificatesAndCA(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t)
	os.WriteFile(filepath.Join(dir, "token"), []byte("sekrit\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "ca.crt"), cert, 0o600)
	os.WriteFile(filepath.Join(dir, "c.crt"), cert, 0o600)
	os.WriteFile(filepath.Join(dir, "c.key"), key, 0o600)
	b64 := base64.StdEncoding.EncodeToString
	cases := map[string]struct {
		body    string
		token   string
		certs   int
		wantErr string
	}{
		"token file and CA file, relative paths": {body: `
clusters: [{name: c, cluster: {server: "https://api:6443/", certificate-authority: ca.crt}}]
users: [{name: u, user: {tokenFile: token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x`, token: "sekrit"},
		"inline client certificate and CA data": {body: `
clusters: [{name: c, cluster: {server: "https://api:6443", certificate-authority-data: ` + b64(cert) + `}}]
users: [{name: u, user: {client-certificate-data: ` + b64(cert) + `, client-key-data: ` + b64(key) + `}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x`, certs: 1},
		"client certificate files": {body: `
clusters: [{name: c, cluster: {server: "https://api:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {client-certificate: c.crt, client-key: c.key}}]
contexts: [{name: x, context: {cluster: c, user: u}}]`, certs: 1},
		"no credentials": {body: `
clusters: [{name: c, cluster: {server: "https://api:6443"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x`, wantErr: "no token"},
		"unknown context": {body: `current-context: nope
contexts: [{name: x, context: {cluster: c, user: u}}]`, wantErr: `no context "nope"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, "kc-"+strings.ReplaceAll(name, " ", "-"))
			os.WriteFile(p, []byte(tc.body), 0o600)
			ep, err := loadKubeconfig(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ep.server != "https://api:6443" || ep.token != tc.token || (ep.cert != nil) != (tc.certs == 1) {
				t.Fatalf("endpoint %+v", ep)
			}
		})
	}
}

func TestUpgradeOf_ReadsHistoryAndConditionsAsTheOperatorWritesThem(t *testing.T) {
	const rel, old = "q/r@sha256:aa", "q/r@sha256:bb"
	cv := func(desired string, hist [][2]string, conds ...condition) *clusterVersion {
		var c clusterVersion
		if desired != "" {
			c.Spec.DesiredUpdate = &struct {
				Image   string `json:"image"`
				Version string `json:"version"`
				Force   bool   `json:"force"`
			}{Image: desired}
		}
		for _, h := range hist {
			c.Status.History = append(c.Status.History, struct {
				State   string `json:"state"`
				Image   string `json:"image"`
				Version string `json:"version"`
			}{State: h[1], Image: h[0]})
		}
		c.Status.Conditions = conds
		return &c
	}
	progressing := condition{Type: "Progressing", Status: "True", Message: "Working towards 4.13.7"}
	tests := []struct {
		name   string
		cv     *clusterVersion
		state  cluster.UpgradeState
		reason string
	}{
		{"another release desired", cv(old, [][2]string{{old, "Completed"}}), cluster.UpgradeNotAsked, ""},
		{"asked, not started", cv(rel, [][2]string{{old, "Completed"}}, progressing), cluster.UpgradePending, ""},
		{"asked, not an allowed update", cv(rel, [][2]string{{old, "Completed"}}, condition{Type: "ReleaseAccepted", Status: "False", Message: "not signed"}), cluster.UpgradeRefused, "not signed"},
		{"partial", cv(rel, [][2]string{{rel, "Partial"}, {old, "Completed"}}, progressing), cluster.UpgradeRunning, ""},
		{"partial and failing", cv(rel, [][2]string{{rel, "Partial"}}, condition{Type: "Failing", Status: "True", Message: "etcd degraded"}), cluster.UpgradeRunning, "etcd degraded"},
		{"completed", cv(rel, [][2]string{{rel, "Completed"}, {old, "Completed"}}), cluster.UpgradeCompleted, ""},
		{"completed, then another started", cv(old, [][2]string{{old, "Partial"}, {rel, "Completed"}}), cluster.UpgradeCompleted, ""},
		{"blocked by Upgradeable=False", cv(rel, [][2]string{{old, "Completed"}}, condition{Type: "Upgradeable", Status: "False", Message: "admin ack required"}), cluster.UpgradePending, "admin ack required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := upgradeOf(tc.cv, rel)
			if u.State != tc.state || u.Reason != tc.reason {
				t.Fatalf("got %+v, want state %q reason %q", u, tc.state, tc.reason)
			}
		})
	}
}

// Issue 45, item 3: the release is recognised by its digest, however
// ClusterVersion spells it: without the tag (oc adm upgrade --to-image
// name@sha256:…), from another registry host, in capitals; never a
// release with another digest under the same name.
func TestUpgradeOf_RecognisesTheReleaseByDigestWhateverItsSpelling(t *testing.T) {
	hex, other := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	rel := "quay.io/openshift-release-dev/ocp-release:4.19.8-x86_64@sha256:" + hex
	for _, tc := range []struct {
		spelling string
		same     bool
	}{
		{rel, true},
		{"quay.io/openshift-release-dev/ocp-release@sha256:" + hex, true},
		{"mirror.example:5000/ocp/release@sha256:" + hex, true},
		{"quay.io/openshift-release-dev/ocp-release@sha256:" + strings.ToUpper(hex), true},
		{"quay.io/openshift-release-dev/ocp-release:4.19.8-x86_64@sha256:" + other, false},
		{"quay.io/openshift-release-dev/ocp-release:4.19.8-x86_64", false},
	} {
		var cv clusterVersion
		cv.Status.History = append(cv.Status.History, struct {
			State   string `json:"state"`
			Image   string `json:"image"`
			Version string `json:"version"`
		}{State: "Completed", Image: tc.spelling})
		want := cluster.UpgradeNotAsked
		if tc.same {
			want = cluster.UpgradeCompleted
		}
		if got := upgradeOf(&cv, rel).State; got != want {
			t.Errorf("history %s: %q, want %q", tc.spelling, got, want)
		}
		cv.Status.History = nil
		cv.Spec.DesiredUpdate = &struct {
			Image   string `json:"image"`
			Version string `json:"version"`
			Force   bool   `json:"force"`
		}{Image: tc.spelling}
		if want == cluster.UpgradeCompleted {
			want = cluster.UpgradePending
		}
		if got := upgradeOf(&cv, rel).State; got != want {
			t.Errorf("desiredUpdate %s: %q, want %q", tc.spelling, got, want)
		}
	}
}

// A server reached by an address its certificate does not name (a
// forwarded port) is checked against the kubeconfig's tls-server-name:
// without it the connection is refused, with it the call goes through.
func TestKubeconfig_TLSServerNameChecksTheCertificateByThatName(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"major":"1"}`))
	}))
	defer srv.Close()
	// httptest's certificate names example.com and 127.0.0.1, not localhost.
	server := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	call := func(extra string) error {
		p := tokenKubeconfig(t, srv, server, extra)
		c, err := New(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Attempts = 1
		var v map[string]any
		return c.Raw(t.Context(), "GET", "/version", "", nil, &v)
	}
	if err := call(""); err == nil {
		t.Fatal("a certificate that does not name the address was accepted")
	}
	if err := call(", tls-server-name: example.com"); err != nil {
		t.Fatalf("with tls-server-name: %v", err)
	}
}
