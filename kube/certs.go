package kube

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
)

// NodeUserPrefix and NodesGroup are how the API server names a node's
// kubelet: user system:node:NAME in group system:nodes (the subject of its
// client certificate: CN and O).
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// ErrNotNodeCertificate is a certificate that names no node.
var ErrNotNodeCertificate = errors.New("the certificate is not a node's (CN system:node:NAME, O system:nodes)")

// NodeOf is the node a certificate names: its CN is system:node:NAME and
// its O includes system:nodes, as the kubelet's own certificates are.
func NodeOf(c *x509.Certificate) (string, error) {
	name, ok := strings.CutPrefix(c.Subject.CommonName, NodeUserPrefix)
	if !ok || name == "" || !slices.Contains(c.Subject.Organization, NodesGroup) {
		return "", fmt.Errorf("%w: CN %q, O %q", ErrNotNodeCertificate, c.Subject.CommonName, c.Subject.Organization)
	}
	return name, nil
}

// readKeyPair reads a certificate and its key (the same file for both,
// as the kubelet's kubelet-client-current.pem), with its leaf parsed.
func readKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("client key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("client certificate %s: %w", certFile, err)
	}
	return &cert, nil
}

// KeyPair is a certificate and key kept in files that their owner
// replaces (the kubelet rotates its certificates by writing a new file
// and moving the -current.pem link to it): each Get looks at the files
// (a stat) and reads them again when they changed. A pair that cannot be
// read or does not match keeps the last good one: the other side says
// when that no longer works.
type KeyPair struct {
	certFile, keyFile string
	mu                sync.Mutex
	cert              *tls.Certificate
	seen              [2]stamp
	// changed, when set, is called after a new pair was read.
	changed func()
}

// LoadKeyPair reads a pair from its files (keyFile "" : certFile holds
// both).
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	if keyFile == "" {
		keyFile = certFile
	}
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	k.seen = k.stamps()
	c, err := readKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	k.cert = c
	return k, nil
}

func (k *KeyPair) stamps() [2]stamp {
	var s [2]stamp
	for i, f := range []string{k.certFile, k.keyFile} {
		if fi, err := os.Stat(f); err == nil { // follows the -current.pem link
			s[i] = stampOf(fi)
		}
	}
	return s
}

// Get is the newest pair.
func (k *KeyPair) Get() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.stamps(); st != k.seen {
		if c, err := readKeyPair(k.certFile, k.keyFile); err == nil {
			k.cert, k.seen = c, st
			if k.changed != nil {
				k.changed()
			}
		}
	}
	return k.cert
}

// Node is the node the current certificate names (NodeOf).
func (k *KeyPair) Node() (string, error) { return NodeOf(k.Get().Leaf) }

// clientCertificate is tls.Config.GetClientCertificate for k.
func (k *KeyPair) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.Get(), nil
}

// Identity is ferry's client certificate toward the API server (nil with
// a token): with a node's kubelet credential, its KeyPair names the node.
func (c *Client) Identity() *KeyPair { return c.certs }

// NodeIdentity is the node the client's certificate names; false with a
// token or a certificate that names no node.
func (c *Client) NodeIdentity() (string, bool) {
	if c.certs == nil {
		return "", false
	}
	n, err := c.certs.Node()
	return n, err == nil
}
