package imagepolicy

import (
	"crypto/ecdsa"
	"errors"
	"os"
	"path/filepath"
	"slices"
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
	_, err := admit(t, policy, o)
	return err
}

// admit is check with what the policy narrowed.
func admit(t *testing.T, policy string, o bundletest.Options) (bundle.Admission, error) {
	t.Helper()
	dir := t.TempDir()
	tarPath, _ := bundletest.Write(t, dir, o)
	c := Checker{Path: filepath.Join(dir, "policy.json")}
	if policy != "" {
		if err := os.WriteFile(c.Path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := bundle.Verify(t.Context(), bundle.Source{Path: tarPath, SHA256Path: strings.TrimSuffix(tarPath, ".tar") + ".sha256"},
		bundle.Options{Admit: c.Admit})
	if err != nil {
		return bundle.Admission{}, err
	}
	return res.Admission, nil
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

// appPolicy requires a sigstore signature by keyPath for quay.io/team/app,
// with signedIdentity identity (a JSON object, or "" to leave it out:
// containers/image's default, matchRepoDigestOrExact).
func appPolicy(keyPath, identity string) string {
	id := ""
	if identity != "" {
		id = `,"signedIdentity":` + identity
	}
	return `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  "quay.io/team/app":[{"type":"sigstoreSigned","keyPath":"` + keyPath + `"` + id + `}]}}}`
}

const (
	appImage        = "quay.io/team/app:1.0"
	matchDigestOrEx = `{"type":"matchRepoDigestOrExact"}`
)

// signedApp is a bundle holding appImage, every image signed by key for
// the identity named by the image's reference.
func signedApp(key *ecdsa.PrivateKey, identity func(ref string) string) bundletest.Options {
	return bundletest.Options{Images: []string{appImage}, SignKey: key, SignAll: true, SignIdentity: identity}
}

// appRef is appImage's reference in a bundletest bundle.
var appRef = bundletest.Ref(appImage, 0)

func TestAdmit_MatchRepoDigestOrExactRefusesARepositoryOnlySignatureByDigestToo(t *testing.T) {
	// containers/image never accepts an identity that names the
	// repository only (cosign's default) under matchRepoDigestOrExact,
	// not even for a pull by digest: CRI-O would refuse every pull of
	// the image, so the bundle is refused, saying why and what to do.
	key, pub := imagetree.NewSigningKey()
	keyPath := writeKey(t, pub)
	for _, id := range []string{matchDigestOrEx, ""} {
		_, err := admit(t, appPolicy(keyPath, id), signedApp(key, nil))
		if !errors.Is(err, bundle.ErrPolicy) || !bundle.IsRefusal(err) {
			t.Fatalf("signedIdentity %q: err = %v, want a policy refusal", id, err)
		}
		for _, want := range []string{"quay.io/team/app@sha256:", "a sigstore signature by the key in " + keyPath,
			`its signature names the repository only ("quay.io/team/app")`, "signedIdentity matchRepoDigestOrExact never accepts",
			`give quay.io/team/app signedIdentity {"type":"matchRepository"}`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("signedIdentity %q: refusal %q lacks %q", id, err, want)
			}
		}
	}
}

func TestAdmit_SignatureForTheDigestOrAnotherTagLoadsTheImageByDigestOnly(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	keyPath := writeKey(t, pub)
	name, _, digest := bundle.SplitRef(appRef)
	for _, tc := range []struct {
		identity, names string
		rules           []string
	}{
		// matchExact admits a pull by digest only for a signature naming
		// that digest; matchRepoDigestOrExact for any of the repository.
		{name + "@" + digest, `"quay.io/team/app@` + digest + `"`, []string{matchDigestOrEx, `{"type":"matchExact"}`, ""}},
		{name + ":2.0", `"quay.io/team/app:2.0"`, []string{matchDigestOrEx, ""}},
	} {
		for _, id := range tc.rules {
			adm, err := admit(t, appPolicy(keyPath, id), signedApp(key, func(ref string) string {
				if ref == appRef {
					return tc.identity
				}
				return ""
			}))
			if err != nil {
				t.Fatalf("signed for %s, signedIdentity %q: %v, want the image admitted by digest", tc.identity, id, err)
			}
			if !slices.Equal(adm.DigestOnly, []string{appRef}) || len(adm.Warnings) != 1 {
				t.Fatalf("signed for %s, signedIdentity %q: admission %+v, want %s by digest only", tc.identity, id, adm, appRef)
			}
			rule := "matchRepoDigestOrExact"
			if strings.Contains(id, "matchExact") {
				rule = "matchExact"
			}
			for _, want := range []string{appImage + " is loaded by digest only", "its signature names " + tc.names + ", not this tag",
				"this node's policy (signedIdentity " + rule, "accepts it by digest only, so the tag 1.0 is not loaded"} {
				if !strings.Contains(adm.Warnings[0], want) {
					t.Errorf("warning %q lacks %q", adm.Warnings[0], want)
				}
			}
		}
	}
}

func TestAdmit_SignatureForTheExactTagAdmitsDigestAndTag(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	keyPath := writeKey(t, pub)
	for _, id := range []string{matchDigestOrEx, ""} {
		adm, err := admit(t, appPolicy(keyPath, id), signedApp(key, func(ref string) string {
			if name, _, ok := strings.Cut(ref, "@"); ok && ref == appRef {
				return name // quay.io/team/app:1.0
			}
			return ""
		}))
		if err != nil || len(adm.DigestOnly) != 0 || len(adm.Warnings) != 0 {
			t.Fatalf("signedIdentity %q: %v, admission %+v; want both references admitted", id, err, adm)
		}
	}
	// matchRepository admits a repository-only signature for both.
	adm, err := admit(t, appPolicy(keyPath, `{"type":"matchRepository"}`), signedApp(key, nil))
	if err != nil || len(adm.DigestOnly) != 0 {
		t.Fatalf("matchRepository: %v, admission %+v; want both references admitted", err, adm)
	}
}

func TestAdmit_UnsignedTaggedImageIsRefusedUnderMatchRepoDigestOrExact(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	keyPath := writeKey(t, pub)
	// Only the release is signed: the app image carries no signature.
	_, err := admit(t, appPolicy(keyPath, matchDigestOrEx), bundletest.Options{Images: []string{appImage}, SignKey: key})
	if !errors.Is(err, bundle.ErrPolicy) || !bundle.IsRefusal(err) {
		t.Fatalf("err = %v, want a policy refusal", err)
	}
	for _, want := range []string{"quay.io/team/app@sha256:", "a sigstore signature by the key in " + keyPath, "the bundle carries none"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
}

func TestAdmit_TagRefusedForMoreThanItsIdentityStillRefusesTheBundle(t *testing.T) {
	// The digest passes, but the policy rejects the tag outright: not an
	// identity the relaxed rule would accept, so the bundle is refused.
	key, pub := imagetree.NewSigningKey()
	keyPath := writeKey(t, pub)
	name, _, digest := bundle.SplitRef(appRef)
	policy := `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  "quay.io/team/app:1.0":[{"type":"reject"}],
  "quay.io/team/app":[{"type":"sigstoreSigned","keyPath":"` + keyPath + `"}]}}}`
	_, err := admit(t, policy, signedApp(key, func(ref string) string {
		if ref == appRef {
			return name + "@" + digest
		}
		return ""
	}))
	if !errors.Is(err, bundle.ErrPolicy) || !strings.Contains(err.Error(), appImage+": this node requires nothing: the policy rejects") {
		t.Fatalf("err = %v, want the tag refused", err)
	}
}

// A manifest list: CRI-O (containers/image's copy) checks the policy on
// the instance it picks for the node's platform, never on the list. So a
// list signed only at the list level is refused at plug time, and one
// whose instance alone is signed is admitted.
func TestAdmit_AManifestListIsJudgedByTheInstanceCRIOPulls(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	policy := `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  "` + bundletest.DefaultImage + `":[{"type":"sigstoreSigned","keyPath":"` + writeKey(t, pub) + `","signedIdentity":{"type":"matchRepository"}}]}}}`
	listOnly := bundletest.Options{Listed: true, SignKey: key, SignAll: true}
	if err := check(t, policy, listOnly); !errors.Is(err, bundle.ErrPolicy) {
		t.Errorf("a list signed only at the list level: %v, want a policy refusal", err)
	}
	instanceOnly := bundletest.Options{Listed: true, SignKey: key, SignAll: true, SignInstances: true}
	if err := check(t, policy, instanceOnly); err != nil {
		t.Errorf("a list whose instance is signed: %v, want it admitted", err)
	}
}
