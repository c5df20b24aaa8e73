// Package bundle_test checks ferry bundle create end to end against real
// outside tools: GNU tar, sha256sum, minisign, Debian's docker-registry
// (distribution 2.8) and skopeo. Outside CI a missing tool skips the test;
// with CI=true it fails.
package bundle_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
)

var ferryBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ferry-bundle-test-")
	if err != nil {
		panic(err)
	}
	ferryBin = filepath.Join(dir, "ferry")
	out, err := exec.Command("go", "build", "-o", ferryBin, "github.com/ferry-edge/ferry/cmd/ferry").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build ferry: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// need fails (CI=true) or skips when a tool is missing.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			msg := fmt.Sprintf("%s is not installed (run test/setup/install-deps.sh)", tool)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// TestCreate_RoundTripThroughOutsideTools is issue 2's first "must show":
// a release of 24 payload images plus two extra images (one by tag, one by
// digest), fetched from a TLS registry through --mirror, bundled by the
// ferry binary, then checked with GNU tar, sha256sum and minisign, extracted
// with GNU tar and served by Debian's docker-registry, from which skopeo
// fetches every image by digest with its source digest, and the tag.
func TestCreate_RoundTripThroughOutsideTools(t *testing.T) {
	need(t, "docker-registry", "skopeo", "minisign", "tar", "sha256sum")
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 24, ImageSize: 8 << 10})
	byDigest := reg.PushImage(t, "my-company/agent", "")
	tagged := reg.PushImage(t, "my-company/app", "v1")

	work := t.TempDir()
	run(t, work, "minisign", "-G", "-W", "-p", "key.pub", "-s", "key.sec")
	out := filepath.Join(work, "out")
	stdout := run(t, work, ferryBin, "bundle", "create",
		"--release", release,
		"--extra-image", "quay.io/my-company/app:v1",
		"--extra-image", byDigest,
		"--mirror", reg.Mirror(),
		"--cert-dir", reg.CertsDir,
		"--output", out,
		"--sign-key", filepath.Join(work, "key.sec"),
		"--quiet")
	tarPath := filepath.Join(out, "upgrade-4.13.7-x86_64.tar")
	if strings.TrimSpace(stdout) != tarPath {
		t.Fatalf("ferry printed %q, want %s", stdout, tarPath)
	}

	// Outside checks of the files.
	names := strings.Split(strings.TrimSpace(run(t, out, "tar", "-tf", tarPath)), "\n")
	if names[0] != "metadata.json" {
		t.Fatalf("GNU tar lists %q first", names[0])
	}
	run(t, out, "sha256sum", "-c", "upgrade-4.13.7-x86_64.sha256")
	run(t, out, "minisign", "-Vm", tarPath, "-p", filepath.Join(work, "key.pub"))

	tree := filepath.Join(work, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, tree, "tar", "-xf", tarPath)
	mb, err := os.ReadFile(filepath.Join(tree, "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := bundle.ParseMetadata(mb)
	if err != nil {
		t.Fatal(err)
	}
	if m.Release != release || len(m.Images) != 26 {
		t.Fatalf("metadata: release %s, %d images", m.Release, len(m.Images))
	}
	want := append([]string{release}, payload...)
	want = append(want, "quay.io/my-company/app:v1@"+strings.SplitN(tagged, "@", 2)[1], byDigest)
	for i, ref := range m.AllImages() {
		if ref != want[i] {
			t.Fatalf("image %d is %s, want %s", i, ref, want[i])
		}
	}

	// Served as is by distribution 2.8.
	addr, _ := fixture.ServeDistribution(t, tree, true)
	paths := bundle.RepoPaths(m.AllImages())
	copies := t.TempDir()
	for i, ref := range m.AllImages() {
		n, _, d := bundle.SplitRef(ref)
		src := "docker://" + addr + "/" + paths[n] + "@" + d
		raw := run(t, "", "skopeo", "inspect", "--raw", "--tls-verify=false", src)
		if got := sha([]byte(raw)); got != d {
			t.Fatalf("%s: served manifest has digest %s", src, got)
		}
		dst := filepath.Join(copies, fmt.Sprint(i))
		run(t, "", "skopeo", "copy", "--quiet", "--preserve-digests", "--src-tls-verify=false", src, "dir:"+dst)
		mf, err := os.ReadFile(filepath.Join(dst, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha(mf); got != d {
			t.Fatalf("%s: copied manifest has digest %s", src, got)
		}
	}
	raw := run(t, "", "skopeo", "inspect", "--raw", "--tls-verify=false", "docker://"+addr+"/my-company/app:v1")
	if got, want := sha([]byte(raw)), strings.SplitN(tagged, "@", 2)[1]; got != want {
		t.Fatalf("tag my-company/app:v1 resolves to %s, want %s", got, want)
	}
}

// TestCreate_FerryVerifiesItsOwnBundle checks the bundle against ferry's
// own reader: bundle extract with the signing key as the only trust.
func TestCreate_FerryVerifiesItsOwnBundle(t *testing.T) {
	need(t, "minisign")
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 5})
	work := t.TempDir()
	run(t, work, "minisign", "-G", "-W", "-p", "key.pub", "-s", "key.sec")
	run(t, work, ferryBin, "bundle", "create", "--release", release, "--mirror", reg.Mirror(),
		"--cert-dir", reg.CertsDir, "--output", "out", "--sign-key", "key.sec", "--quiet")
	run(t, work, ferryBin, "bundle", "extract", "out/upgrade-4.13.7-x86_64.tar", "--dest", "x", "--trusted-key", "key.pub", "--quiet")
	f, err := os.Open(filepath.Join(work, "x", "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if line, _ := bufio.NewReader(f).ReadString('\n'); !strings.HasPrefix(line, "{") {
		t.Fatalf("extracted metadata.json starts %q", line)
	}
}
