package create

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/diskspace"
	"github.com/ferry-edge/ferry/internal/regprefix"
)

// Reasons bundle create fails; errors.Is finds them in its errors.
var (
	ErrBadReference = errors.New("bad image reference")
	ErrAuth         = errors.New("registry refused credentials")
	ErrUnreachable  = errors.New("registry unreachable")
	ErrNotFound     = errors.New("image not found")
	ErrUntrusted    = errors.New("registry certificate not trusted")
	// ErrDiskFull is ErrNoSpace: the output or work dir filled up.
	ErrDiskFull = diskspace.ErrNoSpace
	// ErrRelease: the release image is not one ferry can read.
	ErrRelease = bundle.ErrRelease
)

// Mirror makes bundle create fetch images whose name starts with Prefix
// from Location instead (Prefix replaced by Location), while the bundle
// keeps the original name. Several entries of one prefix are tried in
// their order, as containers/image tries a registry's mirrors and then its
// location: the first that serves the image is used for all of it. An
// entry whose Location is its Prefix is the origin itself. A Prefix
// "*.domain" (registries.conf's wildcard) stands for any host under
// domain; its Location replaces the host, and "" is the origin.
type Mirror struct {
	Prefix, Location string
	// Insecure: plain HTTP or an unverified certificate is accepted there
	// (registries.conf insecure = true); every byte is still checked
	// against its digest.
	Insecure bool
	// DigestOnly and TagOnly: the entry serves only pulls by digest, or
	// only pulls by tag (pull-from-mirror, mirror-by-digest-only).
	DigestOnly, TagOnly bool
	// Blocked ends the prefix's list: nothing under it goes anywhere
	// else, its origin included (registries.conf blocked = true).
	Blocked bool
}

// ParseMirror parses PREFIX=LOCATION (e.g. "quay.io/=127.0.0.1:5000/").
func ParseMirror(s string) (Mirror, error) {
	p, l, ok := strings.Cut(s, "=")
	if !ok || p == "" || l == "" || strings.Contains(l, "=") {
		return Mirror{}, fmt.Errorf("mirror %q: want PREFIX=LOCATION, e.g. quay.io/=registry.local:5000/", s)
	}
	if strings.HasSuffix(p, "/") != strings.HasSuffix(l, "/") {
		return Mirror{}, fmt.Errorf("mirror %q: PREFIX and LOCATION must both end in / or both not", s)
	}
	return Mirror{Prefix: p, Location: l}, nil
}

// route is one place an image is fetched from: its repository there.
type route struct {
	name     string
	insecure bool
}

// errBlocked: the node's configuration lets no pull of the image go
// anywhere.
var errBlocked = errors.New("blocked by the registries configuration")

// routes maps a repository name through the mirrors of its longest
// matching prefix, in their order, keeping those that serve this kind of
// pull (byDigest), as containers/image does (package regprefix): a prefix
// "*.domain" matches any host under domain; one that ends in "/" (bundle
// create --mirror) matches any name it starts; any other a whole name or
// a name followed by "/". No matching prefix: the name itself. A place
// whose own entry is blocked is never asked, as containers/image refuses
// to contact it; so a pull under a blocked prefix fails here, before any
// request carries the pull secret.
func routes(name string, byDigest bool, mirrors []Mirror) ([]route, error) {
	best, n := longestPrefix(name, mirrors)
	if best == "" {
		return []route{{name: name}}, nil
	}
	var out []route
	for _, m := range mirrors {
		if m.Prefix != best {
			continue
		}
		if m.Blocked {
			break
		}
		if byDigest && m.TagOnly || !byDigest && m.DigestOnly {
			continue
		}
		to := name // a wildcard entry without a location: the origin
		if m.Location != "" {
			to = m.Location + name[n:]
		}
		if p, _ := longestPrefix(to, mirrors); blocked(p, mirrors) {
			continue
		}
		out = append(out, route{name: to, insecure: m.Insecure})
	}
	if len(out) == 0 {
		kind := map[bool]string{true: "digest", false: "tag"}[byDigest]
		return nil, fmt.Errorf("%w: %s: under %s no mirror serves a pull by %s and the origin is blocked", errBlocked, name, best, kind)
	}
	return out, nil
}

// longestPrefix is the longest of mirrors' prefixes that matches name
// ("" if none) and how much of name it stands for.
func longestPrefix(name string, mirrors []Mirror) (string, int) {
	best, n := "", -1
	for _, m := range mirrors {
		k := regprefix.Match(name, m.Prefix)
		if k < 0 && strings.HasSuffix(m.Prefix, "/") && strings.HasPrefix(name, m.Prefix) {
			k = len(m.Prefix) // bundle create --mirror's form
		}
		if k >= 0 && len(m.Prefix) > len(best) {
			best, n = m.Prefix, k
		}
	}
	return best, n
}

// blocked reports whether prefix's entry is blocked.
func blocked(prefix string, mirrors []Mirror) bool {
	return prefix != "" && slices.ContainsFunc(mirrors, func(m Mirror) bool { return m.Prefix == prefix && m.Blocked })
}

// insecureTransport sends a request to a host the node's configuration
// marks insecure (hosts) without checking its certificate, and every other
// through base.
type insecureTransport struct {
	base  http.RoundTripper
	hosts *sync.Map // host[:port] → true
	once  sync.Once
	skip  http.RoundTripper
}

func (t *insecureTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if _, ok := t.hosts.Load(r.URL.Host); !ok || r.URL.Scheme != "https" {
		return t.base.RoundTrip(r)
	}
	t.once.Do(func() {
		var tr *http.Transport
		switch b := t.base.(type) {
		case *http.Transport:
			tr = b.Clone()
		case *certsDTransport:
			tr = b.base.Clone()
		default:
			tr = http.DefaultTransport.(*http.Transport).Clone()
		}
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // registries.conf insecure = true; blobs are checked by digest
		t.skip = tr
	})
	return t.skip.RoundTrip(r)
}

