package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/internal/dataurl"
)

// TestSingleNode_InstallsFerryFromAStick (issue 33, item 1): a node that
// has only what ferry's shipped MachineConfig delivers (laid out as the
// machine config daemon lays it out: no ferry binary) gets ferry from a
// stick. On one boot:
//
//  1. a stick whose ferry the node does not trust: refused, with the
//     digest and the trust list in the journal; nothing installed, ferry
//     never started, nothing loaded;
//  2. a stick with a trusted ferry and a bundle: ferry installed as
//     /usr/local/bin/ferry, running as ferry.service, the bundle loaded and
//     every image pinned in CRI-O;
//  3. the same stick again: nothing changes, ferry is not restarted;
//  4. the first stick again, its (newer) build now in the trust list as
//     `oc apply` delivers it: the binary is replaced and the unit runs the
//     new one, which still holds the bundle loaded;
//  5. the same build on an ISO in a USB CD-ROM drive (BMC virtual media):
//     the installer sees it, and nothing changes.
func TestSingleNode_InstallsFerryFromAStick(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mc := readMachineConfig(t, filepath.Join(root, "packaging/machineconfig/99-worker-ferry.yaml"))

	n, size := bundleImages()
	b := makeBundle(t, ctx, e, "4.13.11", n, size)
	dir := t.TempDir()
	// The trusted build is the one under test; the newer one differs only
	// in its version string, as a later release of ferry would.
	oldFerry := filepath.Join(dir, "old", "ferry-x86_64")
	newFerry := filepath.Join(dir, "new", "ferry-x86_64")
	if err := os.MkdirAll(filepath.Dir(oldFerry), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(e.bins.Ferry, oldFerry, 0o755); err != nil {
		t.Fatal(err)
	}
	buildFerryVersion(t, ctx, newFerry, "v9999.0.0-vm-newer-build")
	oldSum, err := hashFile(oldFerry)
	if err != nil {
		t.Fatal(err)
	}
	newSum, err := hashFile(newFerry)
	if err != nil {
		t.Fatal(err)
	}
	if oldSum == newSum {
		t.Fatal("the two ferry builds are the same bytes")
	}
	oldStick, newStick := filepath.Join(dir, "stick-old.img"), filepath.Join(dir, "stick-new.img")
	if err := MakeVFATStick(ctx, oldStick, b.Tar, b.SHA, oldFerry); err != nil {
		t.Fatal(err)
	}
	if err := MakeVFATStick(ctx, newStick, b.Tar, b.SHA, newFerry); err != nil {
		t.Fatal(err)
	}

	v := e.boot(t, ctx, "node1", Node{Name: "node1", NoFerry: true}, 2, nil)
	e.waitReady(t, ctx, v)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the guest's view:\n%s", sh(t, context.Background(), v,
				"ls -la /usr/local/bin; systemctl status 'ferry-install@*' ferry --no-pager -l -n 0; journalctl -u 'ferry-install@*' -u ferry --no-pager -n 80 -o short-monotonic || true"))
		}
	})
	if r := try(t, ctx, v, "test -e /usr/bin/ferry || test -e /usr/local/bin/ferry || test -e /etc/systemd/system/ferry.service"); r.Code == 0 {
		t.Fatal("the guest has ferry before the MachineConfig and the stick: the test would prove nothing")
	}

	// What the MCD does with the MachineConfig and the node disruption
	// policy: write each file and unit, reload systemd and udev, restart
	// ferry (skipped: no binary yet).
	layOutMachineConfig(t, ctx, v, mc)
	// The shipped config names the kubelet's kubeconfig and [peer]
	// identity, which this guest (no API server) has no use for: this
	// node's own config replaces it, as the administrator's edit would.
	if err := v.WriteFile(ctx, "/etc/ferry/config.toml", []byte(nodeConfig("node1", []string{b.Digest}, "", nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	writeTrust(t, ctx, v, mc, oldSum)
	sh(t, ctx, v, "systemctl daemon-reload && udevadm control --reload && systemctl restart ferry.service")
	if got := unitProps(t, ctx, v, "ferry.service", "ActiveState", "ConditionResult"); got != "inactive no" {
		t.Fatalf("before any stick ferry.service is %q, want skipped (inactive, condition false)", got)
	}

	// 1. untrusted: refused, nothing written, nothing run
	since := guestNow(t, ctx, v)
	if err := v.PlugUSB(ctx, "new", newStick, true); err != nil {
		t.Fatal(err)
	}
	msg := waitInstaller(t, ctx, v, since, "refused|installed|nothing to")
	t.Logf("untrusted stick: %s", msg)
	if !strings.Contains(msg, "refused") || !strings.Contains(msg, newSum) || !strings.Contains(msg, trustList) {
		t.Errorf("the refusal does not say it refused, which digest it saw (%s) and where the trust list is:\n%s", newSum, msg)
	}
	if got := sh(t, ctx, v, "ls -A /usr/local/bin"); strings.Contains(got, "ferry\n") || strings.Contains(got, ".ferry-install") {
		t.Errorf("after the untrusted stick /usr/local/bin holds %q: nothing may be written", got)
	}
	if got := unitProps(t, ctx, v, "ferry.service", "ActiveState", "ExecMainStartTimestampMonotonic"); got != "inactive 0" {
		t.Errorf("after the untrusted stick ferry.service is %q: nothing may run", got)
	}
	if r := try(t, ctx, v, "pgrep -x ferry || ls /etc/crio/crio.conf.d/pin-upgrade.conf"); r.Code == 0 {
		t.Errorf("after the untrusted stick something ran or loaded: %s", r.Stdout)
	}
	if got := sh(t, ctx, v, "journalctl -u 'ferry-install@*' -p err -o cat --no-pager"); !strings.Contains(got, "refused") {
		t.Errorf("the refusal is not logged at priority err (journalctl -p err shows %q)", got)
	}
	if got := strings.TrimSpace(try(t, ctx, v, "systemctl is-failed 'ferry-install@*'").Stdout); !strings.Contains(got, "failed") {
		t.Errorf("the refusing installer unit is %q: systemctl --failed should show the refusal", got)
	}
	unplugAndWait(t, ctx, v, "new")

	// 2. trusted: installed, run as the unit, the bundle loaded and pinned
	since = guestNow(t, ctx, v)
	plugged := time.Now()
	if err := v.PlugUSB(ctx, "old", oldStick, true); err != nil {
		t.Fatal(err)
	}
	msg = waitInstaller(t, ctx, v, since, "installed|refused")
	installed := time.Since(plugged)
	// ferry, just installed, reads the same stick's bundle itself.
	waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool { return s.loadedWith(b.Digest) },
		func(s ferryStatus) bool { return s.Phase == "rejected" || s.Phase == "failed" || s.Phase == "conflict" })
	t.Logf("trusted stick: %s; plugged -> installed %.1fs, -> bundle loaded %.1fs", msg, installed.Seconds(), time.Since(plugged).Seconds())
	if !strings.Contains(msg, "installed ferry (sha256 "+oldSum+")") {
		t.Errorf("the installer did not say it installed %s:\n%s", oldSum, msg)
	}
	pid1 := requireRunning(t, ctx, v, oldSum)
	requireAllPinned(t, ctx, v, b.Refs)
	if got := sh(t, ctx, v, "stat -c '%a %U' /usr/local/bin/ferry; ls -A /usr/local/bin | grep -c '^.ferry-install' || true"); got != "755 root\n0\n" {
		t.Errorf("/usr/local/bin/ferry mode, owner and temporary files: %q, want 755 root and none left", got)
	}
	unplugAndWait(t, ctx, v, "old")

	// 3. the same build again: nothing changes
	since = guestNow(t, ctx, v)
	if err := v.PlugUSB(ctx, "old2", oldStick, true); err != nil {
		t.Fatal(err)
	}
	msg = waitInstaller(t, ctx, v, since, "installed|refused|nothing to do")
	t.Logf("the same stick again: %s", msg)
	if !strings.Contains(msg, "already installed") {
		t.Errorf("the same build again: %s, want \"already installed\"", msg)
	}
	if pid := requireRunning(t, ctx, v, oldSum); pid != pid1 {
		t.Errorf("the same build again restarted ferry (pid %s, was %s)", pid, pid1)
	}
	unplugAndWait(t, ctx, v, "old2")

	// 4. the newer build, now trusted (oc apply of the extended list): replaced
	writeTrust(t, ctx, v, mc, oldSum, newSum)
	since = guestNow(t, ctx, v)
	if err := v.PlugUSB(ctx, "new2", newStick, true); err != nil {
		t.Fatal(err)
	}
	msg = waitInstaller(t, ctx, v, since, "installed|refused")
	t.Logf("newer trusted stick: %s", msg)
	if !strings.Contains(msg, "installed ferry (sha256 "+newSum+")") {
		t.Errorf("the installer did not install the newer build %s:\n%s", newSum, msg)
	}
	var pid2 string
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := try(t, ctx, v, "systemctl is-active ferry && sha256sum /proc/$(systemctl show -p MainPID --value ferry)/exe")
		if r.Code == 0 && strings.HasPrefix(strings.Split(r.Stdout, "\n")[1], newSum) {
			pid2 = requireRunning(t, ctx, v, newSum)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ferry.service does not run the newer build 3 minutes after it was installed: %s", r.Stdout)
		}
		time.Sleep(time.Second)
	}
	if pid2 == pid1 {
		t.Errorf("ferry was not restarted on the newer build (pid %s)", pid2)
	}
	if got := sh(t, ctx, v, "ferry version"); !strings.Contains(got, "vm-newer-build") {
		t.Errorf("ferry version after the replacement: %q, want vm-newer-build", got)
	}
	st := waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool { return s.loadedWith(b.Digest) }, nil)
	t.Logf("the newer ferry resumed: %s", st)
	requireAllPinned(t, ctx, v, b.Refs)

	// 5. BMC virtual media (a USB CD-ROM, /dev/sr0) reaches the installer
	// too: the same build, so nothing changes.
	iso := filepath.Join(dir, "virtual-media.iso")
	if err := MakeISO(ctx, iso, newFerry); err != nil {
		t.Fatal(err)
	}
	since = guestNow(t, ctx, v)
	if err := v.PlugCDROM(ctx, "cd", iso); err != nil {
		t.Fatal(err)
	}
	msg = waitInstaller(t, ctx, v, since, "installed|refused|nothing to")
	t.Logf("virtual media: %s", msg)
	if !strings.Contains(msg, "ferry-install@sr") || !strings.Contains(msg, "already installed") {
		t.Errorf("virtual media with the installed build: %s, want ferry-install@srN saying \"already installed\"", msg)
	}
	if pid := requireRunning(t, ctx, v, newSum); pid != pid2 {
		t.Errorf("virtual media with the same build restarted ferry (pid %s, was %s)", pid, pid2)
	}
}

