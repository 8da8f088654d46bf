// Command sluicectl is the operator's command line for a running Sluice:
// each file in this folder adds subcommands (admin actions on breakers,
// blacklists and overrides; reconciliation; cost reports) to one table.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// command is one sluicectl subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands is filled by the init functions of the files in this folder.
var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string) error) {
	if _, dup := commands[name]; dup {
		panic("sluicectl: command registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

func usage() string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: sluicectl <command> [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-12s %s\n", n, commands[n].summary)
	}
	b.WriteString("\n`sluicectl <command> -h` describes one command.")
	return b.String()
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "help" {
		fmt.Fprintln(os.Stderr, usage())
		os.Exit(2)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "sluicectl: unknown command %q\n\n%s\n", os.Args[1], usage())
		os.Exit(2)
	}
	if err := c.run(context.Background(), os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "sluicectl:", err)
		os.Exit(1)
	}
}
