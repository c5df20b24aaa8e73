package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
)

// A bundle made by other tools (seed-shaped): no sizeBytes, no size, no
// created in its metadata.json.
const seedShaped = `{
  "version": "4.13.7",
  "arch": "x86_64",
  "release": "quay.io/openshift-release-dev/ocp-release@sha256:abababababababababababababababababababababababababababababababab",
  "images": ["quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"]
}`

// seedTar writes a tar of metadata.json alone and returns its path and
// length.
func seedTar(t *testing.T, metadata string) (string, int) {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	if err := tw.WriteHeader(&tar.Header{Name: bundle.MetadataName, Mode: 0o644, Size: int64(len(metadata))}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, metadata)
	tw.Close()
	path := filepath.Join(t.TempDir(), "upgrade-4.13.7-x86_64.tar")
	if err := os.WriteFile(path, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, tb.Len()
}

func TestBundleInspect_ASeedShapedBundleSaysUnknownAndGivesTheTarsLength(t *testing.T) {
	path, size := seedTar(t, seedShaped)
	var b bytes.Buffer
	if err := runBundleInspect(&b, path, outText); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"size:     unknown (metadata.json gives none; the tar is " + strconv.Itoa(size) + " bytes)",
		"created:  unknown (metadata.json gives none)",
		"shape:    " + bundle.ShapeSeed,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"0 bytes", "0001-01-01"} {
		if strings.Contains(out, bad) {
			t.Errorf("output says %q:\n%s", bad, out)
		}
	}
}

func TestBundleInspect_SizesAndTimesThatAreGivenAreShown(t *testing.T) {
	m, err := bundle.ParseMetadata([]byte(strings.Replace(seedShaped, "{", `{"formatVersion": 1, "size": "1 KiB", "sizeBytes": 1024, "created": "2026-11-22T08:00:00Z",`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	out := inspectText(m, 4096)
	if !strings.Contains(out, "size:     1 KiB (1024 bytes)\n") || !strings.Contains(out, "created:  2026-11-22T08:00:00Z\n") {
		t.Errorf("output:\n%s", out)
	}
	// A raw device: the tar's length is not known without reading it.
	m.SizeBytes = 0
	if out := inspectText(m, -1); !strings.Contains(out, "size:     unknown (metadata.json gives none)\n") {
		t.Errorf("on a device:\n%s", out)
	}
}

func TestBundleInspect_SaysWhichSigstoreSignaturesItCarries(t *testing.T) {
	m, err := bundle.ParseMetadata([]byte(seedShaped))
	if err != nil {
		t.Fatal(err)
	}
	if out := inspectText(m, 4096); !strings.Contains(out, "sigstore signatures: none (OpenShift 4.21+ nodes require one for the release") {
		t.Errorf("no signatures:\n%s", out)
	}
	name, _, d := bundle.SplitRef(m.Release)
	sig := name + ":" + bundle.SignatureTag(d) + "@sha256:" + strings.Repeat("ef", 32)
	m.Signatures = []string{sig}
	out := inspectText(m, 4096)
	if !strings.Contains(out, "sigstore signatures: 1 (the release's included)") || !strings.Contains(out, "  "+sig+"\n") {
		t.Errorf("the release's signature:\n%s", out)
	}
}

func TestBundleInspect_Golden(t *testing.T) {
	path, _ := seedTar(t, seedShaped)
	for _, tc := range []struct{ format, file string }{
		{outText, "inspect.txt"}, {outJSON, "inspect.json"}, {outYAML, "inspect.yaml"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := runBundleInspect(&b, path, tc.format); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
}

func TestBundleVerify_PrintsTheCommandThatApprovesTheRelease(t *testing.T) {
	release := "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("ab", 32)
	out := releaseApprovalText(release)
	want := `oc -n openshift-ferry patch configmap ferry-admission --type merge -p '{"data":{"sha256-` + strings.Repeat("ab", 32) + `":"approved"}}'`
	if !strings.Contains(out, release) || !strings.Contains(out, "\n  "+want+"\n") {
		t.Errorf("output:\n%s\nwant the release and %s", out, want)
	}
	if out := releaseApprovalText("quay.io/x:4.13.7"); out != "" {
		t.Errorf("a release by tag: %q", out)
	}
}

func TestBundleCreate_ReleasesByVersionOrImage(t *testing.T) {
	got, err := releaseImages(&createOptions{releases: []string{"4.17.20", "quay.io/x/y@sha256:" + strings.Repeat("ab", 32)}, arch: "x86_64"})
	if err != nil || len(got) != 2 || got[0] != bundle.ReleaseImage("4.17.20", "x86_64") || !strings.HasPrefix(got[1], "quay.io/x/y@") {
		t.Errorf("releaseImages = %v, %v", got, err)
	}
	if _, err := releaseImages(&createOptions{releases: []string{"4.17.20"}}); err == nil || !strings.Contains(err.Error(), "give --arch") {
		t.Errorf("a version without --arch: %v", err)
	}
	if _, err := releaseImages(&createOptions{releases: []string{"4.17.20", "4.18.3"}, arch: "x86_64", version: "4.18.3"}); err == nil || !strings.Contains(err.Error(), "drop --version") {
		t.Errorf("--version with a path: %v", err)
	}
}
