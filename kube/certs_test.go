package kube

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/testca"
)

// kubeletKubeconfig writes a kubeconfig as the kubelet's on RHCOS: one
// -current.pem link named as both client-certificate and client-key.
func kubeletKubeconfig(t *testing.T, dir, server string, serverCA []byte, current string) string {
	t.Helper()
	os.WriteFile(filepath.Join(dir, "ca.crt"), serverCA, 0o600)
	kc := "clusters: [{name: c, cluster: {server: " + server + ", certificate-authority: ca.crt}}]\n" +
		"users: [{name: kubelet, user: {client-certificate: " + current + ", client-key: " + current + "}}]\n" +
		"contexts: [{name: x, context: {cluster: c, user: kubelet}}]\ncurrent-context: x\n"
	p := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestClient_PresentsTheKubeletsRotatedCertificate: the kubelet moves its
// -current.pem link to a new certificate; the client's next request
// presents the new one (the API server checks the certificate on every
// request, so an old connection must not carry on with the old one: over
// HTTP/2 the one connection a watch keeps busy is closed too).
func TestClient_PresentsTheKubeletsRotatedCertificate(t *testing.T) {
	ca := testca.New(t, "kube-csr-signer")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/watch" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		c := r.TLS.PeerCertificates[0]
		w.Write([]byte(`{"cn":"` + c.Subject.CommonName + `","serial":"` + c.SerialNumber.String() + `"}`))
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: testca.Pool(ca)}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	servingCA := srv.Certificate().Raw
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	os.Mkdir(pki, 0o700)
	cert, key := ca.Node(t, "a")
	cur := testca.WriteCurrent(t, pki, "kubelet-client", cert, key)
	c, err := New(kubeletKubeconfig(t, dir, srv.URL, pemCert(servingCA), cur), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Attempts = 1 // the request that finds the new certificate goes through, not its retry
	if n, ok := c.NodeIdentity(); !ok || n != "a" {
		t.Fatalf("node identity %q %v, want a", n, ok)
	}
	var got struct{ CN, Serial string }
	if err := c.Raw(t.Context(), "GET", "/whoami", "", nil, &got); err != nil || got.CN != "system:node:a" {
		t.Fatalf("first request: %+v %v", got, err)
	}
	first := got.Serial
	// A watch keeps the connection busy, as the agent's do.
	watchCtx, stopWatch := context.WithCancel(t.Context())
	defer stopWatch() // before srv.Close, which waits for the handler
	req, _ := http.NewRequestWithContext(watchCtx, "GET", srv.URL+"/watch", nil)
	resp, err := c.stream.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("the watch went over %s, want HTTP/2", resp.Proto)
	}
	watchEnded := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, resp.Body); watchEnded <- err }()

	cert, key = ca.Node(t, "a")
	testca.WriteCurrent(t, pki, "kubelet-client", cert, key)
	if err := c.Raw(t.Context(), "POST", "/whoami", "", nil, &got); err != nil || got.Serial == first {
		t.Fatalf("after the rotation the client presents serial %s (before %s), %v", got.Serial, first, err)
	}
	select {
	case <-watchEnded: // ended with its connection: the informer watches again on a new one
	case <-time.After(10 * time.Second):
		t.Fatal("the watch on the old certificate's connection still runs after the rotation")
	}

	// A half-written rotation keeps the last good pair.
	os.WriteFile(cur, []byte("garbage"), 0o600)
	if err := c.Raw(t.Context(), "GET", "/whoami", "", nil, &got); err != nil || got.CN != "system:node:a" {
		t.Fatalf("with an unreadable file: %+v %v", got, err)
	}
	// With a certificate and no token there is nothing to renew.
	if err := c.KeepTokenFresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestNodeOf_OnlyAKubeletShapedSubject(t *testing.T) {
	ca := testca.New(t, "ca")
	for name, tc := range map[string]struct {
		c    testca.Cert
		want string
	}{
		"a node":                 {testca.Cert{CN: "system:node:a", O: []string{"system:nodes"}}, "a"},
		"no group":               {testca.Cert{CN: "system:node:a"}, ""},
		"another group":          {testca.Cert{CN: "system:node:a", O: []string{"system:masters"}}, ""},
		"a user":                 {testca.Cert{CN: "admin", O: []string{"system:nodes"}}, ""},
		"an empty name":          {testca.Cert{CN: "system:node:", O: []string{"system:nodes"}}, ""},
		"a service account name": {testca.Cert{CN: "system:serviceaccount:x:y", O: []string{"system:nodes"}}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			cert, key := ca.Issue(t, tc.c)
			kp := testca.KeyPair(t, cert, key)
			n, err := NodeOf(kp.Leaf)
			if n != tc.want || (tc.want == "") != errors.Is(err, ErrNotNodeCertificate) {
				t.Fatalf("NodeOf: %q, %v; want %q", n, err, tc.want)
			}
		})
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
