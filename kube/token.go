package kube

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tokens gives each request its bearer token: the kubeconfig's own, or
// its tokenFile's, read again whenever the file changes (a short-lived
// token renewed by ferry itself or written anew by an administrator).
type tokens struct {
	file string
	mu   sync.Mutex
	tok  string
	seen stamp
}

type stamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stampOf(fi os.FileInfo) stamp {
	s := stamp{mod: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

func newTokens(ep endpoint) *tokens {
	t := &tokens{file: ep.tokenFile, tok: ep.token}
	if t.file != "" {
		if fi, err := os.Stat(t.file); err == nil {
			t.seen = stampOf(fi)
		}
	}
	return t
}

// get is the newest token. A file that cannot be read or is empty keeps
// the last token: the API server says when that one no longer works.
func (t *tokens) get() string {
	if t.file == "" {
		return t.tok
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.file)
	if err != nil {
		return t.tok
	}
	if st := stampOf(fi); st != t.seen {
		if b, err := os.ReadFile(t.file); err == nil && len(bytes.TrimSpace(b)) > 0 {
			t.tok, t.seen = string(bytes.TrimSpace(b)), st
		}
	}
	return t.tok
}

// claims are what ferry reads of a ServiceAccount token (a JWT). The API
// server checks its signature; ferry reads only when it expires and whom
// it names.
type claims struct {
	Exp int64 `json:"exp"`
	Iat int64 `json:"iat"`
	K8s struct {
		Namespace      string `json:"namespace"`
		ServiceAccount struct {
			Name string `json:"name"`
		} `json:"serviceaccount"`
		Node *struct {
			Name string `json:"name"`
		} `json:"node"`
	} `json:"kubernetes.io"`
}

// parseClaims reads a JWT's payload without checking it; false for a
// token that is not a JWT.
func parseClaims(tok string) (claims, bool) {
	var c claims
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return c, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return c, false
	}
	return c, json.Unmarshal(b, &c) == nil
}

// renewable: a ServiceAccount token bound to a Node, with an expiry.
func (c claims) renewable() bool {
	return c.Exp > c.Iat && c.Iat > 0 && c.K8s.Namespace != "" && c.K8s.ServiceAccount.Name != "" && c.K8s.Node != nil && c.K8s.Node.Name != ""
}

// renewAt is when a token is renewed: two thirds into its life.
func (c claims) renewAt() time.Time {
	return time.Unix(c.Iat+(c.Exp-c.Iat)*2/3, 0)
}

// MaxTokenLife is the longest token ferry asks for when it renews its
// own (the ferry-token admission policy refuses longer ones).
const MaxTokenLife = 24 * time.Hour

// ErrNotRenewable is a credential ferry cannot renew itself: no
// tokenFile, or a token that is not a ServiceAccount token bound to a Node.
var ErrNotRenewable = fmt.Errorf("ferry's credential is not a Node-bound ServiceAccount token in a tokenFile")

// RenewToken asks the API server for a new token of the same
// ServiceAccount, bound to the same Node, as long-lived as the current
// one (at most MaxTokenLife), and writes it over the tokenFile. It
// returns the new token's expiry.
func (c *Client) RenewToken(ctx context.Context) (time.Time, error) {
	cl, ok := parseClaims(c.tokens.get())
	if c.ep.tokenFile == "" || !ok || !cl.renewable() {
		return time.Time{}, ErrNotRenewable
	}
	life := min(max(cl.Exp-cl.Iat, 600), int64(MaxTokenLife/time.Second))
	body := map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{
		"expirationSeconds": life,
		"boundObjectRef":    map[string]any{"apiVersion": "v1", "kind": "Node", "name": cl.K8s.Node.Name},
	}}
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	path := fmt.Sprintf("/api/v1/namespaces/%s/serviceaccounts/%s/token", url.PathEscape(cl.K8s.Namespace), url.PathEscape(cl.K8s.ServiceAccount.Name))
	if err := c.do(ctx, "POST", path, jsonType, body, &tr); err != nil {
		return time.Time{}, fmt.Errorf("renewing ferry's token for node %s: %w", cl.K8s.Node.Name, err)
	}
	next, ok := parseClaims(tr.Status.Token)
	if !ok {
		return time.Time{}, fmt.Errorf("renewing ferry's token: the API server's answer is not a token")
	}
	if err := writeToken(c.ep.tokenFile, tr.Status.Token); err != nil {
		return time.Time{}, fmt.Errorf("renewing ferry's token: %w", err)
	}
	return time.Unix(next.Exp, 0), nil
}

// writeToken replaces path with tok: a temporary file beside it (0600),
// synced, renamed in.
func writeToken(path, tok string) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".token-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// KeepTokenFresh renews ferry's token two thirds into its life, until ctx
// ends. With a client certificate and no token (the kubelet's credential)
// there is nothing to renew: it returns at once. A credential it cannot renew (a client certificate, a token in
// the kubeconfig itself, a token bound to no Node) is left alone: it is
// looked at again each minute, as an administrator may write a
// renewable one into the tokenFile.
func (c *Client) KeepTokenFresh(ctx context.Context) error {
	if c.certs != nil && c.ep.token == "" && c.ep.tokenFile == "" {
		// The kubelet renews its own certificate; ferry reads it again.
		return nil
	}
	if c.ep.tokenFile == "" {
		c.log.Warn("kube: ferry's token is not in a tokenFile, so ferry cannot renew it: use a short-lived token bound to this node's Node in a tokenFile (docs/admin.md, \"Per-node credentials\")")
		return nil
	}
	warned := false
	for {
		wait := time.Minute
		cl, ok := parseClaims(c.tokens.get())
		switch {
		case !ok || !cl.renewable():
			if !warned {
				c.log.Warn("kube: ferry's token is not a ServiceAccount token bound to a Node: ferry does not renew it (docs/admin.md, \"Per-node credentials\")", "file", c.ep.tokenFile)
				warned = true
			}
		case time.Now().After(time.Unix(cl.Exp, 0)):
			c.log.Error("kube: ferry's token has expired: write a new one for this node (docs/admin.md, \"Per-node credentials\")", "file", c.ep.tokenFile, "expired", time.Unix(cl.Exp, 0).UTC())
		case !time.Now().Before(cl.renewAt()):
			if exp, err := c.RenewToken(ctx); err != nil {
				c.log.Warn("kube: cannot renew ferry's token; trying again in a minute", "err", err, "expires", time.Unix(cl.Exp, 0).UTC())
			} else {
				c.log.Info("kube: renewed ferry's token", "node", cl.K8s.Node.Name, "expires", exp.UTC())
				continue
			}
		default:
			warned = false
			wait = min(time.Until(cl.renewAt()), time.Minute)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
	}
}
