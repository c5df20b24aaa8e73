package crio

import "testing"

// Cases from containers/image v5.35.0 sysregistriesv2 (TestRefMatchingPrefix,
// TestRefMatchingSubdomainPrefix): ferry must pick the entry CRI-O picks.
func TestMatchPrefix_AgreesWithContainersImage(t *testing.T) {
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
		if got := matchPrefix(c.ref, c.prefix); got != c.want {
			t.Errorf("matchPrefix(%q, %q) = %d, want %d", c.ref, c.prefix, got, c.want)
		}
	}
}