// NewTransport is the HTTP transport bundle create fetches with. certDir,
// when not empty, is a containers certs.d directory: for a registry
// host[:port], every *.crt in certDir/host[:port]/ is trusted (with the
// system roots) and a *.cert with its *.key is offered as client
// certificate. tlsVerify false skips certificate checks.
func NewTransport(certDir string, tlsVerify bool) (http.RoundTripper, error) {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 16
	if !tlsVerify {
		base.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		return base, nil
	}
	if certDir == "" {
		return base, nil
	}
	if fi, err := os.Stat(certDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("--cert-dir %s: not a directory (want <dir>/<host[:port]>/ca.crt)", certDir)
	}
	return &certsDTransport{base: base, dir: certDir, byHost: map[string]http.RoundTripper{}}, nil
}

type certsDTransport struct {
	base   *http.Transport
	dir    string
	mu     sync.Mutex
	byHost map[string]http.RoundTripper
}

func (t *certsDTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" {
		return t.base.RoundTrip(r)
	}
	rt, err := t.forHost(r.URL.Host)
	if err != nil {
		return nil, err
	}
	return rt.RoundTrip(r)
}

func (t *certsDTransport) forHost(host string) (http.RoundTripper, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rt, ok := t.byHost[host]; ok {
		return rt, nil
	}
	dir := filepath.Join(t.dir, host)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.byHost[host] = t.base
		return t.base, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	cfg := &tls.Config{RootCAs: pool}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case strings.HasSuffix(e.Name(), ".crt"):
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, err
			}
			if !pool.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--cert-dir: %s holds no PEM certificate", p)
			}
		case strings.HasSuffix(e.Name(), ".cert"):
			key := strings.TrimSuffix(p, ".cert") + ".key"
			c, err := tls.LoadX509KeyPair(p, key)
			if err != nil {
				return nil, fmt.Errorf("--cert-dir: client certificate %s with %s: %w", p, key, err)
			}
			cfg.Certificates = append(cfg.Certificates, c)
		}
	}
	tr := t.base.Clone()
	tr.TLSClientConfig = cfg
	t.byHost[host] = tr
	return tr, nil
}

// LoadPullSecret reads an auth.json / OpenShift pull secret
// ({"auths": {"quay.io": {"auth": "<base64 user:password>"}}}). Keys may
// be a host or a host/path prefix; the longest match wins.
func LoadPullSecret(path string) (authn.Keychain, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--pull-secret: %w", err)
	}
	var f struct {
		Auths map[string]authn.AuthConfig `json:"auths"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("--pull-secret %s: not a pull secret / auth.json: %v", path, err)
	}
	if f.Auths == nil {
		return nil, fmt.Errorf("--pull-secret %s: no \"auths\" object", path)
	}
	kc := &secretKeychain{auths: map[string]authn.AuthConfig{}}
	for k, a := range f.Auths {
		if a.Auth != "" && a.Username == "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("--pull-secret %s: %s: auth is not base64", path, k)
			}
			u, p, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("--pull-secret %s: %s: auth is not user:password", path, k)
			}
			a.Username, a.Password, a.Auth = u, p, ""
		}
		kc.auths[normalizeAuthKey(k)] = a
	}
	for k := range kc.auths {
		kc.keys = append(kc.keys, k)
	}
	sort.Slice(kc.keys, func(i, j int) bool { return len(kc.keys[i]) > len(kc.keys[j]) })
	return kc, nil
}

type secretKeychain struct {
	auths map[string]authn.AuthConfig
	keys  []string // longest first
}

func (k *secretKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	full := normalizeAuthKey(r.String())
	for _, key := range k.keys {
		if full == key || strings.HasPrefix(full, key+"/") {
			return authn.FromConfig(k.auths[key]), nil
		}
	}
	return authn.Anonymous, nil
}

// normalizeAuthKey turns "https://index.docker.io/v1/" and the like into
// "docker.io"; other keys lose their scheme and trailing slash.
func normalizeAuthKey(k string) string {
	k = strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://")
	k = strings.TrimSuffix(k, "/")
	k = strings.TrimSuffix(k, "/v1")
	k = strings.TrimSuffix(k, "/v2")
	for _, d := range []string{"index.docker.io", "registry-1.docker.io"} {
		if k == d || strings.HasPrefix(k, d+"/") {
			k = "docker.io" + k[len(d):]
		}
	}
	return k
}

// explain wraps a fetch error from registry host with its reason and what
// to do about it.
func explain(err error, host, what string) error {
	var terr *transport.Error
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var cerr *tls.CertificateVerificationError
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden):
		return fmt.Errorf("%w: registry %s refused credentials for %s (HTTP %d): check --pull-secret", ErrAuth, host, what, terr.StatusCode)
	case errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %s is not in registry %s: check the reference and any --mirror", ErrNotFound, what, host)
	case errors.As(err, &uerr), errors.As(err, &herr), errors.As(err, &cerr):
		return fmt.Errorf("%w: registry %s: %v: put its CA in --cert-dir as <dir>/%s/ca.crt, or pass --tls-verify=false", ErrUntrusted, host, err, host)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w (disk full): no space left writing %s: free space in --work-dir or --output and run again (what was copied is kept)", ErrDiskFull, what)
	case errors.As(err, &dnsErr), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.As(err, &opErr):
		return fmt.Errorf("%w: cannot reach registry %s for %s: %v: check the name, the network and any --mirror", ErrUnreachable, host, what, err)
	}
	return fmt.Errorf("%s from %s: %w", what, host, err)
}
