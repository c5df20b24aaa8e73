package imagepolicy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/internal/imagetree"
)

// releasePolicy is what the MCO renders from OpenShift's default
// ClusterImagePolicy: a sigstore signature by one key for the release
// repository, anything else accepted.
func releasePolicy(keyPath string) string {
	return `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  "quay.io/openshift-release-dev/ocp-release":[{"type":"sigstoreSigned","keyPath":"` + keyPath + `","signedIdentity":{"type":"matchRepository"}}]}}}`
}

// check verifies a bundle written with o against the policy text.
func check(t *testing.T, policy string, o bundletest.Options) error {
	t.Helper()
	dir := t.TempDir()
	tarPath, _ := bundletest.Write(t, dir, o)
	c := Checker{Path: filepath.Join(dir, "policy.json")}
	if policy != "" {
		if err := os.WriteFile(c.Path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := bundle.Verify(t.Context(), bundle.Source{Path: tarPath, SHA256Path: strings.TrimSuffix(tarPath, ".tar") + ".sha256"},
		bundle.Options{Admit: c.Admit})
	return err
}

func writeKey(t *testing.T, pub []byte) string {
	p := filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(p, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAdmit_SignedReleasePassesTheNodesSigstorePolicy(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	if err := check(t, releasePolicy(writeKey(t, pub)), bundletest.Options{SignKey: key}); err != nil {
		t.Fatalf("a release signed by the node's key: %v", err)
	}
}

func TestAdmit_UnsignedReleaseIsRefusedNamingImageAndRequirement(t *testing.T) {
	_, pub := imagetree.NewSigningKey()
	keyPath := writeKey(t, pub)
	err := check(t, releasePolicy(keyPath), bundletest.Options{})
	if !errors.Is(err, bundle.ErrPolicy) || !bundle.IsRefusal(err) {
		t.Fatalf("err = %v, want a policy refusal", err)
	}
	for _, want := range []string{"quay.io/openshift-release-dev/ocp-release@sha256:", "a sigstore signature by the key in " + keyPath,
		"the bundle carries none", "make it again with a ferry that copies signatures"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
}

func TestAdmit_SignatureByAnotherKeyIsRefused(t *testing.T) {
	other, _ := imagetree.NewSigningKey()
	_, pub := imagetree.NewSigningKey()
	err := check(t, releasePolicy(writeKey(t, pub)), bundletest.Options{SignKey: other})
	if !errors.Is(err, bundle.ErrPolicy) || strings.Contains(err.Error(), "carries none") {
		t.Fatalf("err = %v, want a refusal of the signature the bundle carries", err)
	}
}

func TestAdmit_PolicyOnEveryImageNeedsEachSigned(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	all := `{"default":[{"type":"sigstoreSigned","keyPath":"` + writeKey(t, pub) + `","signedIdentity":{"type":"matchRepository"}}]}`
	err := check(t, all, bundletest.Options{SignKey: key})
	if !errors.Is(err, bundle.ErrPolicy) || !strings.Contains(err.Error(), bundletest.DefaultImage) {
		t.Fatalf("err = %v, want the unsigned image refused", err)
	}
	if err := check(t, all, bundletest.Options{SignKey: key, SignAll: true}); err != nil {
		t.Fatalf("every image signed: %v", err)
	}
}

func TestAdmit_NoPolicyOrAcceptAnythingPasses(t *testing.T) {
	if err := check(t, "", bundletest.Options{}); err != nil {
		t.Errorf("no policy.json: %v", err)
	}
	if err := check(t, `{"default":[{"type":"insecureAcceptAnything"}]}`, bundletest.Options{}); err != nil {
		t.Errorf("insecureAcceptAnything: %v", err)
	}
}

func TestAdmit_RejectAndBrokenPoliciesSaySo(t *testing.T) {
	err := check(t, `{"default":[{"type":"reject"}]}`, bundletest.Options{})
	if !errors.Is(err, bundle.ErrPolicy) || !strings.Contains(err.Error(), "rejects these images outright") {
		t.Errorf("reject: %v", err)
	}
	err = check(t, `{"default":`, bundletest.Options{})
	if !errors.Is(err, bundle.ErrPolicy) || !strings.Contains(err.Error(), "does not parse") {
		t.Errorf("broken policy: %v", err)
	}
}
