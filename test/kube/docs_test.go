package kube

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// The docs' commands, run as written (docs/engineer.md, docs/admin.md's
// UpgradeBundle section, docs/technician.md): every shell command of their
// fenced code blocks runs against the real kube-apiserver, a real agent
// with a real CRI-O, and ferry built from this tree, or is in skipped
// with the reason it cannot run here. A command in neither fails the test,
// so a command added to the docs is either run or excused.

// docSections are the parts of the docs whose commands are run, in the
// order a real upgrade goes through them: the engineer's bundle, the
// administrator's approval, the technician's watch.
var docSections = []struct{ file, heading string }{
	{"docs/engineer.md", ""},
	{"docs/admin.md", "### The UpgradeBundle: approve, schedule, follow"},
	{"docs/technician.md", ""},
}

// skipped are the commands that need what a test machine does not have,
// by their text in the docs (after joining continued lines and dropping
// comments), with why.
var skipped = map[string]string{
	`mkfs.exfat -L UPGRADE /dev/sdX1`:                          "formats a USB stick (test/udev and test/vm read real filesystems off sticks)",
	`mount /dev/sdX1 /mnt`:                                     "mounts a USB stick",
	`cp /srv/bundles/upgrade-4.13.7-x86_64.{tar,sha256} /mnt/`: "copies onto the mounted stick",
	`sync; umount /mnt`:                                        "unmounts the stick",
	`genisoimage -iso-level 3 -J -R -V UPGRADE -o upgrade-4.13.7-x86_64.iso /srv/bundles/upgrade-4.13.7-x86_64.tar /srv/bundles/upgrade-4.13.7-x86_64.sha256`: "builds an ISO for a BMC's virtual media (test/e2e reads iso9660 sticks)",
	`dd if=upgrade-4.13.7-x86_64.tar of=/dev/sdX bs=4M conv=fsync status=progress`:                                                                            "writes a raw stick",
	`cp /usr/local/bin/ferry /mnt/ferry-x86_64`: "copies onto the mounted stick",
	`(cd /mnt && sha256sum ferry-x86_64)`:       "reads the mounted stick",
	`systemctl status ferry`:                    "systemd on a node (the agent here runs without it; test/vm runs the unit)",
	`ferry bundle create --release 4.17.20 --release 4.18.10 --arch x86_64 --pull-secret ~/pull-secret.json --output /srv/bundles`: "a path of two releases: test/bundle's TestCreateCLI_PathOfTwoReleasesStoresSharedBlobsOnce makes one from the fixture's releases",
	`ferry bundle create --release 4.22.9 --release 5.0.2 --arch x86_64 --pull-secret ~/pull-secret.json --output /srv/bundles`:    "a path of two releases: test/bundle's TestCreateCLI_PathOfTwoReleasesStoresSharedBlobsOnce makes one from the fixture's releases",
	`ferry bundle inspect /srv/bundles/upgrade-4.18.10-x86_64.tar`:                                                                 "inspects that path's bundle (the same test runs it)",
}

// admTranslations are the `oc adm` commands kubectl has no verb for, as
// the kubectl command that does the same to the API.
var admTranslations = map[string]string{
	`oc adm upgrade --clear`: `kubectl patch clusterversion version --type=merge -p '{"spec":{"desiredUpdate":null}}'`,
}

// saysWhatTheDocsSay is what a command's output must hold where the docs
// say what it prints, by the command's start in the docs.
var saysWhatTheDocsSay = map[string]string{
	// engineer.md: the workstation has no policy; "off" would read as
	// if the nodes took any bundle.
	"ferry bundle verify ": "approval: not checked here",
}

// docCommand is one command of a fenced code block.
type docCommand struct {
	file string
	line int
	text string
}

// docCommands reads the commands of file's section under heading (the
// whole file without one): each line of each fenced block, continued
// lines joined, comments and blank lines dropped.
func docCommands(t *testing.T, file, heading string) []docCommand {
	t.Helper()
	b, err := os.ReadFile(repoFile(file))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := parseCommands(file, string(b), heading)
	if err != nil {
		t.Fatal(err)
	}
	return cmds
}

