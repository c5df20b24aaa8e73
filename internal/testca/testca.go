// Package testca mints certificate authorities and the certificates they
// sign, for tests: a kubelet-shaped client certificate (CN
// system:node:NAME, O system:nodes), a serving certificate for an address.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	PEM  []byte // its certificate
}

// New makes a CA named name, valid for a day.
func New(t testing.TB, name string) *CA {
	t.Helper()
	k := key(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &CA{Cert: c, key: k, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func key(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Cert is what a CA issues.
type Cert struct {
	CN    string
	O     []string
	Hosts []string // DNS names or IPs: a serving certificate for them
	// Client and Server are the extended key usages (both when neither).
	Client, Server bool
}

// Issue signs c and returns its certificate and key, PEM.
func (ca *CA) Issue(t testing.TB, c Cert) (certPEM, keyPEM []byte) {
	t.Helper()
	k := key(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: c.CN, Organization: c.O},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment}
	if c.Client || !c.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	if c.Server || !c.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range c.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &k.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// Node is a kubelet-shaped client certificate of node name (CN
// system:node:NAME, O system:nodes).
func (ca *CA) Node(t testing.TB, name string) (certPEM, keyPEM []byte) {
	return ca.Issue(t, Cert{CN: "system:node:" + name, O: []string{"system:nodes"}, Client: true})
}

// Serving is a kubelet-shaped serving certificate of node name for hosts.
func (ca *CA) Serving(t testing.TB, name string, hosts ...string) (certPEM, keyPEM []byte) {
	return ca.Issue(t, Cert{CN: "system:node:" + name, O: []string{"system:nodes"}, Hosts: hosts, Server: true})
}

// WriteCurrent writes certificate and key into one new file in dir and
// points dir/NAME-current.pem at it, as the kubelet rotates its
// certificates; it returns the link's path.
func WriteCurrent(t testing.TB, dir, name string, certPEM, keyPEM []byte) string {
	t.Helper()
	f := filepath.Join(dir, name+"-"+time.Now().Format("2006-01-02-15-04-05.000000000")+".pem")
	if err := os.WriteFile(f, append(append([]byte{}, certPEM...), keyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, name+"-current.pem")
	tmp := link + ".tmp"
	os.Remove(tmp)
	if err := os.Symlink(f, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
	return link
}

// Pool is a pool of the given CAs.
func Pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// KeyPair is a tls.Certificate of PEM certificate and key.
func KeyPair(t testing.TB, certPEM, keyPEM []byte) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
