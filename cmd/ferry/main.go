// Command ferry is the node agent and bundle tool. main only parses the
// command line and wires packages together.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// Exit codes shared by every subcommand.
const (
	exitOK      = 0
	exitRefused = 1 // the bundle or the node state was refused
	exitUsage   = 2 // bad flags, bad config
)

// command is one subcommand. run returns an error wrapped by usageError for
// exit 2, or any other error for exit 1.
type command struct {
	name    string // "bundle create"
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

type usageErr struct{ error }

func usageError(format string, a ...any) error { return usageErr{fmt.Errorf(format, a...)} }

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	cancel()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	c, rest := lookup(args)
	if c == nil {
		printUsage()
		if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
			return exitOK
		}
		fmt.Fprintf(os.Stderr, "ferry: unknown command %q\n", strings.Join(args, " "))
		return exitUsage
	}
	err := c.run(ctx, rest)
	var u usageErr
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp): // -h: help was printed
		return exitOK
	case errors.As(err, &u):
		fmt.Fprintf(os.Stderr, "ferry %s: %v\n", c.name, err)
		return exitUsage
	default:
		fmt.Fprintf(os.Stderr, "ferry %s: %v\n", c.name, err)
		return exitRefused
	}
}

// lookup finds the longest registered command name that prefixes args.
func lookup(args []string) (*command, []string) {
	for n := min(len(args), 3); n > 0; n-- {
		if c, ok := commands[strings.Join(args[:n], " ")]; ok {
			return c, args[n:]
		}
	}
	return nil, args
}

func printUsage() {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(os.Stderr, "ferry upgrades disconnected OpenShift nodes from an upgrade bundle.\n\nUsage: ferry <command> [flags]\n\nCommands:")
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-18s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'ferry <command> -h' for a command's flags.")
}
