// Package kube is ferry's Kubernetes client: exactly what the agent needs
// of the cluster's API (its Node's annotations, the release signature
// ConfigMap, ClusterVersion, the machine config operator's state of its
// Node) on net/http, with a kubeconfig, timeouts and retries.
//
// Why not client-go: ferry needs about twenty REST calls and three
// watches (watch.go, follow.go) on about twelve paths. Measured on ferry's
// own binary (go1.26, -trimpath): 41.9 MB with this package's watches
// (+63 KB over the polling client it replaced, ~480 lines), against
// +7.7 MB measured earlier for client-go's dynamic client and kubeconfig
// loader alone (+39.5 MB with the typed clientset). Twenty agents, each
// holding a bundle, cost a real API server 1.0 request a minute each
// (36 when they polled); docs/benchmarks.md, K1.
package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrForbidden means the API refused ferry's identity a right it needs.
var ErrForbidden = errors.New("the cluster's API refuses ferry")

// APIError is an answer of the API server that is not a success.
type APIError struct {
	Code    int
	Reason  string // Kubernetes' reason, e.g. "Conflict", "Forbidden"
	Message string
	// RetryAfter is how long the server asked to wait (its Retry-After
	// header, with 429 and 503), 0 when it did not say.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	if e.Code == http.StatusForbidden {
		return fmt.Sprintf("%v (403): %s: apply ferry's RBAC and admission policies (packaging/rbac.yaml, admission.yaml) and check that its kubeconfig holds this node's own credential: the kubelet's (/var/lib/kubelet/kubeconfig) or a token of ferry's ServiceAccount bound to this node's Node", ErrForbidden, e.Message)
	}
	return fmt.Sprintf("the cluster's API answered %d %s: %s", e.Code, e.Reason, e.Message)
}

func (e *APIError) Is(target error) bool {
	return target == ErrForbidden && e.Code == http.StatusForbidden || target == ErrGone && e.Code == http.StatusGone
}

// IsConflict reports a 409 (a write raced another, or the object exists).
func IsConflict(err error) bool {
	var a *APIError
	return errors.As(err, &a) && a.Code == http.StatusConflict
}

// IsNotFound reports a 404.
func IsNotFound(err error) bool {
	var a *APIError
	return errors.As(err, &a) && a.Code == http.StatusNotFound
}

// Client talks to one API server.
type Client struct {
	ep     endpoint
	tokens *tokens
	certs  *KeyPair // the client certificate, nil with a token
	hc     *http.Client
	stream *http.Client // watches: no overall timeout (Watch bounds each)
	log    *slog.Logger
	// Attempts bounds the tries of one call on network errors, 429 and
	// 5xx; Backoff is the first wait, doubled each time.
	Attempts int
	Backoff  time.Duration
	// FieldManager names this node's writes in the objects' managedFields
	// ("ferry-<node>"), so that each node's part of a shared object shows
	// as its own; "" lets the API server name it after the user agent.
	FieldManager string

	// pulls is the pull record last applied, by bundle/node (bundleapply.go).
	pulls sync.Map
	// pathEvents are the path's Events recorded once (path.go).
	pathEvents sync.Map
}

// FieldManager is node's field manager: "ferry-<node>", within the API
// server's 128 characters.
func FieldManager(node string) string {
	m := "ferry-" + node
	if len(m) > 128 {
		m = m[:128]
	}
	return m
}

// New reads a kubeconfig and returns a client for its current context.
func New(kubeconfig string, log *slog.Logger) (*Client, error) {
	ep, err := loadKubeconfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ep.insecure {
		log.Warn("kube: "+InsecureWarning(ep.server), "kubeconfig", kubeconfig)
	}
	var certs *KeyPair
	if ep.cert != nil {
		// The kubelet's certificate is rotated under ferry: each new
		// connection presents the newest (GetClientCertificate).
		certs = &KeyPair{certFile: ep.certFile, keyFile: ep.keyFile, cert: ep.cert}
		certs.seen = certs.stamps()
		ep.tls.GetClientCertificate = certs.clientCertificate
	}
	dial := (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr := newRotating(func(d *conns) *http.Transport {
		return &http.Transport{
			TLSClientConfig:     ep.tls,
			DialContext:         d.DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConns:        2,
			IdleConnTimeout:     90 * time.Second,
			// A custom TLS config and dialer turn Go's HTTP/2 off unless
			// asked: with it every watch and request shares one connection,
			// as client-go's do, instead of one TLS connection per watch.
			ForceAttemptHTTP2: true,
		}
	}, dial)
	if certs != nil {
		// Connections kept open still carry the old certificate, which
		// the API server checks on every request: new ones from here on.
		certs.changed = tr.rotate
	}
	return &Client{ep: ep, tokens: newTokens(ep), certs: certs, hc: &http.Client{Transport: tr, Timeout: time.Minute}, stream: &http.Client{Transport: tr},
		log: log, Attempts: 4, Backoff: 250 * time.Millisecond}, nil
}

// WrapTransport puts wrap around the transport of every request the
// client sends, watches included (cmd/ferry counts them in metrics).
func (c *Client) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	c.hc.Transport, c.stream.Transport = wrap(c.hc.Transport), wrap(c.stream.Transport)
}

