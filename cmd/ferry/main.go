// Command ferry is the node agent and bundle tool. main only parses the
// command line (a cobra tree, as oc, kubectl and podman) and wires packages
// together.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes shared by every subcommand.
const (
	exitOK      = 0
	exitRefused = 1 // the bundle or the node state was refused
	exitUsage   = 2 // bad flags, bad arguments, bad config
)

// usageErr marks an error as the caller's (exit 2); any other is exit 1.
type usageErr struct{ error }

func usageError(format string, a ...any) error { return usageErr{fmt.Errorf(format, a...)} }

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// run runs the command args name and returns its exit code. Help goes to
// stdout; a refusal is printed once, to stderr, after the command's name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	c, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n", c.CommandPath(), err)
	if errors.As(err, new(usageErr)) {
		return exitUsage
	}
	return exitRefused
}

func newRootCmd() *cobra.Command {
	root := group("ferry <command>", "ferry upgrades disconnected OpenShift nodes from an upgrade bundle.",
		newAgentCmd(), newStatusCmd(), newLoadCmd(), newProceedCmd(), newCleanupCmd(), newApproveCmd(),
		group("config <command>", "check the agent's config", newConfigCheckCmd()),
		group("bundle <command>", "create, inspect, verify and extract upgrade bundles",
			newBundleCreateCmd(), newBundleInspectCmd(), newBundleVerifyCmd(), newBundleExtractCmd()),
		newCompletionCmd(), newVersionCmd())
	root.SilenceErrors, root.SilenceUsage = true, true // run prints the error, once
	root.CompletionOptions.DisableDefaultCmd = true    // ours is newCompletionCmd
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError("%v (run '%s -h' for its flags)", err, c.CommandPath())
	})
	setExamples(root)
	root.SetHelpFunc(func(c *cobra.Command, _ []string) { writeHelp(c) })
	root.SetUsageFunc(func(c *cobra.Command) error { writeHelp(c); return nil })
	return root
}

// group is a command that holds others. Alone it lists them (exit 0); an
// unknown word after it is a usage error.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return c.Help()
			}
			hint := ""
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				hint = fmt.Sprintf(", did you mean %q?", s[0])
			}
			return usageError("unknown command %q%s (run '%s -h' for its commands)", strings.Join(args, " "), hint, c.CommandPath())
		},
	}
	g.AddCommand(subs...)
	return g
}

// writeHelp prints a command's usage line, summary, subcommands and flags.
func writeHelp(c *cobra.Command) {
	w := c.OutOrStdout()
	fmt.Fprintf(w, "Usage: %s\n", c.UseLine())
	if s := c.Short; s != "" {
		fmt.Fprintf(w, "\n%s%s.\n", strings.ToUpper(s[:1]), strings.TrimSuffix(s[1:], "."))
	}
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintln(w, "\nCommands:")
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-12s  %s\n", s.Name(), s.Short)
			}
		}
	}
	if c.HasAvailableLocalFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", c.LocalFlags().FlagUsages())
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\nRun '%s <command> -h' for a command's flags.\n", c.CommandPath())
	}
}

// setExamples gives c and every command under it its examples.
func setExamples(c *cobra.Command) {
	c.Example = examples[c.CommandPath()]
	for _, s := range c.Commands() {
		setExamples(s)
	}
}

// noArgs refuses positional arguments (exit 2).
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError("takes no arguments, got %q", args)
	}
	return nil
}

// onePath wants one PATH argument; want says which, for the refusal.
func onePath(want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageError("want %s, got %d", want, len(args))
		}
		return nil
	}
}
