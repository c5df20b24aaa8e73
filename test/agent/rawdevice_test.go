package agenttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/udevenv"
)

// TestCLI_RawDeviceVerifiesAndExtractsWithTheSameDigest: the bundle dd'd
// onto a block device (a loop device here) reads as the same bundle, the
// device's bytes after the end-of-archive marker ignored.
func TestCLI_RawDeviceVerifiesAndExtractsWithTheSameDigest(t *testing.T) {
	udevenv.Require(t)
	tarPath, digest := mediumBundle(t)
	loop := udevenv.Attach(t, udevenv.RawImage(t, udevenv.File{Name: "raw", Path: tarPath}))
	ferry := ferryenv.Binary(t)

	out, err := exec.Command(ferry, "bundle", "inspect", loop.Dev).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "upgrade-4.13.7-x86_64") {
		t.Fatalf("inspect %s: %v\n%s", loop.Dev, err, out)
	}
	out, err = exec.Command(ferry, "bundle", "verify", loop.Dev, "--quiet").CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "approve") {
		t.Fatalf("a raw device with no approved digest: exit %d\n%s", code, out)
	}
	out, err = exec.Command(ferry, "bundle", "verify", loop.Dev, "--quiet", "--approved-digest", string(digest)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), string(digest)) {
		t.Fatalf("verify %s: %v\n%s", loop.Dev, err, out)
	}
	dest := filepath.Join(t.TempDir(), "x")
	out, err = exec.Command(ferry, "bundle", "extract", loop.Dev, "--quiet", "--approved-digest", string(digest), "--dest", dest).CombinedOutput()
	if err != nil || !strings.Contains(string(out), string(digest)) {
		t.Fatalf("extract %s: %v\n%s", loop.Dev, err, out)
	}
	if _, err := os.Stat(filepath.Join(dest, "metadata.json")); err != nil {
		t.Fatal(err)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := err.(*exec.ExitError); ok {
		return e.ExitCode()
	}
	return -1
}
