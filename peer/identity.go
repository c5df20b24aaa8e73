package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
)

// NodeTLS is the peers' TLS with the identities the cluster gives its
// nodes (peer.identity = "node"): each server presents its kubelet's
// serving certificate, each client its kubelet's client certificate, and
// each side accepts only a certificate that chains to the cluster's CA
// for that use and names a node (CN system:node:NAME, O system:nodes).
// Every func is asked again at each handshake, so that a rotated
// certificate or CA bundle counts from the next connection on.
type NodeTLS struct {
	// Serving is this node's serving certificate (the kubelet's
	// kubelet-server-current.pem).
	Serving func() *tls.Certificate
	// Client is this node's client certificate (the kubelet's
	// kubelet-client-current.pem, as the kubeconfig names it).
	Client func() *tls.Certificate
	// ClientCAs are the CAs a peer's client certificate must chain to:
	// the API server's own client CA bundle, so a peer is whoever the
	// API server would take for that node.
	ClientCAs func() *x509.CertPool
	// ServingCAs are the CAs a peer's serving certificate must chain to
	// (OpenShift: openshift-config-managed/kubelet-serving-ca).
	ServingCAs func() *x509.CertPool
	// Known, when set, tells whether a node is one of the cluster's now
	// (it has a record: a deleted Node's goes with it). A kubelet
	// certificate outlives its Node; a peer whose node is not known is
	// refused, however good its certificate.
	Known func(node string) bool
	// Monitoring lets the cluster's monitoring connect too (a client
	// certificate from ClientCAs naming MonitoringUser), to read
	// /metrics and nothing else (Server).
	Monitoring bool
}

// MonitoringUser is who OpenShift's cluster monitoring scrapes as: its
// Prometheus presents a client certificate with this CN, signed by the
// API server's client CA (openshift-monitoring/metrics-client-certs),
// as it does to every kubelet and CRI-O.
const MonitoringUser = "system:serviceaccount:openshift-monitoring:prometheus-k8s"

// MetricsReader reports whether r came with the monitoring's
// certificate (checked against ClientCAs at the handshake).
func MetricsReader(r *http.Request) bool {
	return r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == MonitoringUser
}

// ErrNotAPeer is a certificate the peers do not take for a node's.
var ErrNotAPeer = errors.New("not a node of this cluster")

const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// nodeOf is the node a certificate names (CN system:node:NAME with O
// system:nodes, as the kubelet's are).
func nodeOf(c *x509.Certificate) (string, error) {
	name, ok := strings.CutPrefix(c.Subject.CommonName, nodeUserPrefix)
	if !ok || name == "" || !slices.Contains(c.Subject.Organization, nodesGroup) {
		return "", fmt.Errorf("%w: its certificate names CN %q, O %q, not CN system:node:NAME, O system:nodes", ErrNotAPeer, c.Subject.CommonName, c.Subject.Organization)
	}
	return name, nil
}

// known refuses a node the cluster does not know (Known).
func (n *NodeTLS) known(node string) error {
	if n.Known != nil && !n.Known(node) {
		return fmt.Errorf("%w: node %s has no record in the cluster (a deleted Node's certificate, or ferry not running there)", ErrNotAPeer, node)
	}
	return nil
}

// verify checks certs (leaf first) against roots for usage, and, when
// host is not "", that the leaf names host; it returns the node named.
func verify(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, host string) (string, error) {
	if err := verifyChain(certs, roots, usage, host); err != nil {
		return "", err
	}
	return nodeOf(certs[0])
}

// verifyChain is verify, whoever the leaf names.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, host string) error {
	if len(certs) == 0 {
		return fmt.Errorf("%w: no certificate", ErrNotAPeer)
	}
	if roots == nil {
		return fmt.Errorf("%w: this node has no CA bundle to check it against yet", ErrNotAPeer)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: host}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("%w: %v", ErrNotAPeer, err)
	}
	return nil
}

// ServerConfig is the peer server's TLS: a client certificate is
// required, and checked against ClientCAs (RequireAnyClientCert, then
// VerifyConnection, so that the newest bundle counts).
func (n *NodeTLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := n.Serving(); c != nil {
				return c, nil
			}
			return nil, errors.New("this node has no serving certificate")
		},
		ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			certs := cs.PeerCertificates
			if err := verifyChain(certs, n.ClientCAs(), x509.ExtKeyUsageClientAuth, ""); err != nil {
				return err
			}
			node, err := nodeOf(certs[0])
			if err != nil {
				if n.Monitoring && certs[0].Subject.CommonName == MonitoringUser {
					return nil // it reads /metrics only (Server)
				}
				return err
			}
			return n.known(node)
		},
	}
}

// clientConfig is the TLS toward the peer at host: this node's client
// certificate, and the peer's serving certificate checked against
// ServingCAs and host (its address as the peer list gives it).
func (n *NodeTLS) clientConfig(host string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: host,
		// Checked below, against the newest bundle.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := n.Client(); c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			node, err := verify(cs.PeerCertificates, n.ServingCAs(), x509.ExtKeyUsageServerAuth, host)
			if err == nil {
				err = n.known(node)
			}
			if err != nil {
				return fmt.Errorf("peer %s: %w", host, err)
			}
			return nil
		},
	}
}

// NewNodeClient is a peer client over TLS with node identities.
func NewNodeClient(n *NodeTLS) *Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext: dialer.DialContext,
		// One TLS config per peer: its address is what its certificate
		// must name.
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			c := tls.Client(raw, n.clientConfig(host))
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := c.HandshakeContext(hctx); err != nil {
				raw.Close()
				return nil, err
			}
			return c, nil
		},
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 15 * time.Second,
		DisableCompression:    true,
	}
	c := NewClient("", &http.Client{Transport: tr})
	c.scheme = "https"
	return c
}

// PeerNode is the node whose certificate a request came with ("" for a
// request not over TLS).
func PeerNode(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	n, _ := nodeOf(r.TLS.PeerCertificates[0])
	return n
}
