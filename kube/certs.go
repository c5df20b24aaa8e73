package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
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

// CAPool is a CA bundle that changes under ferry: a file read again when
// it changes (File), or the API's ConfigMap read again every while
// (FromAPI). A bundle that cannot be read keeps the last good one.
type CAPool struct {
	mu    sync.Mutex
	pool  *x509.CertPool
	file  string
	seen  stamp
	fetch func() ([]byte, error) // from the API
	every time.Duration
	last  time.Time
	busy  bool
	log   *slog.Logger
}

// CAFile is the CA bundle in path.
func CAFile(path string) (*CAPool, error) {
	p := &CAPool{file: path}
	if p.Get() == nil {
		_, err := readPool(path)
		return nil, err
	}
	return p, nil
}

func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	return parsePool(b, path)
}

func parsePool(b []byte, what string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", what)
	}
	return pool, nil
}

// Get is the newest bundle (nil until one was read).
func (p *CAPool) Get() *x509.CertPool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.file != "" {
		if fi, err := os.Stat(p.file); err == nil && stampOf(fi) != p.seen {
			if pool, err := readPool(p.file); err == nil {
				p.pool, p.seen = pool, stampOf(fi)
			}
		}
	}
	if p.fetch != nil && !p.busy && time.Since(p.last) > p.every {
		p.busy = true
		go p.refresh()
	}
	return p.pool
}

// refresh reads the bundle from the API once.
func (p *CAPool) refresh() {
	b, err := p.fetch()
	var pool *x509.CertPool
	if err == nil {
		pool, err = parsePool(b, "from the API")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy = false
	if err != nil {
		p.last = time.Now().Add(-p.every + 30*time.Second) // try again soon
		p.log.Warn("kube: cannot read a CA bundle from the cluster's API; keeping the last one", "err", err)
		return
	}
	p.pool, p.last = pool, time.Now()
}

// CABundle is a CA bundle kept in ConfigMap ns/name under key, read
// now and again every while (once Get is asked after that). An API that
// does not answer now is asked again at the next Get: until then the
// bundle is empty and no peer is taken.
func (c *Client) CABundle(ctx context.Context, ns, name, key string, every time.Duration) *CAPool {
	fetch := func() ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := c.do(ctx, "GET", "/api/v1/namespaces/"+url.PathEscape(ns)+"/configmaps/"+url.PathEscape(name), "", nil, &cm); err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s: %w", ns, name, err)
		}
		if cm.Data[key] == "" {
			return nil, fmt.Errorf("ConfigMap %s/%s has no %s", ns, name, key)
		}
		return []byte(cm.Data[key]), nil
	}
	p := &CAPool{fetch: fetch, every: every, log: c.log}
	p.busy = true
	p.refresh()
	return p
}
