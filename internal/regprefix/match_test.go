package regprefix

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"
)

// Cases from containers/image sysregistriesv2's own tests
// (TestRefMatchingPrefix, TestRefMatchingSubdomainPrefix): ferry must
// pick the entry CRI-O picks.
func TestMatch_AgreesWithContainersImage(t *testing.T) {
	const dg = "@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	for _, c := range []struct {
		ref, prefix string
		want        int
	}{
		{"docker.io", "docker.io", len("docker.io")},
		{"docker.io", "example.com", -1},
		{"example.com:50000", "example.com:5000", -1},
		{"example.com:5000", "example.com", len("example.com")},
		{"example.com/foo/bar:baz", "example.com", len("example.com")},
		{"example.com/foo/bar" + dg, "example.com", len("example.com")},
		{"docker.io", "docker.io/library", -1},
		{"docker.io/libraryy", "docker.io/library", -1},
		{"docker.io/library/busybox", "docker.io/library", len("docker.io/library")},
		{"docker.io/library/busybox2", "docker.io/library/busybox", -1},
		{"example.com/foo", "example.com/foo:bar", -1},
		{"example.com/foo:bar", "example.com/foo:bar", len("example.com/foo:bar")},
		{"example.com/foo", "*", -1},
		{"docker.io", "*.io", len("docker.io")},
		{"example.com/foo", "*.example.com", -1},
		{"example.com/foo:bar", "*.com", len("example.com")},
		{"yet.another.example.com/foo", "**.example.com", -1},
		{"yet.another.example.com/foo/bar", "*.another.example.com", len("yet.another.example.com")},
		{"another.example.com/namespace.com/foo/bar/bbq:baz", "*.example.com", len("another.example.com")},
		{"example.net/namespace-ends-in.com/foo/bar/bbq:baz", "*.com", -1},
		{"another.example.com/namespace.com/foo/bar/bbq:baz", "*.namespace.com", -1},
		{"yet.another.sub.example.com/foo/bar" + dg, "*.sub.example.com", len("yet.another.sub.example.com")},
	} {
		if got := Match(c.ref, c.prefix); got != c.want {
			t.Errorf("Match(%q, %q) = %d, want %d", c.ref, c.prefix, got, c.want)
		}
	}
}

// The entry containers/image itself picks (sysregistriesv2.FindRegistry,
// longest matching prefix) from a registries.conf holding every prefix
// below is the one Match picks.
func TestMatch_PicksTheEntryFindRegistryPicks(t *testing.T) {
	prefixes := []string{
		"*.example.com", "*.corp.example.com", "registry.example.com/team",
		"example.com", "quay.io", "quay.io/openshift-release-dev", "*.io",
	}
	var conf strings.Builder
	for _, p := range prefixes {
		loc := `""`
		if !strings.HasPrefix(p, "*.") {
			loc = strconv.Quote(p)
		}
		fmt.Fprintf(&conf, "[[registry]]\nprefix = %q\nlocation = %s\nblocked = true\n\n", p, loc)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	sys := &types.SystemContext{SystemRegistriesConfPath: path, SystemRegistriesConfDirPath: filepath.Join(dir, "none.d")}
	for _, ref := range []string{
		"registry.example.com/team/app", "registry.example.com/other", "git.corp.example.com/x",
		"a.b.corp.example.com:5000/x", "example.com/app", "example.com.evil.net/app",
		"quay.io/openshift-release-dev/ocp-release", "quay.io/other", "docker.io/library/busybox",
		"evil.net/registry.example.com/app", "ghcr.io", "localhost:5000/app",
	} {
		want := ""
		if r, err := sysregistriesv2.FindRegistry(sys, ref); err != nil {
			t.Fatal(err)
		} else if r != nil {
			want = r.Prefix
		}
		got := ""
		for _, p := range prefixes {
			if Match(ref, p) >= 0 && len(p) > len(got) {
				got = p
			}
		}
		if got != want {
			t.Errorf("%s: Match picks %q, FindRegistry %q", ref, got, want)
		}
	}
}
