package create

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

func TestMirror_LongestPrefixWins(t *testing.T) {
	ms := []Mirror{
		{Prefix: "quay.io/", Location: "cache:5000/"},
		{Prefix: "quay.io/openshift-release-dev/", Location: "local:5000/ocp/"},
		{Prefix: "registry.example.com/team", Location: "mirror.example.com/team"},
	}
	for in, want := range map[string]string{
		"quay.io/my/app": "cache:5000/my/app",
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev": "local:5000/ocp/ocp-v4.0-art-dev",
		"registry.example.com/team/app":                  "mirror.example.com/team/app",
		"registry.example.com/teamster/app":              "registry.example.com/teamster/app",
		"docker.io/library/busybox":                      "docker.io/library/busybox",
	} {
		rs, err := routes(in, true, ms)
		if err != nil || len(rs) != 1 || rs[0].name != want {
			t.Errorf("%s: got %+v %v, want %s", in, rs, err, want)
		}
	}
}

// The node's registries.conf as containers/image reads it: a prefix's
// mirrors in order, those that serve the kind of pull, then its location
// unless blocked.
func TestRoutes_MirrorsInOrderThenTheOriginUnlessBlocked(t *testing.T) {
	ms := []Mirror{
		{Prefix: "quay.io/ocp", Location: "tags.example/ocp", TagOnly: true},
		{Prefix: "quay.io/ocp", Location: "first.example/ocp", DigestOnly: true},
		{Prefix: "quay.io/ocp", Location: "second.example/x", Insecure: true},
		{Prefix: "quay.io/ocp", Location: "quay.io/ocp"},
		{Prefix: "quay.io/closed", Location: "only.example/closed", DigestOnly: true},
		{Prefix: "quay.io/closed", Blocked: true},
	}
	names := func(rs []route) (out []string) {
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s insecure=%v", r.name, r.insecure))
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		byDigest bool
		want     []string
		err      string
	}{
		{"quay.io/ocp/release", true, []string{"first.example/ocp/release insecure=false", "second.example/x/release insecure=true", "quay.io/ocp/release insecure=false"}, ""},
		{"quay.io/ocp/release", false, []string{"tags.example/ocp/release insecure=false", "second.example/x/release insecure=true", "quay.io/ocp/release insecure=false"}, ""},
		{"quay.io/closed/app", true, []string{"only.example/closed/app insecure=false"}, ""},
		{"quay.io/closed/app", false, nil, "no mirror serves a pull by tag"},
		{"quay.io/other", false, []string{"quay.io/other insecure=false"}, ""},
	} {
		rs, err := routes(tc.name, tc.byDigest, ms)
		if tc.err != "" {
			if !errors.Is(err, errBlocked) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s by digest %v: got %v %v, want %q", tc.name, tc.byDigest, rs, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(names(rs), tc.want) {
			t.Errorf("%s by digest %v: got %v %v, want %v", tc.name, tc.byDigest, names(rs), err, tc.want)
		}
	}
}

