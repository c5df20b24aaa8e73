package imageref

import "testing"

func TestSplit(t *testing.T) {
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ ref, name, tag, digest string }{
		{"quay.io/a/b@" + d, "quay.io/a/b", "", d},
		{"quay.io/a/b:v1@" + d, "quay.io/a/b", "v1", d},
		{"quay.io/a/b:v1", "quay.io/a/b", "v1", ""},
		{"host:5000/a/b", "host:5000/a/b", "", ""},
		{"host:5000/a/b:v1@" + d, "host:5000/a/b", "v1", d},
	} {
		name, tag, digest := Split(tc.ref)
		if name != tc.name || tag != tc.tag || digest != tc.digest {
			t.Errorf("Split(%q) = %q, %q, %q; want %q, %q, %q", tc.ref, name, tag, digest, tc.name, tc.tag, tc.digest)
		}
	}
}
