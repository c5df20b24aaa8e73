package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/cvoverify"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// TestSignatures_TheVersionOperatorsVerifierAcceptsFerrysRequest: ferry,
// with only its own rights, writes a release's signatures and
// desiredUpdate; the version operator's verifier (test/cvoverify, its
// code) reads them as the operator does before it downloads a release:
// a signature made as Red Hat makes them, by the key the operator
// trusts, verifies for the release named by tag@digest and by digest
// alone, and also verifies as a node's containers/image checks it. The
// placeholder bytes the tests used to write, a signature by another key,
// and a good signature of another release are refused.
func TestSignatures_TheVersionOperatorsVerifierAcceptsFerrysRequest(t *testing.T) {
	e := kubeenv.Start(t, current)
	c := ferryClient(t, e)
	key := releasesig.Test()
	cvo, err := cvoverify.Trusting(key.PublicArmored(), e.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const repo = "quay.io/openshift-release-dev/ocp-release"
	n := 0
	// release is a release image of its own manifest, named by ref(digest).
	release := func(ref func(d string) string) (string, []byte) {
		n++
		manifest := fmt.Appendf(nil, `{"schemaVersion":2,"n":%d}`, n)
		return ref(digest.FromBytes(manifest).String()), manifest
	}
	// The operator's own code, built from its source, when given
	// (test/cvoverify/upstream): it must say what the copy says.
	upstream := os.Getenv("FERRY_CVO_VERIFY")
	keyFile := filepath.Join(t.TempDir(), "verifier-public-key-redhat")
	if err := os.WriteFile(keyFile, key.PublicArmored(), 0o644); err != nil {
		t.Fatal(err)
	}
	upgrade := func(t *testing.T, rel string, sig []byte) error {
		t.Helper()
		e.ApproveRelease(rel)
		if err := c.StartUpgrade(ctx, cluster.Upgrade{Release: rel, Version: "4.13.7", Signatures: [][]byte{sig}}); err != nil {
			t.Fatalf("ferry's request: %v", err)
		}
		err := cvo.VerifyDesiredUpdate(ctx)
		if upstream != "" {
			out, uerr := exec.Command(upstream, "-kubeconfig", e.AdminKC, "-key", keyFile).CombinedOutput()
			t.Logf("%s: %v %s", upstream, uerr, out)
			if (uerr == nil) != (err == nil) {
				t.Errorf("the operator's own verifier (%v: %s) and its copy (%v) disagree on %s", uerr, out, err, rel)
			}
		}
		return err
	}

	for name, ref := range map[string]func(d string) string{
		"ByTagAndDigest": func(d string) string { return repo + ":4.13.7-x86_64@" + d },
		"ByDigest":       func(d string) string { return repo + "@" + d },
	} {
		t.Run(name, func(t *testing.T) {
			rel, manifest := release(ref)
			sig := key.SignRelease(rel, "4.13.7", "x86_64")
			if err := upgrade(t, rel, sig); err != nil {
				t.Fatalf("the version operator refuses ferry's request for %s: %v", rel, err)
			}
			// What ferry placed, read back, verifies as a node checks it.
			_, d, _ := strings.Cut(rel, "@")
			_, data, ok := e.ConfigMap(kube.SignatureNamespace, strings.ReplaceAll(d, ":", "-"))
			placed := data[strings.ReplaceAll(d, ":", "-")+"-1"]
			if !ok || len(placed) == 0 {
				t.Fatalf("no signature placed for %s: %v", rel, data)
			}
			if got, err := key.Verify(placed, manifest, repo+":4.13.7-x86_64"); err != nil || got != d {
				t.Fatalf("containers/image: the placed signature verifies for %q, %v; want %s", got, err, d)
			}
		})
	}

	other, _ := release(func(d string) string { return repo + "@" + d })
	for name, sig := range map[string]func(rel string) []byte{
		"the placeholder":                func(string) []byte { return releasesig.Placeholder },
		"a signature by another key":     func(rel string) []byte { return releasesig.NewKey().SignRelease(rel, "4.13.7", "x86_64") },
		"a signature of another release": func(string) []byte { return key.SignRelease(other, "4.13.7", "x86_64") },
	} {
		rel, _ := release(func(d string) string { return repo + ":4.13.7-x86_64@" + d })
		err := upgrade(t, rel, sig(rel))
		_, d, _ := strings.Cut(rel, "@")
		if err == nil || !strings.Contains(err.Error(), "The update cannot be verified: unable to verify "+d+" against keyrings: verifier-public-key-redhat") {
			t.Errorf("%s: the version operator's verifier says %v; want it refused", name, err)
		}
	}
}
