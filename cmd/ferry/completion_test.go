package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

// fakeTree is a command tree with a group, flags of each kind and an
// argument with fixed choices.
func fakeTree() (map[string]*command, map[string]*commandFlags) {
	nop := func(context.Context, []string) error { return nil }
	cmds := map[string]*command{}
	for _, n := range []string{"agent", "bundle create", "bundle verify", "shell"} {
		cmds[n] = &command{name: n, summary: "does " + n, run: nop}
	}
	sets := map[string]*commandFlags{}
	agentFS := flag.NewFlagSet("ferry agent", flag.ContinueOnError)
	agentFS.String("config", "", "config file")
	agentFS.Bool("debug", false, "log more")
	sets["agent"] = &commandFlags{fs: agentFS}
	sets["shell"] = &commandFlags{fs: flag.NewFlagSet("ferry shell", flag.ContinueOnError), args: "<bash|zsh>"}
	return cmds, sets
}

func TestBuildCompletionSpec_GroupsWordsFlagsAndArguments(t *testing.T) {
	spec := buildCompletionSpec(fakeTree())

	if want := []string{"", "agent", "bundle", "bundle create", "bundle verify", "shell"}; !slices.Equal(spec.paths, want) {
		t.Errorf("paths %q, want %q", spec.paths, want)
	}
	var top []string
	for _, w := range spec.next[""] {
		top = append(top, w.name)
	}
	if want := []string{"agent", "bundle", "help", "shell"}; !slices.Equal(top, want) {
		t.Errorf("top words %q, want %q", top, want)
	}
	for _, w := range spec.next[""] {
		if w.name == "bundle" && w.desc != "bundle commands: create, verify" {
			t.Errorf("group description %q", w.desc)
		}
		if w.name == "agent" && w.desc != "does agent" {
			t.Errorf("command description %q", w.desc)
		}
	}

	agent := spec.commands["agent"]
	flags := map[string]bool{}
	for _, f := range agent.flags {
		flags[f.dash()] = f.value
	}
	if v, ok := flags["--config"]; !ok || !v {
		t.Errorf("--config should take a value: %v", flags)
	}
	if v, ok := flags["--debug"]; !ok || v {
		t.Errorf("--debug is a bool flag: %v", flags)
	}
	if _, ok := flags["--help"]; !ok {
		t.Errorf("--help not offered: %v", flags)
	}
	if agent.files || agent.choices != nil {
		t.Errorf("agent takes no arguments: %+v", agent)
	}
	if c := spec.commands["shell"]; !slices.Equal(c.choices, []string{"bash", "zsh"}) {
		t.Errorf("shell choices %q", c.choices)
	}
	if c := spec.commands["bundle verify"]; !c.files {
		t.Errorf("a command without a declared flag set completes files: %+v", c)
	}
}

func TestWriteCompletion_EveryShellNamesEveryCommand(t *testing.T) {
	spec := buildCompletionSpec(fakeTree())
	for _, shell := range []string{"bash", "zsh", "fish"} {
		var b bytes.Buffer
		if err := writeCompletion(&b, shell, spec); err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"agent", "bundle", "create", "verify", "shell", "config"} {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s script lacks %q", shell, w)
			}
		}
	}
}

func TestWriteCompletion_UnknownShellIsAUsageError(t *testing.T) {
	err := writeCompletion(&bytes.Buffer{}, "tcsh", completionSpec{})
	var u usageErr
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "bash, zsh or fish") {
		t.Fatalf("got %v, want a usage error naming the shells", err)
	}
}

func TestShellQuoting_SurvivesQuotes(t *testing.T) {
	if got := shQuote("it's"); got != `'it'\''s'` {
		t.Errorf("shQuote: %s", got)
	}
	if got := fishQuote(`it's a \ path`); got != `'it\'s a \\ path'` {
		t.Errorf("fishQuote: %s", got)
	}
}

func TestParseFlags_HelpIsErrHelpAndBadFlagIsUsage(t *testing.T) {
	fs := newFlagSet("test-parse", "")
	t.Cleanup(func() { delete(flagSets, "test-parse") })
	fs.Bool("json", false, "json")
	if err := parseFlags(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v, want flag.ErrHelp (exit 0)", err)
	}
	var u usageErr
	if err := parseFlags(fs, []string{"--nope"}); !errors.As(err, &u) || !strings.Contains(err.Error(), "-nope") {
		t.Errorf("--nope: got %v, want a usage error naming it", err)
	}
	if err := parseFlags(fs, []string{"--json"}); err != nil {
		t.Errorf("--json: %v", err)
	}
}

func TestFlagSets_BelongToRegisteredCommands(t *testing.T) {
	for name := range flagSets {
		if commands[name] == nil {
			t.Errorf("flags declared for %q, which is not a registered command", name)
		}
	}
}
