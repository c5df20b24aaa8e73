package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
)

// unitFile is a parsed systemd unit: section -> key -> values in order.
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, text string) unitFile {
	t.Helper()
	u := unitFile{}
	section := ""
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("unit line %d: %q is not key=value in a section", n+1, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// words are the space-separated values of a key, over all its lines.
func (u unitFile) words(section, key string) []string {
	var w []string
	for _, v := range u[section][key] {
		w = append(w, strings.Fields(v)...)
	}
	return w
}

func (u unitFile) last(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// TestUnit_VerifyPasses runs `systemd-analyze verify` on the unit as
// shipped, in a scratch root holding the host's units, mkdir and a stand-in
// /usr/bin/ferry, and fails on any warning.
func TestUnit_VerifyPasses(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	r := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/lib/systemd", "etc/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "", "cp", "-a", "/usr/lib/systemd/system", filepath.Join(r, "usr/lib/systemd/"))
	run(t, "", "cp", "/usr/bin/mkdir", filepath.Join(r, "usr/bin/mkdir"))
	if err := os.WriteFile(filepath.Join(r, "usr/bin/ferry"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "", "cp", filepath.Join(root, "packaging/ferry.service"), filepath.Join(root, "packaging/ferry.slice"), filepath.Join(r, "etc/systemd/system/"))

	out, err := runErr(t, "", analyze, "verify", "--root="+r, "ferry.service", "ferry.slice")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify packaging/ferry.service: %v\n%s", err, out)
	}
}

// TestUnit_GrantsWhatTheAgentUses checks the unit against the agent's
// default paths and needs, so a new default path or a lost grant shows.
func TestUnit_GrantsWhatTheAgentUses(t *testing.T) {
	u := parseUnit(t, repoFile(t, "packaging/ferry.service"))
	def := agent.DefaultConfig()
	s := "Service"

	for key, want := range map[string]string{
		"Type":                     "notify",
		"ExecStart":                "/usr/bin/ferry agent",
		"Restart":                  "on-failure",
		"RestartPreventExitStatus": "2", // the agent's exit status for a bad config
		"ProtectSystem":            "strict",
		"RuntimeDirectoryMode":     "0700",
		"User":                     "root",
	} {
		if got := u.last(s, key); got != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
	if w, err := strconv.Atoi(strings.TrimSuffix(u.last(s, "WatchdogSec"), "s")); err != nil || w < 10 {
		t.Errorf("WatchdogSec=%q: want seconds >= 10 (the agent pings at half)", u.last(s, "WatchdogSec"))
	}
	for _, key := range []string{"MemoryMax", "TasksMax"} {
		if v := u.last(s, key); v == "" || v == "infinity" {
			t.Errorf("%s=%q: a runaway ferry must not take the node's memory or tasks (etcd runs there)", key, v)
		}
	}
	if v := u.last(s, "PrivateDevices"); v == "yes" || v == "true" {
		t.Errorf("PrivateDevices=%s hides the sticks from ferry", v)
	}
	if v := u.last(s, "ProcSubset"); v == "pid" {
		t.Errorf("ProcSubset=pid hides /proc/swaps, which media.Media reads to refuse a swap device")
	}

	// Directories systemd makes for ferry: /var/lib/<StateDirectory>, /run/<RuntimeDirectory>.
	state := u.words(s, "StateDirectory")
	for _, p := range []string{def.Paths.StateDir, def.Paths.ExtractDir} {
		if !strings.HasPrefix(p, "/var/lib/") || !slices.Contains(state, strings.TrimPrefix(p, "/var/lib/")) {
			t.Errorf("default path %s is not a StateDirectory (%v)", p, state)
		}
	}
	rt := u.words(s, "RuntimeDirectory")
	for _, p := range []string{def.Paths.Socket, def.Paths.MountDir} {
		if !slices.ContainsFunc(rt, func(d string) bool { return strings.HasPrefix(p, "/run/"+d+"/") }) {
			t.Errorf("default path %s is not under a RuntimeDirectory (%v)", p, rt)
		}
	}
	// Drop-in directories: created before the sandbox is set up, and
	// writable together with their parent on one mount, because
	// crio.writeIfChanged stages each file in the parent and renames it
	// in (a rename across two ReadWritePaths bind mounts fails, EXDEV).
	rw := u.words(s, "ReadWritePaths")
	mountOf := func(p string) string { // the ReadWritePaths entry p is on
		best := ""
		for _, m := range rw {
			m = strings.TrimPrefix(m, "-")
			if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
				best = m
			}
		}
		return best
	}
	pre := strings.Join(u[s]["ExecStartPre"], " ")
	for _, p := range []string{def.Paths.CRIOConfDir, def.Paths.RegistriesConfDir, def.Paths.CertsDir} {
		in, parent := mountOf(p), mountOf(filepath.Dir(p))
		if in == "" || parent == "" {
			t.Errorf("%s or its parent is not writable (ReadWritePaths %v)", p, rw)
		} else if in != parent {
			t.Errorf("%s is on ReadWritePaths mount %s but its parent on %s: the staged rename would fail", p, in, parent)
		}
		if !strings.Contains(pre, " "+p) {
			t.Errorf("ExecStartPre does not create %s (%q)", p, pre)
		}
	}

	for key, need := range map[string][]string{
		"RestrictAddressFamilies": {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"},
		"SystemCallFilter":        {"@system-service", "@mount"},
		"CapabilityBoundingSet":   {"CAP_SYS_ADMIN"},
		"DeviceAllow":             {"block-sd"},
	} {
		got := u.words(s, key)
		for _, n := range need {
			if !slices.Contains(got, n) {
				t.Errorf("%s %v lacks %s", key, got, n)
			}
		}
	}
	if u.last("Install", "WantedBy") != "multi-user.target" {
		t.Errorf("WantedBy=%q, want multi-user.target", u.last("Install", "WantedBy"))
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for ferry\.service: ([0-9.]+) (\S+)`)

// TestUnit_SecurityExposureMatchesDocs runs `systemd-analyze security` on
// the unit and checks the score is OK and the one docs/admin.md prints.
func TestUnit_SecurityExposureMatchesDocs(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	out := run(t, root, analyze, "security", "--offline=true", "--no-pager", "packaging/ferry.service")
	m := exposureRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	score, _ := strconv.ParseFloat(m[1], 64)
	if score > 3.0 {
		t.Errorf("exposure %s %s: more than 3.0; a grant was widened\n%s", m[1], m[2], out)
	}
	doc := exposureRE.FindStringSubmatch(repoFile(t, "docs/admin.md"))
	if doc == nil || doc[1] != m[1] {
		t.Errorf("docs/admin.md shows exposure %v, the unit scores %s: paste the output of\n  systemd-analyze security --offline=true packaging/ferry.service\ninto docs/admin.md", doc, m[1])
	}
}

// TestUnit_YieldsToTheNodesWorkloads checks the unit runs ferry's bulk work
// below the node's workloads (docs/design.md, "Pacing"): in ferry.slice, a
// slice of its own at the top of the tree (weights divide a parent's share
// between siblings, so only there does a low weight count against the pods)
// with a CPU and IO weight under the default 100; a positive nice and
// best-effort IO at a low priority (never the idle class, which starves on a
// disk etcd keeps busy, nor realtime); and that docs/good-neighbour.md names
// the same settings.
func TestUnit_YieldsToTheNodesWorkloads(t *testing.T) {
	u := parseUnit(t, repoFile(t, "packaging/ferry.service"))
	sl := parseUnit(t, repoFile(t, "packaging/ferry.slice"))
	s := "Service"
	if got := u.last(s, "Slice"); got != "ferry.slice" {
		t.Errorf("Slice=%q, want ferry.slice", got)
	}
	for _, key := range []string{"CPUWeight", "IOWeight"} {
		w, err := strconv.Atoi(sl.last("Slice", key))
		if err != nil || w < 1 || w >= 100 {
			t.Errorf("ferry.slice %s=%q: want a weight in [1, 100), below the default units' 100", key, sl.last("Slice", key))
		}
		if v := u.last(s, key); v != "" {
			t.Errorf("ferry.service sets %s=%s: the slice weighs ferry against the node", key, v)
		}
	}
	if n, err := strconv.Atoi(u.last(s, "Nice")); err != nil || n <= 0 || n > 19 {
		t.Errorf("Nice=%q: want 1..19", u.last(s, "Nice"))
	}
	if c := u.last(s, "IOSchedulingClass"); c != "best-effort" && c != "2" {
		t.Errorf("IOSchedulingClass=%q: want best-effort (idle starves under etcd's constant fsyncs)", c)
	}
	if p, err := strconv.Atoi(u.last(s, "IOSchedulingPriority")); err != nil || p < 4 || p > 7 {
		t.Errorf("IOSchedulingPriority=%q: want 4..7 (below the default 4)", u.last(s, "IOSchedulingPriority"))
	}
	for _, unit := range []struct {
		u       unitFile
		section string
	}{{u, s}, {sl, "Slice"}} {
		for _, key := range []string{"CPUQuota", "IOReadBandwidthMax", "IOWriteBandwidthMax", "CPUSchedulingPolicy"} {
			if v := unit.u.last(unit.section, key); v != "" {
				t.Errorf("%s=%s: a fixed cap slows ferry on a quiet node too; weights and pacing only", key, v)
			}
		}
	}

	doc := repoFile(t, "docs/good-neighbour.md")
	for _, want := range []string{"Slice=ferry.slice", "CPUWeight=" + sl.last("Slice", "CPUWeight"), "IOWeight=" + sl.last("Slice", "IOWeight"),
		"Nice=" + u.last(s, "Nice"), "IOSchedulingClass=" + u.last(s, "IOSchedulingClass"),
		"IOSchedulingPriority=" + u.last(s, "IOSchedulingPriority")} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/good-neighbour.md does not show %s", want)
		}
	}
}