// Server is the API server's URL.
func (c *Client) Server() string { return c.ep.server }

// Insecure reports a kubeconfig with insecure-skip-tls-verify: anyone on
// the path to the API server can pose as it and take ferry's token.
func (c *Client) Insecure() bool { return c.ep.insecure }

// InsecureWarning is what ferry says, in its log and its status, of a
// kubeconfig that does not check the API server's certificate.
func InsecureWarning(server string) string {
	return "the kubeconfig turns TLS verification off (insecure-skip-tls-verify) for " + server +
		": anyone on the network path can pose as the API server and take ferry's token; set certificate-authority (on OpenShift /etc/kubernetes/kubelet-ca.crt) instead"
}

// do sends one request, retrying what a retry can fix (after a wait that
// doubles, with jitter, or as long as the server's Retry-After asks);
// out, when not nil, receives the JSON answer.
func (c *Client) do(ctx context.Context, method, path, contentType string, body any, out any) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	wait := c.Backoff
	var last error
	for attempt := 1; ; attempt++ {
		last = c.once(ctx, method, path, contentType, payload, out)
		if last == nil || !retryable(last) || attempt >= c.Attempts || ctx.Err() != nil ||
			method == http.MethodPost && !unsent(last) {
			return last
		}
		c.log.Debug("kube: retrying", "method", method, "path", path, "err", last)
		select {
		case <-time.After(retryWait(wait, last)):
		case <-ctx.Done():
			return last
		}
		wait *= 2
	}
}

// retryWait is d with jitter (d to 2d, as client-go's backoff), or what
// err's Retry-After asks when that is longer.
func retryWait(d time.Duration, err error) time.Duration {
	if d > 0 {
		d += rand.N(d)
	}
	var a *APIError
	if errors.As(err, &a) && a.RetryAfter > d {
		return a.RetryAfter
	}
	return d
}

func (c *Client) once(ctx context.Context, method, path, contentType string, payload []byte, out any) error {
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := c.request(ctx, method, path, contentType, rd)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("the cluster's API at %s cannot be reached: %w", c.ep.server, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the cluster's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return answerError(resp, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("the cluster's answer to %s %s is not the JSON expected: %w", method, path, err)
		}
	}
	return nil
}

// request is a request to path with ferry's identity.
func (c *Client) request(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Request, error) {
	if c.FieldManager != "" && !strings.Contains(path, "fieldManager=") && (method == http.MethodPatch || method == http.MethodPost || method == http.MethodPut) {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + "fieldManager=" + url.QueryEscape(c.FieldManager)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.ep.server+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "ferry")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.certs != nil {
		c.certs.Get() // a stat: a rotated certificate is read now
	}
	if tok := c.tokens.get(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return req, nil
}

// answerError is the APIError of an answer that is not a success (b: its
// body, a Kubernetes Status).
func answerError(resp *http.Response, b []byte) *APIError {
	e := statusError(b, resp.StatusCode)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(min(s, 600)) * time.Second
	}
	return e
}

// statusError reads a Kubernetes Status: code is the answer's HTTP
// status, 0 for a watch's ERROR event (the Status's own code then).
func statusError(b []byte, code int) *APIError {
	var st struct {
		Code    int    `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	json.Unmarshal(b, &st)
	if code != 0 {
		st.Code = code
	} else if st.Code == 0 {
		st.Code = http.StatusInternalServerError
	}
	if st.Message == "" {
		st.Message = http.StatusText(st.Code)
	}
	return &APIError{Code: st.Code, Reason: st.Reason, Message: st.Message}
}

// unsent: an answer that says the request was not acted on, so a POST
// can be sent again without making a second object (429: turned away by
// the server's flow control; a failed dial: never sent). Anything else, a
// 5xx or a connection lost mid-answer, may have created it.
func unsent(err error) bool {
	var a *APIError
	if errors.As(err, &a) {
		return a.Code == http.StatusTooManyRequests
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// retryable: network errors, 429 and 5xx; not 4xx.
func retryable(err error) bool {
	var a *APIError
	if errors.As(err, &a) {
		return a.Code == http.StatusTooManyRequests || a.Code >= 500
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

const (
	mergePatch = "application/merge-patch+json"
	jsonType   = "application/json"
)

// Raw sends one request to path with the client's identity and retries;
// out, when not nil, receives the JSON answer. For what ferry's own calls
// do not cover (test harnesses, `ferry status --cluster`).
func (c *Client) Raw(ctx context.Context, method, path, contentType string, body, out any) error {
	return c.do(ctx, method, path, contentType, body, out)
}
