package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The stick route (docs/admin.md, "With a MachineConfig and a stick"): the
// MachineConfigs carry a unit, a udev rule, an installer, the config and a
// trust list; the stick carries ferry. These tests read what ships.

// registryLessHeading is the install guide's section for a cluster with no
// registry.
const registryLessHeading = "### With a MachineConfig and a stick"

// guideSection returns the text of docs/admin.md from heading to the next
// heading of the same or a higher level.
func guideSection(t *testing.T, heading string) string {
	t.Helper()
	doc := repoFile(t, "docs/admin.md")
	i := strings.Index(doc, "\n"+heading)
	if i < 0 {
		t.Fatalf("docs/admin.md has no section %q", heading)
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	rest := doc[i+1+len(heading):]
	end := regexp.MustCompile(`(?m)^#{1,` + string(rune('0'+level)) + `} `).FindStringIndex(rest)
	if end != nil {
		rest = rest[:end[0]]
	}
	return heading + rest
}

// TestDocs_RegistryLessInstallHasNoSSH: the guide for a cluster without a
// registry installs ferry with oc apply and a stick, with no SSH step (no
// ssh, no scp), and says which route fits which cluster.
func TestDocs_RegistryLessInstallHasNoSSH(t *testing.T) {
	sec := guideSection(t, registryLessHeading)
	if m := regexp.MustCompile(`(?i)\b(ssh|scp|sftp|rsync)\b`).FindAllString(sec, -1); len(m) > 0 {
		t.Errorf("the registry-less install route uses %q: it must need no SSH at all", m)
	}
	for _, want := range []string{
		"oc apply", "oc patch machineconfiguration", "nodedisruptionpolicy.yaml",
		"99-worker-ferry.yaml", "99-master-ferry.yaml", trustPath, "ferry-x86_64", "sha256sum",
		"/var/usrlocal", "journalctl -u 'ferry-install@*' -u ferry-install-peers",
		// one plug per cluster (issue 42): the others take ferry from a peer
		"**Plug one node**", "from\n   peer 10.0.0.11:8090", "What it costs an idle cluster",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("the registry-less install route never mentions %q", want)
		}
	}
	// Which route for which cluster, before the routes themselves.
	install := guideSection(t, "## Install")
	for _, want := range []string{"RPM", "layering", "a stick", "registry", "RHEL"} {
		if !strings.Contains(install[:strings.Index(install, "\n### ")], want) {
			t.Errorf("the install guide's introduction does not say which route fits which cluster (no %q)", want)
		}
	}
	if got := repoFile(t, "packaging/machineconfig/10-local-binary.conf"); regexp.MustCompile(`\b(scp|ssh)\b`).MatchString(got) {
		t.Errorf("10-local-binary.conf still tells the administrator to copy ferry over SSH")
	}
}

// secretLike are what a credential looks like in a file: a MachineConfig is
// served by the machine config server to anything that asks for Ignition,
// so none may carry one. A key's path (client-key: /…) would mean a
// kubeconfig travels; the peers' installer reading that field of the
// kubelet's own does not.
var secretLike = regexp.MustCompile(`(?i)peer-token|token_file|tokenFile|\btoken:|client-key-data|client-key:\s*[/"']|client-certificate-data|BEGIN [A-Z ]*PRIVATE KEY|password|REPLACE-WITH`)

// TestMachineConfig_CarriesNoSecret: no shipped MachineConfig or Butane
// source holds a token, a key or a placeholder for one, and none names a
// file that would hold one.
func TestMachineConfig_CarriesNoSecret(t *testing.T) {
	for _, role := range roles {
		for _, ext := range []string{".bu", ".yaml"} {
			name := "99-" + role + "-ferry" + ext
			_, cfg := decodeExample(t, name)
			for _, f := range cfg.Storage.Files {
				body := f.Contents.Inline
				if ext == ".yaml" {
					body = string(decodeDataURL(t, f.Contents.Source))
				}
				if m := secretLike.FindString(body); m != "" {
					t.Errorf("%s: %s carries %q: no credential travels in a MachineConfig", name, f.Path, m)
				}
				if regexp.MustCompile(`(?i)token|secret|\.key$|kubeconfig`).MatchString(f.Path) {
					t.Errorf("%s delivers %s: a credential file", name, f.Path)
				}
			}
			for _, u := range cfg.Systemd.Units {
				if m := secretLike.FindString(u.Contents); m != "" {
					t.Errorf("%s: unit %s carries %q", name, u.Name, m)
				}
			}
		}
	}
}

