package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestRPM_VersionFromGitDescribe checks how scripts/rpm.sh turns a git
// version into an RPM Version and Release (no dashes, sorting right).
func TestRPM_VersionFromGitDescribe(t *testing.T) {
	for _, tc := range []struct{ describe, version, release string }{
		{"v1.2.3", "1.2.3", "1"},
		{"v1.2.3-4-gabc1234", "1.2.3", "1.4.gabc1234"},
		{"v1.2.3-dirty", "1.2.3", "1.dirty"},
		{"v1.2.3-rc1", "1.2.3~rc1", "1"},
		{"v1.2.3-rc.2-5-gdeadbee-dirty", "1.2.3~rc2", "1.5.gdeadbee.dirty"},
		{"abc1234", "0.0.0", "0.42.gabc1234"},
		{"abc1234-dirty", "0.0.0", "0.42.gabc1234.dirty"},
		{"release-x", "release.x", "1"},
	} {
		t.Run(tc.describe, func(t *testing.T) {
			out := run(t, root, "bash", "scripts/rpm.sh", "--rpm-version", tc.describe, "42")
			got := strings.Fields(out)
			if len(got) != 2 || got[0] != tc.version || got[1] != tc.release {
				t.Fatalf("got %q, want %q %q", out, tc.version, tc.release)
			}
			if strings.Contains(out, "-") {
				t.Fatalf("%q has a dash", out)
			}
		})
	}
}

// TestRPM_ContentsScriptsAndConfig builds the RPM with scripts/rpm.sh (what
// make rpm runs) and checks its files, scriptlets, config files, and that
// the binary and unit inside are the ones built from this tree.
func TestRPM_ContentsScriptsAndConfig(t *testing.T) {
	needTool(t, "rpmbuild", "rpm")
	needTool(t, "rpm2cpio", "rpm2cpio")
	needTool(t, "cpio", "cpio")
	out := t.TempDir()
	rpmPath := strings.TrimSpace(run(t, root, "bash", "scripts/rpm.sh", "-o", out))
	if !strings.HasPrefix(filepath.Base(rpmPath), "ferry-") || !strings.HasSuffix(rpmPath, ".rpm") {
		t.Fatalf("scripts/rpm.sh printed %q, want the path of ferry-*.rpm", rpmPath)
	}

	files := strings.Fields(run(t, "", "rpm", "-qlp", rpmPath))
	for _, f := range []string{
		"/usr/bin/ferry",
		"/usr/lib/systemd/system/ferry.service",
		"/usr/lib/systemd/system/ferry.slice",
		"/usr/lib/systemd/system-preset/80-ferry.preset",
		"/etc/ferry/config.toml",
		"/usr/share/bash-completion/completions/ferry",
		"/usr/share/zsh/site-functions/_ferry",
		"/usr/share/fish/vendor_completions.d/ferry.fish",
		"/usr/share/doc/ferry/technician.md",
		"/usr/share/doc/ferry/admin.md",
	} {
		if !slices.Contains(files, f) {
			t.Errorf("rpm -qlp: %s missing from %v", f, files)
		}
	}

	config := strings.Fields(run(t, "", "rpm", "-qp", "--configfiles", rpmPath))
	if !slices.Equal(config, []string{"/etc/ferry/config.toml"}) {
		t.Errorf("rpm -qp --configfiles: %v, want only /etc/ferry/config.toml", config)
	}
	// %config(noreplace): an edited config survives an upgrade.
	flags := run(t, "", "rpm", "-qp", "--qf", `[%{FILENAMES} %{FILEFLAGS:fflags}\n]`, rpmPath)
	if !strings.Contains(flags, "/etc/ferry/config.toml cn") {
		t.Errorf("config.toml is not %%config(noreplace):\n%s", flags)
	}

	scripts := run(t, "", "rpm", "-qp", "--scripts", rpmPath)
	for _, want := range []string{
		"postinstall scriptlet",
		"systemctl --no-reload preset ferry.service",
		"preuninstall scriptlet",
		"systemctl --no-reload disable --now ferry.service",
		"postuninstall scriptlet",
		"systemctl try-restart ferry.service",
	} {
		if !strings.Contains(scripts, want) {
			t.Errorf("rpm -qp --scripts lacks %q:\n%s", want, scripts)
		}
	}

	// Unpack and compare with the tree.
	x := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "sh", "-c", `rpm2cpio "$1" | cpio -idm --quiet`, "sh", rpmPath)
	cmd.Dir = x
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rpm2cpio | cpio: %v\n%s", err, b)
	}
	for inRPM, inTree := range map[string]string{
		"usr/lib/systemd/system/ferry.service": "packaging/ferry.service",
		"usr/lib/systemd/system/ferry.slice":   "packaging/ferry.slice",
		"etc/ferry/config.toml":                "packaging/config.toml",
		"usr/share/doc/ferry/admin.md":         "docs/admin.md",
	} {
		b, err := os.ReadFile(filepath.Join(x, inRPM))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != repoFile(t, inTree) {
			t.Errorf("%s in the RPM differs from %s", inRPM, inTree)
		}
	}
	preset, err := os.ReadFile(filepath.Join(x, "usr/lib/systemd/system-preset/80-ferry.preset"))
	if err != nil || !strings.Contains(string(preset), "\nenable ferry.service\n") {
		t.Errorf("preset does not enable ferry.service: %v\n%s", err, preset)
	}
	// The binary says the git version it was built from; the RPM's
	// version is that one, sanitized. (Compared with each other, not with
	// HEAD now: others may commit while this runs.)
	ver := strings.Fields(run(t, "", filepath.Join(x, "usr/bin/ferry"), "version"))
	if len(ver) < 2 || ver[0] != "ferry" {
		t.Fatalf("packaged ferry version says %q", ver)
	}
	describe := ver[1]
	hash := regexp.MustCompile(`(?:^|-g)([0-9a-f]{7,40})(?:-dirty)?$`).FindStringSubmatch(describe)
	if hash == nil {
		t.Fatalf("packaged ferry version %q is not a git describe output", describe)
	}
	run(t, root, "git", "cat-file", "-e", hash[1]+"^{commit}")
	count := strings.TrimSpace(run(t, root, "git", "rev-list", "--count", hash[1]))
	want := strings.Join(strings.Fields(run(t, root, "bash", "scripts/rpm.sh", "--rpm-version", describe, count)), "-")
	if info := run(t, "", "rpm", "-qp", "--qf", "%{VERSION}-%{RELEASE}", rpmPath); info != want {
		t.Errorf("RPM version %s, want %s (from the binary's git version %s)", info, want, describe)
	}
}
