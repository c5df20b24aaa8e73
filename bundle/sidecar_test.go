package bundle_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
)

const hostSecret = "token-SECRET-MARKER-77"

// A .sha256 that is not one (a host file's first line, a token) is
// refused with an error that names the file and the fix, never its bytes.
func TestParseSHA256Line_NeverEchoesTheFile(t *testing.T) {
	for _, content := range []string{
		hostSecret + "\n",
		"root:" + hostSecret + ":19000:0:99999:7:::\n",
		strings.Repeat("z", 64) + "  upgrade-1.0-x86_64.tar " + hostSecret + "\n",
		strings.Repeat("a", 64) + "  other-" + hostSecret + ".tar\n",
	} {
		_, err := bundle.ParseSHA256Line([]byte(content), "upgrade-1.0-x86_64.tar")
		if !errors.Is(err, bundle.ErrInvalid) {
			t.Fatalf("%q: err = %v, want ErrInvalid", content, err)
		}
		if strings.Contains(err.Error(), hostSecret) || strings.Contains(err.Error(), "root:") {
			t.Errorf("error echoes the file: %v", err)
		}
		if !strings.Contains(err.Error(), "upgrade-1.0-x86_64.tar") || !strings.Contains(err.Error(), "copy the .sha256") {
			t.Errorf("error %q does not name the bundle and the fix", err)
		}
	}
}

func TestReadSidecar_RefusesBigFIFOAndDevice(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.sha256")
	if err := os.WriteFile(big, []byte(strings.Repeat(hostSecret, 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.sha256")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{big, fifo, "/dev/zero"} {
		_, err := bundle.ReadSidecar(p, "the .sha256 file of upgrade-1.0-x86_64.tar")
		if !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), "the .sha256 file of upgrade-1.0-x86_64.tar") {
			t.Errorf("%s: err = %v, want ErrInvalid naming the file", p, err)
		}
		if err != nil && strings.Contains(err.Error(), hostSecret) {
			t.Errorf("%s: error echoes the file: %v", p, err)
		}
	}
	ok := filepath.Join(dir, "ok.sha256")
	os.WriteFile(ok, []byte("x\n"), 0o644)
	if b, err := bundle.ReadSidecar(ok, "x"); err != nil || string(b) != "x\n" {
		t.Errorf("a small sidecar: %q, %v", b, err)
	}
}

// A source the stick refused is refused by every reader, with its reason.
func TestVerify_RefusedSourceIsRefused(t *testing.T) {
	why := errors.New("\"upgrade-1.0-x86_64.sha256\": it is a symbolic link")
	_, err := bundle.Verify(t.Context(), bundle.Source{Path: "/nonexistent/upgrade-1.0-x86_64.tar", Refused: why}, bundle.Options{})
	if !errors.Is(err, why) {
		t.Fatalf("err = %v, want the refusal", err)
	}
}

// A .minisig is kept and offered to the peers whatever the node's policy,
// so one that is no signature (a host file a link led to) is refused on
// every path, with no trusted key and with approval off, never echoed.
func TestSignature_OneThatDoesNotParseIsRefusedWhateverThePolicy(t *testing.T) {
	p, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	if err := os.WriteFile(p+".minisig", []byte("root:"+hostSecret+":19000:0:99999:7:::\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := bundle.FindSource(p, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, pol := range map[string]bundle.Policy{"no trusted key": {SpaceFactor: -1}, "approval off": {Off: true, SpaceFactor: -1}} {
		_, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol})
		if !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), "is not a minisign signature") {
			t.Errorf("%s: Verify: %v, want the .minisig refused", name, err)
		}
		if err != nil && strings.Contains(err.Error(), hostSecret) {
			t.Errorf("%s: error echoes the file: %v", name, err)
		}
	}
	meta, err := bundle.InspectFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.ApproveOffer(bundle.Policy{Off: true}, meta, digest, []byte(hostSecret+"\n")); !errors.Is(err, bundle.ErrNotApproved) || strings.Contains(err.Error(), hostSecret) {
		t.Errorf("an offer with approval off and a signature that does not parse: %v", err)
	}
}
