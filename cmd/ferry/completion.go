package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Flags, help and shell completion.
//
// A command that declares its flags with newFlagSet at package level gets
// `ferry <command> -h` and completion of its flags for free:
//
//	var statusFlags = newFlagSet("status", "")
//	var statusJSON = statusFlags.Bool("json", false, "print the status as JSON")
//
//	func runStatus(ctx context.Context, args []string) error {
//		if err := parseFlags(statusFlags, args); err != nil {
//			return err
//		}
//		...
//
// A command that builds its own flag.FlagSet still completes by name, and
// its positional arguments complete as file names.

// flagSets holds the flag set of every command that declared one, by
// command name.
var flagSets = map[string]*commandFlags{}

type commandFlags struct {
	fs *flag.FlagSet
	// args is the usage of the positional arguments: "" for none,
	// "<a|b|c>" for one of fixed words, anything else for file names.
	args string
}

// newFlagSet declares the flags of the command named name. args describes
// its positional arguments for the usage line ("" for none, "<bundle.tar>",
// "<bash|zsh|fish>").
func newFlagSet(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("ferry "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	flagSets[name] = &commandFlags{fs: fs, args: args}
	return fs
}

// errHelp is returned by parseFlags when -h or --help was given and the
// help has been printed; run exits 0 on it.
var errHelp = flag.ErrHelp

// parseFlags parses args into fs. On -h it prints the command's help to
// stdout and returns an error wrapping flag.ErrHelp; on a bad flag it
// returns a usage error that names the flag and says where to look.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		writeCommandHelp(os.Stdout, strings.TrimPrefix(fs.Name(), "ferry "))
		return errHelp
	default:
		return usageError("%v (run '%s -h' for its flags)", err, fs.Name())
	}
}

// writeCommandHelp prints the usage line, summary and flags of a command.
func writeCommandHelp(w io.Writer, name string) {
	cf := flagSets[name]
	line := "ferry " + name
	if cf != nil && hasFlags(cf.fs) {
		line += " [flags]"
	}
	if cf != nil && cf.args != "" {
		line += " " + cf.args
	}
	fmt.Fprintf(w, "Usage: %s\n", line)
	if c := commands[name]; c != nil && c.summary != "" {
		fmt.Fprintf(w, "\n%s\n", capitalize(c.summary))
	}
	if cf != nil && hasFlags(cf.fs) {
		fmt.Fprintln(w, "\nFlags:")
		cf.fs.SetOutput(w)
		cf.fs.PrintDefaults()
		cf.fs.SetOutput(io.Discard)
	}
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:] + map[bool]string{true: "", false: "."}[strings.HasSuffix(s, ".")]
}

var completionFlags = newFlagSet("completion", "<bash|zsh|fish>")

func init() {
	register(&command{name: "completion", summary: "print a shell completion script (bash, zsh or fish)", run: runCompletion})
}

func runCompletion(_ context.Context, args []string) error {
	if err := parseFlags(completionFlags, args); err != nil {
		return err
	}
	if completionFlags.NArg() != 1 {
		return usageError("name one shell: bash, zsh or fish (e.g. source <(ferry completion bash))")
	}
	return writeCompletion(os.Stdout, completionFlags.Arg(0), buildCompletionSpec(commands, flagSets))
}

// writeCompletion writes the completion script for shell.
func writeCompletion(w io.Writer, shell string, spec completionSpec) error {
	var script string
	switch shell {
	case "bash":
		script = bashCompletion(spec)
	case "zsh":
		script = zshCompletion(spec)
	case "fish":
		script = fishCompletion(spec)
	default:
		return usageError("unknown shell %q: choose bash, zsh or fish", shell)
	}
	_, err := io.WriteString(w, script)
	return err
}

// completionSpec is the command tree the scripts are generated from.
type completionSpec struct {
	// paths is every word path that names a command or a group of
	// commands, "" (ferry itself) first, then sorted: "", "bundle",
	// "bundle create", ...
	paths []string
	// next is, for each path, the words that may follow it.
	next map[string][]compWord
	// commands is, for each path that is a command, what follows its name.
	commands map[string]compCommand
}

type compWord struct{ name, desc string }

type compCommand struct {
	flags []compFlag
	// choices are the fixed words its argument is one of; files says its
	// arguments are file names; neither: it takes no arguments.
	choices []string
	files   bool
}

type compFlag struct {
	name, desc string
	value      bool // takes a value (completed as a file name)
}

// dash is how a flag is written: -o, --json.
func (f compFlag) dash() string {
	if len(f.name) == 1 {
		return "-" + f.name
	}
	return "--" + f.name
}