// parseCommands is docCommands on text, the file named file.
func parseCommands(file, text, heading string) ([]docCommand, error) {
	lines := strings.Split(text, "\n")
	start, end := 0, len(lines)
	if heading != "" {
		start = -1
		level := strings.SplitN(heading, " ", 2)[0] + " "
		for i, l := range lines {
			if start < 0 && l == heading {
				start = i + 1
			} else if start >= 0 && isHeadingAtOrAbove(l, level) {
				end = i
				break
			}
		}
		if start < 0 {
			return nil, fmt.Errorf("%s has no heading %q: update docSections", file, heading)
		}
	}
	var cmds []docCommand
	in, cont := false, ""
	contLine := 0
	for i := start; i < end; i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if !in {
			continue
		}
		s := stripComment(l)
		if strings.HasSuffix(s, `\`) {
			if cont == "" {
				contLine = i + 1
			}
			cont += strings.TrimSpace(strings.TrimSuffix(s, `\`)) + " "
			continue
		}
		n := i + 1
		if cont != "" {
			s, n, cont = cont+strings.TrimSpace(s), contLine, ""
		}
		if s = strings.TrimSpace(s); s != "" {
			cmds = append(cmds, docCommand{file: file, line: n, text: s})
		}
	}
	return cmds, nil
}

// isHeadingAtOrAbove tells whether l is a Markdown heading of level (e.g.
// "### ") or a higher one.
func isHeadingAtOrAbove(l, level string) bool {
	for p := level; len(p) >= 2; p = p[1:] {
		if strings.HasPrefix(l, p) && !strings.HasPrefix(l, "#"+p) {
			return true
		}
	}
	return false
}

// stripComment drops a shell comment: a # after white space, outside
// quotes.
func stripComment(l string) string {
	var q rune
	for i, r := range l {
		switch {
		case q != 0:
			if r == q {
				q = 0
			}
		case r == '\'' || r == '"':
			q = r
		case r == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
			return strings.TrimRight(l[:i], " \t")
		}
	}
	return strings.TrimRight(l, " \t")
}

// docRun is what the commands run against: the names the docs use for
// the fixture's bundle, and where a command runs.
type docRun struct {
	dir, binDir, kubeconfig string
	subst                   []string // old, new pairs, in order
	names                   []string // the same for the bundle, once made
	release                 string   // the bundle's release, once made
	extra                   map[string]string
	log                     *strings.Builder
	// generation is the UpgradeBundle's metadata.generation now, for a
	// wait on the status' observedGeneration ("=3" in the docs: the
	// generation the reader's last patch made).
	generation func() string
	// meanwhile runs every 200 ms while a command runs: the test
	// playing the cluster version operator.
	meanwhile func()
}

// observedGeneration is the docs' wait for a generation read.
var observedGeneration = regexp.MustCompile(`(\{\.status\.observedGeneration\}'=)[0-9]+`)

// command is how text runs here: oc spelled kubectl (or translated when
// it is an `oc adm` command), placeholders filled in, and the fixture
// registry's flags added to `ferry bundle create`.
func (r *docRun) command(text string) (string, error) {
	if tr, ok := admTranslations[text]; ok {
		text = tr
	} else if strings.HasPrefix(text, "oc adm ") {
		return "", fmt.Errorf("no kubectl translation of %q: add it to admTranslations", text)
	}
	if strings.HasPrefix(text, "oc ") {
		text = "kubectl " + strings.TrimPrefix(text, "oc ")
	}
	text = strings.NewReplacer(append(append([]string{}, r.subst...), r.names...)...).Replace(text)
	if r.generation != nil && observedGeneration.MatchString(text) {
		text = observedGeneration.ReplaceAllString(text, "${1}"+r.generation())
	}
	for prefix, flags := range r.extra {
		if strings.HasPrefix(text, prefix) {
			text += " " + flags
		}
	}
	return text, nil
}

// run runs text as a shell command and fails with its output when it
// fails.
func (r *docRun) run(ctx context.Context, text string) (string, error) {
	cmdText, err := r.command(text)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", cmdText)
	cmd.Dir = r.dir
	// Logged in as the administrator, as oc login leaves it: the
	// kubeconfig in $KUBECONFIG and in ~/.kube/config.
	cmd.Env = append(os.Environ(), "PATH="+r.binDir+":/usr/bin:/bin:/usr/sbin:/sbin", "KUBECONFIG="+r.kubeconfig, "HOME="+r.dir)
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("%s: %v", cmdText, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case err = <-done:
			waiting = false
		case <-tick.C:
			if r.meanwhile != nil {
				r.meanwhile()
			}
		}
	}
	out := buf.String()
	fmt.Fprintf(r.log, "$ %s\n%s\n", cmdText, out)
	if err != nil {
		return out, fmt.Errorf("%s: %v\n%s", cmdText, err, out)
	}
	return out, nil
}

// runnable is whether the test runs text itself: oc, kubectl and ferry
// commands are run as a rule; anything else only when it is named here.
func runnable(text string) bool {
	for _, p := range []string{"oc ", "kubectl ", "ferry ", "minisign "} {
		if strings.HasPrefix(text, p) {
			return true
		}
	}
	return false
}

// TestDocs_EveryCommandRunsAsWritten: the commands of docs/engineer.md,
// docs/admin.md's UpgradeBundle section and docs/technician.md, in that
// order, with the engineer's bundle plugged into a real agent (ferry load,
// as a stick) once it is made: each runs and exits 0, or is skipped for a
// stated reason; a command in neither list fails the test, as does a
// skipped command the docs no longer hold.
func TestDocs_EveryCommandRunsAsWritten(t *testing.T) {
	var all []docCommand
	for _, s := range docSections {
		all = append(all, docCommands(t, s.file, s.heading)...)
	}
	seen := map[string]bool{}
	for _, c := range all {
		seen[c.text] = true
		if _, skip := skipped[c.text]; !skip && !runnable(c.text) {
			t.Errorf("%s:%d: %q is neither run (oc, kubectl, ferry, minisign) nor in the skipped table: run it or say why it cannot run", c.file, c.line, c.text)
		}
	}
	for text := range skipped {
		if !seen[text] {
			t.Errorf("skipped %q is in no fenced block of the docs any more: remove it from the table", text)
		}
	}
	if t.Failed() {
		return
	}

	_, err := exec.LookPath("minisign")
	crioenv.Need(t, err == nil, "no minisign: the docs' commands need it (test/setup/install-deps.sh)")
	c := crioenv.Start(t)
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	installBundles(e)
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 3, Seed: 11})
	if want := "quay.io/openshift-release-dev/ocp-release"; !strings.HasPrefix(release, want+"@") {
		t.Fatalf("the fixture's release %s is not the docs' %s", release, want)
	}

	work, bundles := t.TempDir(), t.TempDir()
	binDir := t.TempDir()
	if err := os.Symlink(ferryenv.Binary(t), filepath.Join(binDir, "ferry")); err != nil {
		t.Fatal(err)
	}
	// kubectl stands for oc: the one built beside the API server.
	if err := os.Symlink(e.Kubectl(), filepath.Join(binDir, "kubectl")); err != nil {
		t.Fatal(err)
	}
	// The docs' relative paths are the repository's (packaging/…).
	if err := os.Symlink(repoFile("packaging"), filepath.Join(work, "packaging")); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(work, "pull-secret.json")
	if err := os.WriteFile(secret, []byte(`{"auths":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(e.AdminKC)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(work, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, ".kube", "config"), kc, 0o600); err != nil {
		t.Fatal(err)
	}
	log := &strings.Builder{}
	r := &docRun{dir: work, binDir: binDir, kubeconfig: e.AdminKC, log: log,
		subst: []string{"~/pull-secret.json", secret, "/srv/bundles", bundles},
		// The release comes from the fixture registry, by its quay.io name.
		extra: map[string]string{"ferry bundle create ": "--mirror " + reg.Mirror() + " --cert-dir " + reg.CertsDir}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the commands as run:\n%s", log)
		}
	})
	r.generation = func() string {
		o := e.Bundle(agent.ResourceName("4.13.7", "x86_64"))
		md, _ := o["metadata"].(map[string]any)
		return fmt.Sprint(md["generation"])
	}
	// The cluster version operator: once ferry asks for the bundle's
	// release, the upgrade is done (the nodes' part is ferry's).
	upgraded := false
	r.meanwhile = func() {
		if upgraded || r.release == "" {
			return
		}
		if du := e.DesiredUpdate(); du != nil && du["image"] == r.release {
			e.SetHistory(kubeenv.History{State: "Completed", Image: r.release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
			upgraded = true
		}
	}

	tarPath := filepath.Join(bundles, "upgrade-4.13.7-x86_64.tar")
	var a *ferryenv.Agent
	ran := 0
	ctx := t.Context()
	for _, dc := range all {
		if _, skip := skipped[dc.text]; skip {
			continue
		}
		// Once the bundle is made, the names the docs use for it are
		// the fixture's; the stick goes in before the first command that
		// looks at the cluster.
		if _, err := os.Stat(tarPath); err == nil {
			docNames(t, tarPath, r)
		}
		if a == nil && r.names != nil && (strings.HasPrefix(dc.text, "oc ") || strings.HasPrefix(dc.text, "kubectl ")) {
			a = plugDocsBundle(t, e, c, tarPath)
		}
		ran++
		out, err := r.run(ctx, dc.text)
		if err != nil {
			t.Errorf("%s:%d: %q fails: %v", dc.file, dc.line, dc.text, err)
		}
		for prefix, want := range saysWhatTheDocsSay {
			if strings.HasPrefix(dc.text, prefix) && !strings.Contains(out, want) {
				t.Errorf("%s:%d: %q does not say %q:\n%s", dc.file, dc.line, dc.text, want, out)
			}
		}
	}
	t.Logf("%d commands of the docs run, %d skipped", ran, len(all)-ran)
	if a == nil {
		t.Fatalf("no command made %s: the engineer's ferry bundle create did not run", tarPath)
	}

	// The harness fails a failing command: the check above can fail.
	if _, err := r.run(ctx, "oc get upgradebundle no-such-bundle"); err == nil {
		t.Error("a command that fails (a bundle that does not exist) passed")
	}
}

// docNames sets the names the docs use for the bundle in r: the
// resource, the digest and the release.
func docNames(t *testing.T, tarPath string, r *docRun) {
	t.Helper()
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	dg := sidecarDigest(t, tarPath)
	_, relHex, _ := strings.Cut(meta.Release, "@sha256:")
	r.release = meta.Release
	r.names = append(r.names[:0],
		// A file named alone is the engineer's, in /srv/bundles.
		" upgrade-4.16.3-x86_64.sha256", " "+strings.TrimSuffix(tarPath, ".tar")+".sha256",
		"4.16.3-x86-64", agent.ResourceName(meta.Version, meta.Arch),
		"sha256:3f5a…", dg, "sha256:…", dg,
		"<release hex>", relHex, "<hex>", relHex)
}

// plugDocsBundle starts node-a's agent (approval required, a real CRI-O,
// its own credential), gives it the bundle as a stick would, and waits
// until the node's entry is in the bundle's UpgradeBundle (which
// engineer.md's ferry approve made: a node creates none).
func plugDocsBundle(t *testing.T, e *kubeenv.Env, c *crioenv.CRIO, tarPath string) *ferryenv.Agent {
	t.Helper()
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	name := agent.ResourceName(meta.Version, meta.Arch)
	a := nodeAgent(t, e, tarPath, func(cfg *agent.Config) {
		c.Configure(cfg)
		cfg.Approval = "required"
	})
	waitUntil(t, "node-a's entry in the UpgradeBundle "+name, func() bool {
		_, ok := e.BundleNodes(name)["node-a"]
		return ok
	})
	return a
}

// TestDocs_CommandsAreReadAsTheShellReadsThem: continued lines are one
// command, a comment after the command goes, a # inside quotes stays,
// text outside fences and outside the section is not read.
func TestDocs_CommandsAreReadAsTheShellReadsThem(t *testing.T) {
	md := "# Guide\n\n```\nnot this\n```\n\n## Section\n\nprose `oc get x`\n\n```\n" +
		"ferry bundle create \\\n  --release r \\\n  --output o\n" +
		"\n" +
		"oc get nodes -L ferry.io/phase      # each node's phase\n" +
		"oc patch cm x -p '{\"data\":{\"a\":\"#b\"}}'\n" +
		"```\n\n### Deeper\n\n```\nalso this\n```\n\n## Next\n\n```\nnot this either\n```\n"
	cmds, err := parseCommands("guide.md", md, "## Section")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cmds {
		got = append(got, fmt.Sprintf("%d:%s", c.line, c.text))
	}
	want := []string{
		"12:ferry bundle create --release r --output o",
		"16:oc get nodes -L ferry.io/phase",
		`17:oc patch cm x -p '{"data":{"a":"#b"}}'`,
		"23:also this",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("read\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := parseCommands("guide.md", md, "## Missing"); err == nil {
		t.Error("a section that is not there was read")
	}
}