// buildFerryVersion builds ./cmd/ferry as out, saying it is version: a
// newer build says so, and the installer refuses one that reports no
// version over one that does (install-policy, allow-downgrade).
func buildFerryVersion(t *testing.T, ctx context.Context, out, version string) {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-X main.version="+version, "-o", out, "./cmd/ferry")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ferry %s: %v\n%s", version, err, b)
	}
	t.Logf("ferry %s built in %.1fs", version, time.Since(start).Seconds())
}

// writeTrust writes the shipped trust list plus the builds sums, as an
// oc apply of the edited MachineConfig delivers it.
func writeTrust(t *testing.T, ctx context.Context, v *VM, mc *shippedMC, sums ...string) {
	t.Helper()
	body := mc.file(t, trustList)
	for i, s := range sums {
		body += fmt.Sprintf("%s  ferry-x86_64 build %d\n", s, i+1)
	}
	if err := v.WriteFile(ctx, trustList, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// trustList is the trust anchor ferry's MachineConfig ships.
const trustList = "/etc/ferry/trusted-binaries.sha256"

// shippedMC is what a node gets from a MachineConfig: Ignition's files and
// units.
type shippedMC struct {
	Spec struct {
		Config struct {
			Storage struct {
				Files []struct {
					Path     string `yaml:"path"`
					Mode     int    `yaml:"mode"`
					Contents struct {
						Source string `yaml:"source"`
					} `yaml:"contents"`
				} `yaml:"files"`
			} `yaml:"storage"`
			Systemd struct {
				Units []struct {
					Name     string `yaml:"name"`
					Enabled  bool   `yaml:"enabled"`
					Contents string `yaml:"contents"`
					DropIns  []struct {
						Name     string `yaml:"name"`
						Contents string `yaml:"contents"`
					} `yaml:"dropins"`
				} `yaml:"units"`
			} `yaml:"systemd"`
		} `yaml:"config"`
	} `yaml:"spec"`
}

func readMachineConfig(t *testing.T, p string) *shippedMC {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var mc shippedMC
	if err := yaml.Unmarshal(data, &mc); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if len(mc.Spec.Config.Storage.Files) == 0 || len(mc.Spec.Config.Systemd.Units) == 0 {
		t.Fatalf("%s delivers no files or no units", p)
	}
	return &mc
}

// file is the content the MachineConfig delivers at p.
func (mc *shippedMC) file(t *testing.T, p string) string {
	t.Helper()
	for _, f := range mc.Spec.Config.Storage.Files {
		if f.Path == p {
			return string(dataURLBytes(t, f.Contents.Source))
		}
	}
	t.Fatalf("the MachineConfig delivers no %s", p)
	return ""
}

func dataURLBytes(t *testing.T, u string) []byte {
	t.Helper()
	b, err := dataurl.Decode(u)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// layOutMachineConfig writes the MachineConfig's files and units into the
// guest as the machine config daemon does: each file at its path with its
// mode, each unit and drop-in under /etc/systemd/system, the enabled ones
// enabled.
func layOutMachineConfig(t *testing.T, ctx context.Context, v *VM, mc *shippedMC) {
	t.Helper()
	for _, f := range mc.Spec.Config.Storage.Files {
		if err := v.WriteFile(ctx, f.Path, dataURLBytes(t, f.Contents.Source), os.FileMode(f.Mode)); err != nil {
			t.Fatal(err)
		}
	}
	var enable []string
	for _, u := range mc.Spec.Config.Systemd.Units {
		if err := v.WriteFile(ctx, path.Join("/etc/systemd/system", u.Name), []byte(u.Contents), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, d := range u.DropIns {
			if err := v.WriteFile(ctx, path.Join("/etc/systemd/system", u.Name+".d", d.Name), []byte(d.Contents), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if u.Enabled {
			enable = append(enable, u.Name)
		}
	}
	sh(t, ctx, v, "systemctl daemon-reload && systemctl enable "+strings.Join(enable, " "))
}

// unitProps is the values of a unit's properties, space-separated, in
// the order asked (systemctl show prints them in its own).
func unitProps(t *testing.T, ctx context.Context, v *VM, unit string, props ...string) string {
	t.Helper()
	var vals []string
	for _, p := range props {
		vals = append(vals, strings.TrimSpace(sh(t, ctx, v, "systemctl show --value -p "+p+" "+unit)))
	}
	return strings.Join(vals, " ")
}

// guestNow is the guest's clock, for journalctl --since.
func guestNow(t *testing.T, ctx context.Context, v *VM) string {
	t.Helper()
	return strings.TrimSpace(sh(t, ctx, v, "date +%s"))
}

// waitInstaller waits for the installer's journal line matching pattern
// since the guest time since, and returns the installer's lines.
func waitInstaller(t *testing.T, ctx context.Context, v *VM, since, pattern string) string {
	t.Helper()
	if _, err := regexp.Compile(pattern); err != nil {
		t.Fatal(err)
	}
	r := try(t, ctx, v, fmt.Sprintf(`for i in $(seq 900); do
		out=$(journalctl -u 'ferry-install@*' --since @%s -o cat --no-pager)
		printf '%%s\n' "$out" | grep -Eq %q && { printf '%%s\n' "$out"; exit 0; }
		sleep 0.2; done; printf '%%s\n' "$out"; exit 1`, since, pattern))
	if r.Code != 0 {
		t.Fatalf("the installer wrote no line matching %q in 3 minutes:\n%s", pattern, r.Stdout)
	}
	return strings.TrimSpace(r.Stdout)
}

// requireRunning checks that ferry.service is active and runs the build
// whose sha256 is sum, and that it is the installed one; it returns the
// main PID.
func requireRunning(t *testing.T, ctx context.Context, v *VM, sum string) string {
	t.Helper()
	out := sh(t, ctx, v, `pid=$(systemctl show -p MainPID --value ferry)
		echo "$(systemctl is-active ferry) $pid"
		sha256sum /proc/$pid/exe /usr/local/bin/ferry | cut -d' ' -f1`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("ferry.service: %q", out)
	}
	state, pid, _ := strings.Cut(lines[0], " ")
	if state != "active" || lines[1] != sum || lines[2] != sum {
		t.Fatalf("ferry.service is %s (pid %s) running sha256 %s, /usr/local/bin/ferry is %s; want active running %s", state, pid, lines[1], lines[2], sum)
	}
	return pid
}

// unplugAndWait pulls a stick and waits until the guest has no USB disk.
func unplugAndWait(t *testing.T, ctx context.Context, v *VM, id string) {
	t.Helper()
	if err := v.UnplugUSB(ctx, id); err != nil {
		t.Fatal(err)
	}
	sh(t, ctx, v, "for i in $(seq 300); do ls /dev/disk/by-id/usb-* >/dev/null 2>&1 || exit 0; sleep 0.1; done; echo a USB disk is still there; exit 1")
}