func buildCompletionSpec(cmds map[string]*command, sets map[string]*commandFlags) completionSpec {
	spec := completionSpec{next: map[string][]compWord{}, commands: map[string]compCommand{}}
	seen := map[string]bool{"": true}
	groups := map[string][]string{}
	for name, c := range cmds {
		words := strings.Fields(name)
		for i := range words {
			parent, path := strings.Join(words[:i], " "), strings.Join(words[:i+1], " ")
			if !seen[path] {
				seen[path] = true
				spec.next[parent] = append(spec.next[parent], compWord{name: words[i]})
			}
			if i < len(words)-1 {
				groups[path] = append(groups[path], words[i+1])
			}
		}
		cc := compCommand{files: true}
		if cf := sets[name]; cf != nil {
			cc.files = false
			if a := strings.Trim(cf.args, "<>"); a != cf.args && strings.Contains(a, "|") {
				cc.choices = strings.Split(a, "|")
			} else if cf.args != "" {
				cc.files = true
			}
			cf.fs.VisitAll(func(f *flag.Flag) {
				b, ok := f.Value.(interface{ IsBoolFlag() bool })
				cc.flags = append(cc.flags, compFlag{
					name:  f.Name,
					desc:  strings.SplitN(f.Usage, "\n", 2)[0],
					value: !(ok && b.IsBoolFlag()),
				})
			})
		}
		cc.flags = append(cc.flags, compFlag{name: "help", desc: "show the command's flags"})
		spec.commands[name] = cc
		_ = c
	}
	// Describe each word: a command by its summary, a group by its members.
	for parent, ws := range spec.next {
		for i := range ws {
			path := strings.TrimSpace(parent + " " + ws[i].name)
			if c := cmds[path]; c != nil {
				ws[i].desc = c.summary
			} else {
				members := dedupSorted(groups[path])
				ws[i].desc = ws[i].name + " commands: " + strings.Join(members, ", ")
			}
		}
		sort.Slice(ws, func(i, j int) bool { return ws[i].name < ws[j].name })
	}
	spec.next[""] = append(spec.next[""], compWord{name: "help", desc: "list the commands"})
	sort.Slice(spec.next[""], func(i, j int) bool { return spec.next[""][i].name < spec.next[""][j].name })
	for p := range seen {
		spec.paths = append(spec.paths, p)
	}
	sort.Strings(spec.paths)
	return spec
}

func dedupSorted(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// walkPattern is the shell case pattern matching every non-empty path:
// 'agent'|'bundle'|'bundle create'|...
func (s completionSpec) walkPattern() string {
	var ps []string
	for _, p := range s.paths {
		if p != "" {
			ps = append(ps, shQuote(p))
		}
	}
	return strings.Join(ps, "|")
}

func (c compCommand) flagWords() string {
	var ws []string
	for _, f := range c.flags {
		ws = append(ws, f.dash())
	}
	return strings.Join(ws, " ")
}

func (c compCommand) valueFlagPattern() string {
	var ws []string
	for _, f := range c.flags {
		if f.value {
			// Go's flag package takes -name and --name alike.
			ws = append(ws, "-"+f.name, "--"+f.name)
		}
	}
	return strings.Join(ws, "|")
}

func wordNames(ws []compWord) string {
	var names []string
	for _, w := range ws {
		names = append(names, w.name)
	}
	return strings.Join(names, " ")
}

// shQuote quotes s for bash and zsh.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// fishQuote quotes s for fish.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func bashCompletion(s completionSpec) string {
	var b strings.Builder
	b.WriteString(`# bash completion for ferry, generated by 'ferry completion bash'.
# Load it now:      source <(ferry completion bash)
# or for good:      ferry completion bash > /usr/share/bash-completion/completions/ferry
_ferry() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local cmd="" w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in -*) continue ;; esac
        case "${cmd:+$cmd }$w" in
        ` + s.walkPattern() + `) cmd="${cmd:+$cmd }$w" ;;
        *) break ;;
        esac
    done
    COMPREPLY=()
    case $cmd in
`)
	for _, p := range s.paths {
		fmt.Fprintf(&b, "    %s)\n", shQuote(p))
		c, isCmd := s.commands[p]
		if isCmd {
			if vp := c.valueFlagPattern(); vp != "" {
				fmt.Fprintf(&b, "        case $prev in %s) compopt -o filenames; mapfile -t COMPREPLY < <(compgen -f -- \"$cur\"); return ;; esac\n", vp)
			}
			fmt.Fprintf(&b, "        if [[ $cur == -* ]]; then mapfile -t COMPREPLY < <(compgen -W %s -- \"$cur\"); return; fi\n", shQuote(c.flagWords()))
		}
		switch {
		case len(s.next[p]) > 0:
			fmt.Fprintf(&b, "        mapfile -t COMPREPLY < <(compgen -W %s -- \"$cur\")\n", shQuote(wordNames(s.next[p])))
		case len(c.choices) > 0:
			fmt.Fprintf(&b, "        mapfile -t COMPREPLY < <(compgen -W %s -- \"$cur\")\n", shQuote(strings.Join(c.choices, " ")))
		case c.files:
			b.WriteString("        compopt -o filenames; mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")\n")
		}
		b.WriteString("        ;;\n")
	}
	b.WriteString(`    esac
}
complete -F _ferry ferry
`)
	return b.String()
}

