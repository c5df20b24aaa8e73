package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/ferry-edge/ferry/internal/testca"
)

// serveMetrics starts a peer server with n's TLS and a /metrics that
// answers "metrics"; its address.
func serveMetrics(t *testing.T, n *NodeTLS) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	srv := NewServer(NewShelf(ShelfOptions{}), ServerOptions{TLS: n.ServerConfig(), Closed: true,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("metrics")) })})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// scraper is an HTTPS client presenting a client certificate c issued by
// from, trusting ca for the server, as a Prometheus with a tls_config.
func scraper(t *testing.T, from, ca *testca.CA, c testca.Cert) *http.Client {
	cert, key := from.Issue(t, c)
	kp := testca.KeyPair(t, cert, key)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: testca.Pool(ca), Certificates: []tls.Certificate{kp}}}}
}

// statusOf is the status of GET url by hc, 0 when no answer came (a refused
// handshake).
func statusOf(hc *http.Client, url string) int {
	resp, err := hc.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestNodeTLS_TheClusterMonitoringReadsMetricsOnly: with Monitoring, a
// client certificate from the cluster's client CA naming OpenShift's
// Prometheus (MonitoringUser) reads /metrics and nothing else; a node
// reads it too; the same name from another CA, another user of the
// cluster's CA, or the monitoring's certificate when Monitoring is off,
// are refused at the handshake.
func TestNodeTLS_TheClusterMonitoringReadsMetricsOnly(t *testing.T) {
	ca, other := testca.New(t, "kube-csr-signer"), testca.New(t, "someone-else")
	n := nodeTLS(t, ca, "a", ca)
	n.Monitoring = true
	addr := "https://" + serveMetrics(t, n)
	off := nodeTLS(t, ca, "a", ca)
	offAddr := "https://" + serveMetrics(t, off)

	prom := testca.Cert{CN: MonitoringUser, Client: true}
	node := testca.Cert{CN: "system:node:b", O: []string{"system:nodes"}, Client: true}
	for _, c := range []struct {
		what string
		hc   *http.Client
		url  string
		want int
	}{
		{"the monitoring's certificate, /metrics", scraper(t, ca, ca, prom), addr + "/metrics", http.StatusOK},
		{"the monitoring's certificate, the bundles", scraper(t, ca, ca, prom), addr + "/v1/bundles", http.StatusUnauthorized},
		{"the monitoring's certificate, the status", scraper(t, ca, ca, prom), addr + "/v1/status", http.StatusUnauthorized},
		{"a node's certificate, /metrics", scraper(t, ca, ca, node), addr + "/metrics", http.StatusOK},
		{"the monitoring's name from another CA", scraper(t, other, ca, prom), addr + "/metrics", 0},
		{"another user of the cluster's CA", scraper(t, ca, ca, testca.Cert{CN: "system:serviceaccount:default:reader", Client: true}), addr + "/metrics", 0},
		{"the monitoring's certificate, Monitoring off", scraper(t, ca, ca, prom), offAddr + "/metrics", 0},
	} {
		if got := statusOf(c.hc, c.url); got != c.want {
			t.Errorf("%s: %d, want %d (0: refused at the handshake)", c.what, got, c.want)
		}
	}
}

// TestServer_MetricsBehindTheTokenAndTheBytesCounted: with a peer token,
// /metrics answers only the token, like every route; a range sent to a
// peer counts its bytes on both sides (Served, Received).
func TestServer_MetricsBehindTheTokenAndTheBytesCounted(t *testing.T) {
	data, digest := randomBundle(t, 3*testPieceSize+17)
	var served, received atomic.Int64
	n := newSource(t, data, digest, ServerOptions{Token: "s3cret", Served: func(k int64) { served.Add(k) },
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("metrics")) })})
	if resp, _ := get(t, "http://"+n.addr+"/metrics", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without the token: %d", resp.StatusCode)
	}
	if resp, body := get(t, "http://"+n.addr+"/metrics", map[string]string{"Authorization": "Bearer s3cret"}); resp.StatusCode != http.StatusOK || string(body) != "metrics" {
		t.Errorf("/metrics with the token: %d %q", resp.StatusCode, body)
	}
	c := NewClient("s3cret", nil)
	c.Received = func(k int64) { received.Add(k) }
	var buf bytes.Buffer
	if err := c.CopyRange(t.Context(), n.addr, digest, 5, int64(len(data))-5, &buf); err != nil {
		t.Fatal(err)
	}
	if want := int64(len(data)) - 5; served.Load() != want || received.Load() != want {
		t.Errorf("served %d, received %d bytes, want %d", served.Load(), received.Load(), want)
	}
}
