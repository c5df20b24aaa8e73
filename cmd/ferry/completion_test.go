package main

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// ferry runs the command line args in-process and returns its exit code,
// stdout (help, completions) and stderr (refusals).
func ferry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestRun_ExitCodesAndMessages(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{"no command lists the commands", nil, 0, []string{"Usage: ferry <command>", "Commands:\n", "  bundle ", "  version "}, nil},
		{"help lists the commands", []string{"help"}, 0, []string{"Commands:\n", "  agent "}, nil},
		{"a group alone lists its commands", []string{"bundle"}, 0, []string{"Usage: ferry bundle", "  create ", "  inspect ", "  verify ", "  extract "}, nil},
		{"config alone lists check", []string{"config"}, 0, []string{"Usage: ferry config", "  check "}, nil},
		{"-h prints the flags", []string{"version", "-h"}, 0, []string{"Usage: ferry version", "-o, --output"}, nil},
		{"-o yaml", []string{"version", "-o", "yaml"}, 0, []string{"version: ", "\ngo: "}, nil},
		{"unknown command", []string{"nope"}, 2, nil, []string{`ferry: unknown command "nope"`}},
		{"unknown subcommand", []string{"bundle", "creat"}, 2, nil, []string{`ferry bundle: unknown command "creat", did you mean "create"?`}},
		{"unknown flag", []string{"version", "--nope"}, 2, nil, []string{"ferry version: unknown flag: --nope (run 'ferry version -h' for its flags)"}},
		{"bad flag value", []string{"bundle", "create", "--jobs", "many"}, 2, nil, []string{"ferry bundle create: ", "--jobs"}},
		{"flag without its value", []string{"status", "--config"}, 2, nil, []string{"ferry status: flag needs an argument: --config"}},
		{"stray argument", []string{"version", "x"}, 2, nil, []string{`takes no arguments, got ["x"]`}},
		{"missing argument", []string{"load"}, 2, nil, []string{"ferry load: want one bundle PATH, or --release, got 0"}},
		{"missing --dest", []string{"bundle", "extract", "x.tar"}, 2, nil, []string{"want one PATH and --dest DIR"}},
		{"bad --pacing", []string{"bundle", "extract", "x.tar", "--dest", "d", "--pacing", "rude"}, 2, nil, []string{`--pacing "rude" is not one of etcd-safe, balanced, eager or off`}},
		{"bad create value", []string{"bundle", "create", "--release", "r", "--platforms", "some"}, 2, nil, []string{`--platforms "some": want arch or all`}},
		{"missing config named", []string{"config", "check", "--config", missing}, 2, nil, []string{"ferry config check: "}},
		{"no shell", []string{"completion"}, 2, nil, []string{"name one shell"}},
		{"unknown shell", []string{"completion", "tcsh"}, 2, nil, []string{`unknown shell "tcsh": choose bash, zsh or fish`}},
		{"a refusal is exit 1", []string{"bundle", "verify", missing, "--quiet"}, 1, nil, []string{"ferry bundle verify: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := ferry(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout, stderr)
			}
			for _, w := range tc.stdout {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			for _, w := range tc.stderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if tc.code != 0 && strings.Count(stderr, "\n") != 1 {
				t.Errorf("want the refusal once, on one line:\n%s", stderr)
			}
		})
	}
}

// commandPaths is every command of the tree but the root, as words.
func commandPaths(c *cobra.Command) [][]string {
	var out [][]string
	for _, s := range c.Commands() {
		p := strings.Fields(s.CommandPath())[1:]
		out = append(out, p)
		out = append(out, commandPaths(s)...)
	}
	return out
}

