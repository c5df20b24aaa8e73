package bundle_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// ferry runs the ferry binary and returns its exit code and stderr.
func ferry(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), ferryBin, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatal(err)
	return -1, ""
}

func noBundle(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "upgrade-") {
			t.Fatalf("left %s in %s", e.Name(), dir)
		}
	}
}

func TestCreateCLI_ExitCodesAndMessages(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no release", nil, 2, "--release, or --version and --arch, is required"},
		{"bad mirror", []string{"--release", release, "--mirror", "quay.io"}, 2, "PREFIX=LOCATION"},
		{"unknown arch", []string{"--release", release, "--arch", "riscv64"}, 2, "riscv64"},
		{"missing pull secret", []string{"--release", release, "--pull-secret", "/nonexistent"}, 2, "--pull-secret"},
		{"unreachable registry", []string{"--release", release, "--mirror", "quay.io/=127.0.0.1:1/"}, 1, "cannot reach registry 127.0.0.1:1"},
		{"untrusted registry", []string{"--release", release, "--mirror", reg.Mirror()}, 1, "--cert-dir"},
		{"bad reference", []string{"--release", "quay.io/x/Y::1", "--mirror", reg.Mirror()}, 1, "bad image reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			code, stderr := ferry(t, dir, append([]string{"bundle", "create", "--quiet", "--output", dir}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.says) {
				t.Fatalf("exit %d (want %d), stderr:\n%s\nwant it to say %q", code, tc.code, stderr, tc.says)
			}
			noBundle(t, dir)
		})
	}
}

// TestCreateCLI_FullDisk gives bundle create an output filesystem too
// small for the bundle: a clear "disk full" refusal, no tar.
func TestCreateCLI_FullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		msg := "mounting a small tmpfs needs root: " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 8, ImageSize: 512 << 10})
	code, stderr := ferry(t, dir, "bundle", "create", "--quiet", "--release", release, "--mirror", reg.Mirror(),
		"--cert-dir", reg.CertsDir, "--output", filepath.Join(dir, "out"))
	if code != 1 || !strings.Contains(stderr, "disk full") || !strings.Contains(stderr, "free space") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	t.Log(stderr)
	noBundle(t, filepath.Join(dir, "out"))
}

func TestCreateCLI_ReleaseSignaturesGoIntoTheBundleAndInspectCountsThem(t *testing.T) {
	dir := t.TempDir()
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	sigs := append(releasesig.Signatures(release, "4.13.7"), releasesig.NewKey().SignRelease(release, "4.13.7", "x86_64"))
	for i, s := range sigs {
		if err := os.WriteFile(filepath.Join(dir, "signature-"+string(rune('1'+i))), s, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out")
	code, stderr := ferry(t, dir, "bundle", "create", "--quiet", "--release", release, "--mirror", reg.Mirror(),
		"--cert-dir", reg.CertsDir, "--output", out, "--signature-store", "",
		"--release-signature", filepath.Join(dir, "signature-1"), "--release-signature", filepath.Join(dir, "signature-2"))
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	cmd := exec.Command(ferryBin, "bundle", "inspect", filepath.Join(out, "upgrade-4.13.7-x86_64.tar"))
	b, err := cmd.Output()
	if err != nil || !strings.Contains(string(b), "release signatures: 2") {
		t.Fatalf("inspect: %v\n%s", err, b)
	}

	// Without any: made, and said loudly, at creation and at inspection.
	out2 := filepath.Join(dir, "out2")
	code, stderr = ferry(t, dir, "bundle", "create", "--quiet", "--release", release, "--mirror", reg.Mirror(),
		"--cert-dir", reg.CertsDir, "--output", out2, "--signature-store", "")
	if code != 0 || !strings.Contains(stderr, "NO release signature") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	b, _ = exec.Command(ferryBin, "bundle", "inspect", filepath.Join(out2, "upgrade-4.13.7-x86_64.tar")).Output()
	if !strings.Contains(string(b), "release signatures: none") {
		t.Fatalf("inspect:\n%s", b)
	}
}

// bundle create --version --arch without --release does what the seed's
// `oc adm upgrade create bundle` does: the release image of that version
// and arch, resolved (here through --mirror) and recorded by digest.
func TestCreateCLI_VersionAndArchNameTheRelease(t *testing.T) {
	dir := t.TempDir()
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 2})
	out := filepath.Join(dir, "out")
	code, stderr := ferry(t, dir, "bundle", "create", "--quiet", "--version", "4.13.7", "--arch", "x86_64",
		"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", out, "--signature-store", "")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	m, err := bundle.InspectFile(filepath.Join(out, "upgrade-4.13.7-x86_64.tar"))
	if err != nil {
		t.Fatal(err)
	}
	digest := release[strings.Index(release, "@"):]
	if !strings.HasPrefix(m.Release, bundle.ReleaseRepo) || !strings.HasSuffix(m.Release, digest) {
		t.Fatalf("release %s, want %s…%s", m.Release, bundle.ReleaseRepo, digest)
	}
}

// A --version the release image's own metadata contradicts: refused by
// the command, naming both, with nothing written.
func TestCreateCLI_AVersionTheReleaseContradictsIsRefused(t *testing.T) {
	dir := t.TempDir()
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 2})
	out := filepath.Join(dir, "out")
	code, stderr := ferry(t, dir, "bundle", "create", "--quiet", "--release", release, "--version", "4.13.8",
		"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", out, "--signature-store", "")
	if code == 0 || !strings.Contains(stderr, "--version 4.13.8, but release "+release+" says it is 4.13.7") {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("written: %v", ents)
	}
}
