package main

import (
	"io"

	"github.com/spf13/cobra"
)

// Shell completion: cobra generates the scripts from the command tree; they
// ask `ferry __complete` for the words. Commands register what their flag
// values complete to (choices, directories, files); a flag that registers
// nothing completes file names.

// archs are the uname -m names of the architectures bundles are made for.
var archs = []string{"x86_64", "aarch64", "ppc64le", "s390x"}

// choices completes a flag's value to one of words.
func choices(words ...string) cobra.CompletionFunc {
	return cobra.FixedCompletions(words, cobra.ShellCompDirectiveNoFileComp)
}

func newCompletionCmd() *cobra.Command {
	return &cobra.Command{
		Use:       "completion <bash|zsh|fish>",
		Short:     "print a shell completion script (bash, zsh or fish)",
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError("name one shell: bash, zsh or fish (e.g. source <(ferry completion bash))")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			return writeCompletion(c.Root(), c.OutOrStdout(), args[0])
		},
	}
}

// writeCompletion writes root's completion script for shell.
func writeCompletion(root *cobra.Command, w io.Writer, shell string) error {
	switch shell {
	case "bash":
		return root.GenBashCompletionV2(w, true)
	case "zsh":
		return root.GenZshCompletion(w)
	case "fish":
		return root.GenFishCompletion(w, true)
	}
	return usageError("unknown shell %q: choose bash, zsh or fish", shell)
}
