package kube

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

// kubeconfig is the part of a kubeconfig file ferry reads.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
			// TLSServerName is the name the server's certificate is
			// checked against when the server is reached by another
			// (a forwarded port, an address the certificate does not name).
			TLSServerName string `yaml:"tls-server-name"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Token                 string `yaml:"token"`
			TokenFile             string `yaml:"tokenFile"`
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// endpoint is where and how to reach the API server.
type endpoint struct {
	server    string
	token     string // the token, or tokenFile's content when it was read
	tokenFile string // absolute; re-read when it changes (short-lived tokens)
	insecure  bool   // insecure-skip-tls-verify: the server is not checked
	tls       *tls.Config
	// The client certificate: from files (certFile, keyFile, absolute;
	// read again when they change, as the kubelet rotates its own) or
	// from the kubeconfig's data (cert).
	certFile, keyFile string
	cert              *tls.Certificate
}

// ErrPlainHTTP is a kubeconfig whose server is not https://.
var ErrPlainHTTP = errors.New("the API server's address is not https://")

// loadKubeconfig reads path: its current context's server, CA, and token
// or client certificate. Relative file names are relative to path's dir.
func loadKubeconfig(path string) (endpoint, error) {
	var ep endpoint
	b, err := os.ReadFile(path)
	if err != nil {
		return ep, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return ep, fmt.Errorf("kubeconfig %s is not valid YAML: %v", path, err)
	}
	bad := func(format string, args ...any) (endpoint, error) {
		return endpoint{}, fmt.Errorf("kubeconfig %s: "+format, append([]any{path}, args...)...)
	}
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == ctxName {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return bad("no context %q (set current-context)", ctxName)
	}
	dir := filepath.Dir(path)
	file := func(p string) ([]byte, error) {
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return os.ReadFile(p)
	}
	ep.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	found = false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		ep.server = strings.TrimSuffix(c.Cluster.Server, "/")
		if u, err := url.Parse(ep.server); err != nil || u.Scheme != "https" || u.Host == "" {
			return bad("%w (%q): ferry sends its token only over TLS; use the API's https:// address (e.g. https://api-int.CLUSTER.DOMAIN:6443)", ErrPlainHTTP, ep.server)
		}
		var ca []byte
		switch {
		case c.Cluster.CertificateAuthorityData != "":
			if ca, err = base64.StdEncoding.DecodeString(c.Cluster.CertificateAuthorityData); err != nil {
				return bad("certificate-authority-data is not base64: %v", err)
			}
		case c.Cluster.CertificateAuthority != "":
			if ca, err = file(c.Cluster.CertificateAuthority); err != nil {
				return bad("certificate-authority: %v", err)
			}
		}
		if len(ca) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return bad("the certificate authority holds no PEM certificate")
			}
			ep.tls.RootCAs = pool
		}
		ep.tls.ServerName = c.Cluster.TLSServerName
		ep.tls.InsecureSkipVerify = c.Cluster.InsecureSkipTLSVerify
		ep.insecure = c.Cluster.InsecureSkipTLSVerify
	}
	if !found || ep.server == "" {
		return bad("no server for cluster %q", clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		ep.token = u.User.Token
		if u.User.TokenFile != "" {
			ep.tokenFile = u.User.TokenFile
			if !filepath.IsAbs(ep.tokenFile) {
				ep.tokenFile = filepath.Join(dir, ep.tokenFile)
			}
			t, err := os.ReadFile(ep.tokenFile)
			if err != nil {
				return bad("tokenFile: %v", err)
			}
			ep.token = strings.TrimSpace(string(t))
		}
		if err := ep.clientCert(u.User.ClientCertificate, u.User.ClientCertificateData, u.User.ClientKey, u.User.ClientKeyData, dir); err != nil {
			return bad("%v", err)
		}
	}
	if ep.token == "" && ep.cert == nil {
		return bad("user %q has no token, tokenFile or client certificate", userName)
	}
	return ep, nil
}

// clientCert reads the user's client certificate and key, each from a
// file (relative to dir) or from its -data; the files are remembered so
// that a rotated certificate is read again (certs.go).
func (ep *endpoint) clientCert(certFile, certData, keyFile, keyData, dir string) error {
	abs := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(dir, p)
		}
		return p
	}
	if certData == "" && certFile == "" {
		return nil
	}
	if certData != "" || keyData != "" {
		certPEM, err1 := base64.StdEncoding.DecodeString(certData)
		keyPEM, err2 := base64.StdEncoding.DecodeString(keyData)
		if keyData == "" && keyFile != "" {
			keyPEM, err2 = os.ReadFile(abs(keyFile))
		}
		if certData == "" {
			certPEM, err1 = os.ReadFile(abs(certFile))
		}
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("client certificate: %v", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return fmt.Errorf("client certificate: %v", err)
		}
		ep.cert = &cert
		return nil
	}
	if keyFile == "" {
		return fmt.Errorf("client-certificate %s without client-key", certFile)
	}
	ep.certFile, ep.keyFile = abs(certFile), abs(keyFile)
	cert, err := readKeyPair(ep.certFile, ep.keyFile)
	if err != nil {
		return err
	}
	ep.cert = cert
	return nil
}
