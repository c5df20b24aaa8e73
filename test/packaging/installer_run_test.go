package packaging

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// installerRun is one run of ferry-install for /dev/sdz1 (or --peers), as
// its unit starts it, in a mount namespace of its own where /etc, /usr/local and
// /dev are the test's: the stick is a directory, mount and systemctl are
// stand-ins that write what they were asked to a log.
type installerRun struct {
	stick     map[string]string // the stick's files: name → content
	etcFerry  map[string]string // /etc/ferry's files
	installed string            // /usr/local/bin/ferry, "" for none
	oldKernel bool              // mount refuses nosymfollow, as before Linux 5.10
	peers     bool              // ferry-install --peers, as ferry-install-peers.service runs it
}

type installerResult struct {
	rc        int
	journal   string // what the installer printed
	log       string // what mount and systemctl were asked
	installed string // /usr/local/bin/ferry afterwards, "" for none
	leftovers string // what else /usr/local/bin holds
}

// fakeFerry is a ferry build that says it is version v.
func fakeFerry(v string) string {
	return fmt.Sprintf("#!/bin/sh\n[ \"$1\" = version ] && echo 'ferry %s (go1.26.8 linux/amd64)'\n", v)
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func (r installerRun) run(t *testing.T) installerResult {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("running ferry-install needs root (a mount namespace, mknod)")
		}
		t.Skip("running ferry-install needs root (a mount namespace, mknod)")
	}
	unshare := needTool(t, "unshare", "util-linux")
	dir := t.TempDir()
	for sub, files := range map[string]map[string]string{"stick": r.stick, "etc-ferry": r.etcFerry} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, sub, name), []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if r.installed != "" {
		if err := os.WriteFile(filepath.Join(dir, "installed"), []byte(r.installed), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mountBin, err := exec.LookPath("mount")
	if err != nil {
		t.Fatal(err)
	}
	refuse := ""
	if r.oldKernel {
		refuse = `case $2 in *nosymfollow*) echo "mount: bad option" >&2; exit 32 ;; esac`
	}
	stubs := map[string]string{
		"mount":     fmt.Sprintf("#!/bin/sh\necho \"mount $*\" >>%[1]s/log\n%[2]s\nfor a; do mnt=$a; done\nexec %[3]s --bind %[1]s/stick \"$mnt\"\n", dir, refuse, mountBin),
		"systemctl": fmt.Sprintf("#!/bin/sh\necho \"systemctl $*\" >>%s/log\n", dir),
	}
	if err := os.MkdirAll(filepath.Join(dir, "stubs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range stubs {
		if err := os.WriteFile(filepath.Join(dir, "stubs", name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	arg := "sdz1"
	if r.peers {
		arg = "--peers"
	}
	harness := fmt.Sprintf(`set -eu
d=%[1]s
cp /etc/ld.so.cache "$d/" 2>/dev/null || true
%[2]s -t tmpfs tmpfs /etc
cp "$d/ld.so.cache" /etc/ 2>/dev/null || true
mkdir /etc/ferry
cp -a "$d/etc-ferry/." /etc/ferry/
%[2]s -t tmpfs tmpfs /usr/local
mkdir -p /usr/local/bin
[ ! -f "$d/installed" ] || cp "$d/installed" /usr/local/bin/ferry
%[2]s -t tmpfs tmpfs /dev
mknod -m 666 /dev/null c 1 3
mknod -m 600 /dev/sdz1 b 7 250
mkdir "$d/run"
rc=0
PATH="$d/stubs:$PATH" RUNTIME_DIRECTORY="$d/run" sh %[3]s %[4]s >"$d/journal" 2>&1 || rc=$?
echo $rc >"$d/rc"
[ ! -f /usr/local/bin/ferry ] || cp /usr/local/bin/ferry "$d/after"
ls -A /usr/local/bin | grep -vx ferry >"$d/leftovers" || true
`, dir, mountBin, filepath.Join(root, mcDir, "ferry-install"), arg)
	cmd := exec.CommandContext(t.Context(), unshare, "--mount", "--propagation", "private", "sh", "-c", harness)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the harness: %v\n%s", err, out)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return string(b)
	}
	var res installerResult
	fmt.Sscan(read("rc"), &res.rc)
	res.journal, res.log, res.installed, res.leftovers = read("journal"), read("log"), read("after"), read("leftovers")
	return res
}

// TestInstaller_VersionFloorAndNoDowngrade runs the installer: a listed
// build is installed from a stick mounted nosymfollow (without it, said,
// on a kernel that lacks it); a listed build below the node's minimum
// version, or older than the installed one, is refused with nothing
// written, unless a downgrade is allowed (never below the minimum).
func TestInstaller_VersionFloorAndNoDowngrade(t *testing.T) {
	v140, v150, v1100 := fakeFerry("v1.4.0"), fakeFerry("v1.5.0"), fakeFerry("v1.10.0")
	dev := fakeFerry("3f9c2ab")
	trust := func(builds ...string) string {
		var b strings.Builder
		b.WriteString("# trusted builds\n")
		for _, f := range builds {
			b.WriteString(sha(f) + "  ferry-x86_64\n")
		}
		return b.String()
	}
	all := trust(v140, v150, v1100, dev)
	stick := func(f string) map[string]string { return map[string]string{"ferry-x86_64": f} }
	for _, tt := range []struct {
		name    string
		run     installerRun
		want    string // installed afterwards
		journal string
	}{
		{"newer listed build", installerRun{stick: stick(v1100), etcFerry: map[string]string{"trusted-binaries.sha256": all}, installed: v150},
			v1100, "installed ferry (sha256 " + sha(v1100) + ")"},
		{"first install", installerRun{stick: stick(v140), etcFerry: map[string]string{"trusted-binaries.sha256": all}},
			v140, "installed ferry"},
		{"unlisted build", installerRun{stick: stick(v1100), etcFerry: map[string]string{"trusted-binaries.sha256": trust(v140)}, installed: v140},
			v140, "is not in /etc/ferry/trusted-binaries.sha256"},
		{"older listed build", installerRun{stick: stick(v140), etcFerry: map[string]string{"trusted-binaries.sha256": all}, installed: v150},
			v150, "version 1.4.0 is older than the installed 1.5.0"},
		{"older listed build, downgrade allowed", installerRun{stick: stick(v140),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "allow-downgrade = yes"}, installed: v150},
			v140, "installed ferry"},
		{"below the minimum", installerRun{stick: stick(v140),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "# no older\nminimum-version = 1.5.0\n"}},
			"", "version 1.4.0 is below this node's minimum-version 1.5.0"},
		{"below the minimum, downgrade allowed", installerRun{stick: stick(v140),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "minimum-version=v1.5.0\nallow-downgrade = yes\n"}, installed: v1100},
			v1100, "below this node's minimum-version 1.5.0"},
		{"at the minimum", installerRun{stick: stick(v150),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "minimum-version = 1.5.0\n"}, installed: v140},
			v150, "installed ferry"},
		{"10 is above 5", installerRun{stick: stick(v1100),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "minimum-version = 1.5.0\n"}},
			v1100, "installed ferry"},
		{"no version, a minimum set", installerRun{stick: stick(dev),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "minimum-version = 1.5.0\n"}},
			"", "reports no version to compare with this node's minimum-version 1.5.0"},
		{"no version over a versioned build", installerRun{stick: stick(dev), etcFerry: map[string]string{"trusted-binaries.sha256": all}, installed: v140},
			v140, "it reports no version, so it may be older than the installed 1.4.0"},
		{"a minimum that is no version", installerRun{stick: stick(v150),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "minimum-version = latest\n"}},
			"", "minimum-version 'latest' is not a version"},
		{"a policy line it does not know", installerRun{stick: stick(v150),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": "allow-downgrade = true\n"}, installed: v140},
			v140, "is not 'minimum-version = VERSION' nor 'allow-downgrade = yes|no'"},
		{"the shipped policy", installerRun{stick: stick(v140),
			etcFerry: map[string]string{"trusted-binaries.sha256": all, "install-policy": repoFile(t, mcDir+"/install-policy")}, installed: v150},
			v150, "version 1.4.0 is older than the installed 1.5.0"},
		{"a kernel without nosymfollow", installerRun{stick: stick(v150), etcFerry: map[string]string{"trusted-binaries.sha256": all}, oldKernel: true},
			v150, "mounted without nosymfollow"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := tt.run.run(t)
			t.Logf("journal:\n%s", res.journal)
			if !strings.Contains(res.journal, tt.journal) {
				t.Errorf("journal lacks %q", tt.journal)
			}
			if res.installed != tt.want {
				t.Errorf("installed afterwards: %q, want %q", res.installed, tt.want)
			}
			if res.leftovers != "" {
				t.Errorf("/usr/local/bin holds %q besides ferry", res.leftovers)
			}
			changed := tt.want != tt.run.installed
			if (res.rc == 0) != changed {
				t.Errorf("exit %d, installed changed: %v", res.rc, changed)
			}
			if restarted := strings.Contains(res.log, "restart ferry.service"); restarted != changed {
				t.Errorf("ferry.service restarted: %v, want %v\n%s", restarted, changed, res.log)
			}
			if strings.Contains(res.log, "mount ") && !strings.HasPrefix(res.log, "mount -o ro,nodev,nosuid,noexec,nosymfollow ") {
				t.Errorf("the stick was not first mounted nosymfollow:\n%s", res.log)
			}
		})
	}
}
