package releasesig_test

import (
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/test/releasesig"
)

// The signature verifies with containers/image's simple signing for its
// manifest and identity, and for nothing else.
func TestSignRelease_VerifiesAsContainersImageDoesAndOnlyForItsRelease(t *testing.T) {
	k := releasesig.Test()
	manifest := []byte(`{"schemaVersion":2}`)
	d := digest.FromBytes(manifest).String()
	const repo = "quay.io/openshift-release-dev/ocp-release"
	sig := k.SignRelease(repo+"@"+d, "4.13.7", "x86_64")

	got, err := k.Verify(sig, manifest, repo+":4.13.7-x86_64")
	if err != nil || got != d {
		t.Fatalf("Verify: %q, %v; want %s", got, err, d)
	}
	for name, tc := range map[string]struct {
		key      *releasesig.Key
		sig      []byte
		manifest []byte
		identity string
	}{
		"another manifest":    {k, sig, []byte(`{"schemaVersion":2,"x":1}`), repo + ":4.13.7-x86_64"},
		"another identity":    {k, sig, manifest, repo + ":4.13.8-x86_64"},
		"another key":         {releasesig.NewKey(), sig, manifest, repo + ":4.13.7-x86_64"},
		"the old placeholder": {k, releasesig.Placeholder, manifest, repo + ":4.13.7-x86_64"},
	} {
		if _, err := tc.key.Verify(tc.sig, tc.manifest, tc.identity); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}