func TestHelp_EveryCommandShowsItsUsageAndEveryFlag(t *testing.T) {
	root := newRootCmd()
	for _, p := range commandPaths(root) {
		c, _, err := root.Find(p)
		if err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := ferry(t, append(p, "-h")...)
		if code != 0 || !strings.HasPrefix(stdout, "Usage: ferry "+strings.Join(p, " ")) {
			t.Errorf("ferry %s -h: exit %d\n%s%s", strings.Join(p, " "), code, stdout, stderr)
		}
		if c.Example == "" || !strings.Contains(stdout, "\nExamples:\n"+c.Example+"\n") {
			t.Errorf("ferry %s -h shows no example:\n%s", strings.Join(p, " "), stdout)
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if !strings.Contains(stdout, "--"+f.Name+" ") {
				t.Errorf("ferry %s -h does not show --%s:\n%s", strings.Join(p, " "), f.Name, stdout)
			}
		})
	}
}

// An example for a command that is gone, or renamed, would never show.
func TestExamples_EachNamesACommand(t *testing.T) {
	root := newRootCmd()
	for path := range examples {
		if c, _, err := root.Find(strings.Fields(path)[1:]); err != nil || c.CommandPath() != path {
			t.Errorf("examples[%q]: no such command", path)
		}
	}
}

func TestComplete_CommandsArgumentsAndFlagValues(t *testing.T) {
	for _, tc := range []struct {
		line      []string
		want      []string
		directive cobra.ShellCompDirective
	}{
		{[]string{""}, []string{"agent", "bundle", "completion", "config", "help", "version"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", ""}, []string{"create", "inspect", "verify", "extract"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"config", ""}, []string{"check"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"version", "--"}, []string{"--output", "--help"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"status", "-o", ""}, []string{"json", "yaml", "wide"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", "extract", "--pacing", ""}, []string{"etcd-safe", "balanced", "eager", "off"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", "create", "--arch", ""}, []string{"x86_64", "aarch64", "ppc64le", "s390x"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", "create", "--platforms", ""}, []string{"arch", "all"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", "create", "--signatures", ""}, []string{"all", "release"}, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", "verify", "--arch", ""}, []string{"x86_64"}, cobra.ShellCompDirectiveNoFileComp},
		// Paths complete as file names, directories as directories.
		{[]string{"load", ""}, nil, cobra.ShellCompDirectiveDefault},
		{[]string{"bundle", "inspect", ""}, nil, cobra.ShellCompDirectiveDefault},
		{[]string{"bundle", "verify", "--trusted-key", ""}, nil, cobra.ShellCompDirectiveDefault},
		{[]string{"bundle", "create", "--pull-secret", ""}, nil, cobra.ShellCompDirectiveDefault},
		{[]string{"agent", "--config", ""}, []string{"toml"}, cobra.ShellCompDirectiveFilterFileExt},
		{[]string{"bundle", "extract", "--dest", ""}, nil, cobra.ShellCompDirectiveFilterDirs},
		{[]string{"bundle", "create", "--output", ""}, nil, cobra.ShellCompDirectiveFilterDirs},
		// Nothing to complete: no file names either.
		{[]string{"status", ""}, nil, cobra.ShellCompDirectiveNoFileComp},
		{[]string{"bundle", "create", "--release", ""}, nil, cobra.ShellCompDirectiveNoFileComp},
	} {
		code, stdout, stderr := ferry(t, append([]string{cobra.ShellCompNoDescRequestCmd}, tc.line...)...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", tc.line, code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		got, directive := lines[:len(lines)-1], lines[len(lines)-1]
		for _, w := range tc.want {
			if !strings.Contains("\n"+strings.Join(got, "\n")+"\n", "\n"+w+"\n") {
				t.Errorf("%q: %s not offered: %q", tc.line, w, got)
			}
		}
		if want := ":" + strconv.Itoa(int(tc.directive)); directive != want {
			t.Errorf("%q: directive %s, want %s", tc.line, directive, want)
		}
	}
}

func TestCompletion_EveryShellGetsAScript(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_ferry", "zsh": "#compdef ferry", "fish": "complete -c ferry"} {
		code, stdout, stderr := ferry(t, "completion", shell)
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("completion %s: exit %d, script lacks %q\n%s", shell, code, want, stderr)
		}
	}
}