func zshDescribe(b *strings.Builder, tag, what string, items []compWord) {
	b.WriteString("        opts=(")
	for i, it := range items {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(shQuote(strings.ReplaceAll(it.name, ":", `\:`) + ":" + it.desc))
	}
	fmt.Fprintf(b, ")\n        _describe -t %s %s opts\n", tag, shQuote(what))
}

func zshCompletion(s completionSpec) string {
	var b strings.Builder
	b.WriteString(`#compdef ferry
# zsh completion for ferry, generated by 'ferry completion zsh'.
# Load it now:      source <(ferry completion zsh)
# or for good:      ferry completion zsh > "${fpath[1]}/_ferry"
_ferry() {
    local cmd="" w i cur=${words[CURRENT]} prev=${words[CURRENT-1]}
    local -a opts
    for ((i = 2; i < CURRENT; i++)); do
        w=${words[i]}
        [[ $w == -* ]] && continue
        case "${cmd:+$cmd }$w" in
        (` + s.walkPattern() + `) cmd="${cmd:+$cmd }$w" ;;
        (*) break ;;
        esac
    done
    case $cmd in
`)
	for _, p := range s.paths {
		fmt.Fprintf(&b, "    (%s)\n", shQuote(p))
		c, isCmd := s.commands[p]
		if isCmd {
			if vp := c.valueFlagPattern(); vp != "" {
				fmt.Fprintf(&b, "        case $prev in (%s) _files; return ;; esac\n", vp)
			}
			b.WriteString("        if [[ $cur == -* ]]; then\n    ")
			var fl []compWord
			for _, f := range c.flags {
				fl = append(fl, compWord{name: f.dash(), desc: f.desc})
			}
			zshDescribe(&b, "flags", "flag", fl)
			b.WriteString("            return\n        fi\n")
		}
		switch {
		case len(s.next[p]) > 0:
			zshDescribe(&b, "commands", "ferry command", s.next[p])
		case len(c.choices) > 0:
			var ch []compWord
			for _, w := range c.choices {
				ch = append(ch, compWord{name: w, desc: w})
			}
			zshDescribe(&b, "arguments", "argument", ch)
		case c.files:
			b.WriteString("        _files\n")
		}
		b.WriteString("        ;;\n")
	}
	b.WriteString(`    esac
}
if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    _ferry "$@"
else
    compdef _ferry ferry
fi
`)
	return b.String()
}

func fishCompletion(s completionSpec) string {
	var b strings.Builder
	var cases []string
	for _, p := range s.paths {
		if p != "" {
			cases = append(cases, fishQuote("ferry "+p))
		}
	}
	b.WriteString(`# fish completion for ferry, generated by 'ferry completion fish'.
# Load it now:      ferry completion fish | source
# or for good:      ferry completion fish > ~/.config/fish/completions/ferry.fish
function __ferry_cmd
    set -l cmd ferry
    set -l words (commandline -opc)
    set -e words[1]
    for w in $words
        string match -q -- '-*' $w; and continue
        switch "$cmd $w"
            case ` + strings.Join(cases, " ") + `
                set cmd "$cmd $w"
            case '*'
                break
        end
    end
    echo $cmd
end
function __ferry_is
    test (__ferry_cmd) = "$argv[1]"
end
complete -c ferry -f
`)
	for _, p := range s.paths {
		cond := fishQuote("__ferry_is " + fishQuote(strings.TrimSpace("ferry "+p)))
		for _, w := range s.next[p] {
			fmt.Fprintf(&b, "complete -c ferry -n %s -a %s -d %s\n", cond, fishQuote(w.name), fishQuote(w.desc))
		}
		c, isCmd := s.commands[p]
		if !isCmd {
			continue
		}
		for _, f := range c.flags {
			opt := "-l " + f.name
			if len(f.name) == 1 {
				opt = "-s " + f.name
			}
			if f.value {
				opt += " -r -F"
			}
			fmt.Fprintf(&b, "complete -c ferry -n %s %s -d %s\n", cond, opt, fishQuote(f.desc))
		}
		switch {
		case len(c.choices) > 0:
			fmt.Fprintf(&b, "complete -c ferry -n %s -a %s\n", cond, fishQuote(strings.Join(c.choices, " ")))
		case c.files && len(s.next[p]) == 0:
			fmt.Fprintf(&b, "complete -c ferry -n %s -F\n", cond)
		}
	}
	return b.String()
}
