package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// completionCase is a command line being completed (the last word is the
// one under the cursor) and words that must, and must not, be offered.
type completionCase struct {
	line    []string
	want    []string
	notWant []string
}

var completionCases = []completionCase{
	{line: []string{"ferry", ""}, want: []string{"bundle", "completion", "version", "help"}},
	{line: []string{"ferry", "ver"}, want: []string{"version"}, notWant: []string{"bundle"}},
	{line: []string{"ferry", "bundle", ""}, want: []string{"inspect", "verify", "extract"}, notWant: []string{"version"}},
	{line: []string{"ferry", "completion", ""}, want: []string{"bash", "zsh", "fish"}},
	{line: []string{"ferry", "version", "--"}, want: []string{"--output", "--help"}},
	{line: []string{"ferry", "config", ""}, want: []string{"check"}, notWant: []string{"version"}},
	{line: []string{"ferry", "bundle", "extract", "--pacing", ""}, want: []string{"etcd-safe", "balanced", "eager", "off"}},
}

// writeScript writes ferry's completion script for shell and puts ferry on
// $PATH: the script asks `ferry __complete` for the words.
func writeScript(t *testing.T, ferry, shell string) string {
	t.Helper()
	t.Setenv("PATH", filepath.Dir(ferry)+string(os.PathListSeparator)+os.Getenv("PATH"))
	p := filepath.Join(t.TempDir(), "ferry."+shell)
	if err := os.WriteFile(p, []byte(run(t, "", ferry, "completion", shell)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func checkOffered(t *testing.T, c completionCase, got []string) {
	t.Helper()
	for _, w := range c.want {
		if !slices.Contains(got, w) {
			t.Errorf("%q: %s not offered (got %v)", strings.Join(c.line, " "), w, got)
		}
	}
	for _, w := range c.notWant {
		if slices.Contains(got, w) {
			t.Errorf("%q: %s offered (got %v)", strings.Join(c.line, " "), w, got)
		}
	}
}

// TestCompletion_Bash sources `ferry completion bash` and calls its
// completion function the way readline does.
func TestCompletion_Bash(t *testing.T) {
	bash := needTool(t, "bash", "bash")
	script := writeScript(t, ferryBinary(t), "bash")
	for _, c := range completionCases {
		// compopt only works inside a real completion; stub it. The script
		// reads the words with bash-completion's _get_comp_words_by_ref:
		// without that package, what it returns for words with no = or :.
		prog := `source "$1"; compopt() { :; }
_get_comp_words_by_ref() { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); __start_ferry; printf '%s\n' "${COMPREPLY[@]}"`
		out := run(t, "", bash, append([]string{"-c", prog, "bash", script}, c.line...)...)
		checkOffered(t, c, strings.Fields(out))
	}
}

// TestCompletion_Zsh loads `ferry completion zsh` with zsh's completion
// helpers stubbed to print what they would offer.
func TestCompletion_Zsh(t *testing.T) {
	zsh := needTool(t, "zsh", "zsh")
	script := writeScript(t, ferryBinary(t), "zsh")
	run(t, "", zsh, "-n", script)
	for _, c := range completionCases {
		prog := `compdef() { :; }
_describe() { local item; for item in "${(@P)${@[-1]}}"; do [[ $item == ${words[CURRENT]}* ]] && print -r -- "${item%%:*}"; done; }
_files() { print -r -- _files; }
source "$1"; shift
words=("$@"); CURRENT=$#
_ferry`
		out := run(t, "", zsh, append([]string{"-f", "-c", prog, "zsh", script}, c.line...)...)
		checkOffered(t, c, strings.Fields(out))
	}
}

// TestCompletion_Fish loads `ferry completion fish` and asks fish itself
// what it completes.
func TestCompletion_Fish(t *testing.T) {
	fish := needTool(t, "fish", "fish")
	script := writeScript(t, ferryBinary(t), "fish")
	run(t, "", fish, "--no-execute", script)
	for _, c := range completionCases {
		cmd := exec.CommandContext(t.Context(), fish, "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, script, strings.Join(c.line, " "))
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fish: %v\n%s", err, out)
		}
		var got []string
		for _, l := range strings.Split(string(out), "\n") {
			w, _, _ := strings.Cut(l, "\t")
			// fish completes the last word whole: strip what is typed before it.
			if w != "" {
				got = append(got, w)
			}
		}
		checkOffered(t, c, got)
	}
}

// TestHelp_EveryCommandAnswersDashH runs `ferry <command> -h` for every
// command `ferry help` lists: it must exit 0 and print a usage line.
func TestHelp_EveryCommandAnswersDashH(t *testing.T) {
	ferry := ferryBinary(t)
	out, err := runErr(t, "", ferry, "help")
	if err != nil {
		t.Fatalf("ferry help: %v\n%s", err, out)
	}
	_, list, ok := strings.Cut(out, "Commands:\n")
	if !ok {
		t.Fatalf("ferry help lists no commands:\n%s", out)
	}
	var names []string
	for _, l := range strings.Split(list, "\n") {
		if !strings.HasPrefix(l, "  ") {
			break
		}
		// "  bundle verify      summary": the name is the words before the gap.
		name, _, _ := strings.Cut(strings.TrimSpace(l), "  ")
		names = append(names, name)
	}
	if !slices.Contains(names, "version") || !slices.Contains(names, "completion") {
		t.Fatalf("ferry help lists %v", names)
	}
	for _, n := range names {
		args := append(strings.Fields(n), "-h")
		out, err := runErr(t, "", ferry, args...)
		if err != nil {
			t.Errorf("ferry %s -h: %v\n%s", n, err, out)
		}
		if !strings.Contains(out, "Usage: ferry "+n) {
			t.Errorf("ferry %s -h prints no usage line:\n%s", n, out)
		}
	}
}