// TestMachineConfig_StaysSmallAndCarriesNoBinary: each MachineConfig is a
// few tens of KiB of text; ferry itself comes on the stick.
func TestMachineConfig_StaysSmallAndCarriesNoBinary(t *testing.T) {
	for _, role := range roles {
		name := "99-" + role + "-ferry.yaml"
		st, err := os.Stat(filepath.Join(root, mcDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > maxMachineConfig {
			t.Errorf("%s is %d bytes, over %d: the MachineConfig must stay small", name, st.Size(), maxMachineConfig)
		}
		t.Logf("%s: %d bytes", name, st.Size())
		_, cfg := decodeExample(t, name)
		for _, f := range cfg.Storage.Files {
			if b := decodeDataURL(t, f.Contents.Source); strings.Contains(string(b), "\x7fELF") || strings.ContainsRune(string(b), 0) {
				t.Errorf("%s delivers %s with binary content", name, f.Path)
			}
			if f.Path == "/usr/local/bin/ferry" || f.Path == "/usr/bin/ferry" {
				t.Errorf("%s delivers the ferry binary %s", name, f.Path)
			}
		}
	}
}

// TestMachineConfig_TrustListIsSHA256SumFormat: every line of the shipped
// trust list is a comment or what sha256sum prints, so that the installer
// and the administrator read it the same way.
func TestMachineConfig_TrustListIsSHA256SumFormat(t *testing.T) {
	line := regexp.MustCompile(`^[0-9a-f]{64} [ *]\S.*$`)
	for i, l := range strings.Split(repoFile(t, mcDir+"/trusted-binaries.sha256"), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if !line.MatchString(l) {
			t.Errorf("trusted-binaries.sha256:%d: %q is not a sha256sum line (64 lowercase hex, two spaces, a name)", i+1, l)
		}
	}
}

// TestInstaller_ShellcheckAndPaths: the installer is POSIX sh that passes
// shellcheck, and the unit, the rule and the drop-in agree on the names
// and paths they hand each other.
func TestInstaller_ShellcheckAndPaths(t *testing.T) {
	script := filepath.Join(root, mcDir, "ferry-install")
	if out, err := runErr(t, "", needTool(t, "shellcheck", "shellcheck"), "-s", "sh", script); err != nil {
		t.Errorf("shellcheck ferry-install: %v\n%s", err, out)
	}
	src := repoFile(t, mcDir+"/ferry-install")
	unit := repoFile(t, mcDir+"/ferry-install@.service")
	rule := repoFile(t, mcDir+"/80-ferry-install.rules")
	dropIn := repoFile(t, mcDir+"/"+dropInName)
	for _, c := range []struct{ what, text, want string }{
		{"the installer", src, "TRUST=" + trustPath + "\n"},
		{"the installer", src, "DEST=$DEST_DIR/ferry\n"},
		{"the installer", src, "DEST_DIR=/usr/local/bin\n"},
		{"the drop-in", dropIn, "ConditionFileIsExecutable=/usr/local/bin/ferry\n"},
		{"the drop-in", dropIn, "ExecStart=/usr/local/bin/ferry agent\n"},
		{"the installer unit", unit, "ExecStart=/bin/sh /etc/ferry/ferry-install %I\n"},
		{"the installer unit", unit, "DeviceAllow=/dev/%I r\n"},
		{"the installer unit", unit, "ReadWritePaths=/usr/local -/var/usrlocal\n"},
		{"the udev rule", rule, `ENV{SYSTEMD_WANTS}+="ferry-install@%k.service"`},
	} {
		if !strings.Contains(c.text, c.want) {
			t.Errorf("%s lacks %q", c.what, c.want)
		}
	}
	var paths []string
	for _, f := range shipped {
		paths = append(paths, f.path)
	}
	for _, p := range []string{"/etc/ferry/ferry-install", "/etc/systemd/system/ferry-install@.service", "/etc/udev/rules.d/80-ferry-install.rules", trustPath} {
		if !strings.Contains(strings.Join(paths, "\n")+"\n", p+"\n") {
			t.Errorf("the MachineConfigs do not ship %s", p)
		}
	}
}

// TestInstaller_UnitVerifies runs systemd-analyze verify on an instance of
// the installer unit, as a node starts it for /dev/sdb1, and on the peers'
// installer and its timer.
func TestInstaller_UnitVerifies(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	r := t.TempDir()
	for _, d := range []string{"usr/bin", "bin", "usr/lib/systemd", "etc/systemd/system", "etc/ferry"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "", "cp", "-a", "/usr/lib/systemd/system", filepath.Join(r, "usr/lib/systemd/"))
	run(t, "", "cp", "/bin/sh", filepath.Join(r, "bin/sh"))
	run(t, "", "cp", filepath.Join(root, mcDir, "ferry-install@.service"), filepath.Join(root, mcDir, "ferry-install-peers.service"),
		filepath.Join(root, mcDir, "ferry-install-peers.timer"), filepath.Join(root, "packaging/ferry.slice"), filepath.Join(r, "etc/systemd/system/"))
	run(t, "", "cp", filepath.Join(root, mcDir, "ferry-install"), filepath.Join(r, "etc/ferry/"))
	out, err := runErr(t, "", analyze, "verify", "--root="+r, "ferry-install@sdb1.service", "ferry-install-peers.service", "ferry-install-peers.timer")
	// The device unit exists only on a node with the stick plugged.
	var problems []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !strings.Contains(l, "dev-sdb1.device") {
			problems = append(problems, l)
		}
	}
	if len(problems) > 0 {
		t.Fatalf("systemd-analyze verify ferry-install@sdb1.service: %v\n%s", err, strings.Join(problems, "\n"))
	}
}