// Wildcard prefixes as containers/image reads them: "*.domain" matches
// any host under domain, the longest prefix wins, a blocked one is never
// asked (nor a mirror whose own place it blocks), and a wildcard entry
// without a location pulls from the image's own name.
func TestRoutes_WildcardPrefixesAsContainersImage(t *testing.T) {
	ms := []Mirror{
		{Prefix: "*.example.com", Blocked: true},
		{Prefix: "*.corp.example.com", Location: "mirror.site/corp"},
		{Prefix: "*.corp.example.com", Location: ""},
		{Prefix: "*.lab.example.com", Location: "cache.blocked.example.com/lab", DigestOnly: true},
		{Prefix: "*.lab.example.com", Location: "other.site/lab", DigestOnly: true},
		{Prefix: "*.lab.example.com", Blocked: true},
		{Prefix: "open.example.com/team", Location: "open.example.com/team"},
	}
	for _, tc := range []struct {
		name string
		want []string
		err  string
	}{
		{"registry.example.com/ocp/release", nil, "under *.example.com no mirror"},
		{"a.b.example.com/x", nil, "under *.example.com"},
		{"git.corp.example.com/team/app", []string{"mirror.site/corp/team/app", "git.corp.example.com/team/app"}, ""},
		{"git.corp.example.com:5000/app", []string{"mirror.site/corp:5000/app", "git.corp.example.com:5000/app"}, ""},
		{"ci.lab.example.com/app", []string{"other.site/lab/app"}, ""},
		{"open.example.com/team/app", []string{"open.example.com/team/app"}, ""},
		{"open.example.com/other", nil, "under *.example.com"},
		{"example.com/app", []string{"example.com/app"}, ""},
		{"example.com.evil.net/app", []string{"example.com.evil.net/app"}, ""},
		{"evil.net/registry.example.com/app", []string{"evil.net/registry.example.com/app"}, ""},
	} {
		rs, err := routes(tc.name, true, ms)
		if tc.err != "" {
			if !errors.Is(err, errBlocked) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got %v %v, want blocked %q", tc.name, rs, err, tc.err)
			}
			continue
		}
		var got []string
		for _, r := range rs {
			got = append(got, r.name)
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v %v, want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestParseMirror_RefusesMalformed(t *testing.T) {
	if m, err := ParseMirror("quay.io/=127.0.0.1:5000/"); err != nil || m.Location != "127.0.0.1:5000/" {
		t.Fatalf("good mirror: %+v %v", m, err)
	}
	for _, s := range []string{"", "quay.io", "=x", "quay.io/=", "quay.io/=a:1", "a=b=c"} {
		if _, err := ParseMirror(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestLoadPullSecret_MatchesHostAndPathKeys(t *testing.T) {
	p := filepath.Join(t.TempDir(), "auth.json")
	os.WriteFile(p, []byte(`{"auths":{
		"quay.io":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("host:pw"))+`"},
		"quay.io/private":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("org:pw"))+`"},
		"https://index.docker.io/v1/":{"username":"hub","password":"pw"}}}`), 0o600)
	kc, err := LoadPullSecret(p)
	if err != nil {
		t.Fatal(err)
	}
	for ref, user := range map[string]string{
		"quay.io/private/app":    "org",
		"quay.io/privateer/app":  "host",
		"quay.io/other/app":      "host",
		"busybox":                "hub",
		"registry.example.com/x": "",
	} {
		repo, err := name.NewRepository(ref)
		if err != nil {
			t.Fatal(err)
		}
		a, err := kc.Resolve(repo)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := authn.Authorization(t.Context(), a)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Username != user {
			t.Errorf("%s: user %q, want %q", ref, cfg.Username, user)
		}
	}
	for _, bad := range []string{`{`, `{"auths":{"q":{"auth":"!!"}}}`, `{"other":1}`} {
		os.WriteFile(p, []byte(bad), 0o600)
		if _, err := LoadPullSecret(p); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestReadImageList_SkipsCommentsAndBlanks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "extra.txt")
	os.WriteFile(p, []byte("# custom images\nquay.io/a/b:v1\n\n  quay.io/c/d@sha256:"+strings.Repeat("a", 64)+"  # pinned\n"), 0o644)
	got, err := ReadImageList(p)
	if err != nil || len(got) != 2 || got[0] != "quay.io/a/b:v1" || !strings.HasPrefix(got[1], "quay.io/c/d@") {
		t.Fatalf("got %q %v", got, err)
	}
}

func TestProgressPrinter_TerminalLineAndLogLines(t *testing.T) {
	p := Progress{Phase: "copy", Images: 3, ImagesTotal: 10, Bytes: 50 << 20, BytesTotal: 100 << 20, Elapsed: 5 * time.Second}
	if eta := p.ETA(); eta != 5*time.Second {
		t.Fatalf("ETA %v", eta)
	}
	var term bytes.Buffer
	pr := ProgressPrinter(&term, true, nil, time.Hour)
	pr(p)
	if s := term.String(); !strings.HasPrefix(s, "\r") || !strings.Contains(s, "images 3/10") || !strings.Contains(s, "ETA 5s") {
		t.Fatalf("terminal line %q", s)
	}
	var logs bytes.Buffer
	pr = ProgressPrinter(nil, false, slog.New(slog.NewTextHandler(&logs, nil)), time.Hour)
	pr(p)
	pr(p) // within the interval: not logged
	p.Phase = "write"
	pr(p) // phase change: logged
	if n := strings.Count(logs.String(), "\n"); n != 2 {
		t.Fatalf("%d log lines, want 2:\n%s", n, logs.String())
	}
}
