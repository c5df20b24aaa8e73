package registry

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/atomicfile"
)

// Files kept in the state directory.
const (
	certFile = "tls.crt"
	keyFile  = "tls.key"
	portFile = "port"
)

// certLifetime is how long a generated certificate is valid; one that has
// less than certRenewBefore left is replaced at start.
const (
	certLifetime    = 10 * 365 * 24 * time.Hour
	certRenewBefore = 30 * 24 * time.Hour
)

// loadOrCreateCert returns the kept certificate and key, or makes new ones
// (ECDSA P-256, CA:TRUE so that the certificate itself can be installed as
// certs.d's ca.crt, SAN IP:127.0.0.1) when they are missing, unreadable,
// about to expire or not for 127.0.0.1. created says a new one was made.
func loadOrCreateCert(dir string, now time.Time) (cert tls.Certificate, certPEM []byte, created bool, err error) {
	certPEM, errC := os.ReadFile(filepath.Join(dir, certFile))
	keyPEM, errK := os.ReadFile(filepath.Join(dir, keyFile))
	if errC == nil && errK == nil {
		if c, err := tls.X509KeyPair(certPEM, keyPEM); err == nil && certUsable(c.Leaf, now) {
			return c, certPEM, false, nil
		}
	}
	certPEM, keyPEM, err = newCert(now)
	if err != nil {
		return tls.Certificate{}, nil, false, err
	}
	// Key first: a crash between the two leaves a key without its
	// certificate, which the next start replaces.
	if err := atomicfile.WriteFile(filepath.Join(dir, keyFile), keyPEM, 0o600); err != nil {
		return tls.Certificate{}, nil, false, err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, certFile), certPEM, 0o644); err != nil {
		return tls.Certificate{}, nil, false, err
	}
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	return cert, certPEM, true, err
}

func certUsable(c *x509.Certificate, now time.Time) bool {
	if c == nil || !c.IsCA || now.Before(c.NotBefore) || now.Add(certRenewBefore).After(c.NotAfter) {
		return false
	}
	if len(c.PermittedIPRanges) == 0 || !c.PermittedDNSDomainsCritical {
		return false // made before it was constrained to loopback: made anew
	}
	return c.VerifyHostname("127.0.0.1") == nil
}

func newCert(now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate registry key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("generate registry certificate serial: %w", err)
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ferry embedded registry", Organization: []string{"ferry " + host}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		// CRI-O trusts it as a CA (certs.d's ca.crt) for this address
		// only; should its key leak, it still vouches for nothing but
		// loopback names, and signs no other CA.
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{"localhost"},
		PermittedIPRanges: []*net.IPNet{
			{IP: net.IPv4(127, 0, 0, 1).To4(), Mask: net.CIDRMask(32, 32)},
			{IP: net.IPv6loopback, Mask: net.CIDRMask(128, 128)},
		},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create registry certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode registry key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// keptPort reads the port chosen at first start; 0 if none was kept.
func keptPort(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, portFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read registry port: %w", err)
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 || p > 65535 {
		return 0, fmt.Errorf("%s holds %q, not a port: remove it and ferry chooses a new one", filepath.Join(dir, portFile), strings.TrimSpace(string(b)))
	}
	return p, nil
}
