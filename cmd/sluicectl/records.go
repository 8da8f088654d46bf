package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
)

// recordCommand is a command on one kind of record the enforcer's admin
// API keeps (keys, tenants, plans). Such commands differ only in their
// verbs, flags, requests and tables: the steps around them (a verb, the
// record's id or name, the connection, the timeout, the answer as JSON or
// text) are runRecordCommand's, so that every record command parses and
// answers alike.
type recordCommand struct {
	// name is the command, as usage lines and errors name it.
	name string
	// usage is printed for help.
	usage string
	verbs []string
	// takesName reports whether verb's first argument, unless it is a
	// flag, is the record's id or name.
	takesName func(verb string) bool
	// versionHelp is -version's help: which verbs carry it.
	versionHelp string
	// flags defines the command's own flags on fs.
	flags func(fs *flag.FlagSet)
	// request checks the flags for verb on the record name and returns the
	// call to make; its error is reported before anything is sent.
	request func(verb, name string, f recordFlags) (recordCall, error)
	// text writes an answer for people.
	text func(out io.Writer, answer any) error
}

// recordCall performs a record command's request and returns the API's
// answer.
type recordCall func(ctx context.Context, c *adminapi.Client) (any, error)

// recordFlags are the flags every record command has.
type recordFlags struct {
	out, reason string
	version     uint64
}

func runRecordCommand(ctx context.Context, rc recordCommand, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "help" {
		fmt.Fprintln(os.Stderr, rc.usage)
		if len(args) == 0 {
			return errors.New(rc.name + ": a verb is required")
		}
		return flag.ErrHelp
	}
	verb, rest := args[0], args[1:]
	if !slices.Contains(rc.verbs, verb) {
		return fmt.Errorf("%s: unknown verb %q; the verbs are %s (sluicectl %s help)", rc.name, verb, strings.Join(rc.verbs, ", "), rc.name)
	}
	var name string
	if rc.takesName(verb) && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	fs := flag.NewFlagSet(rc.name+" "+verb, flag.ContinueOnError)
	connect := adminConnFlags(fs, rc.name)
	var f recordFlags
	fs.StringVar(&f.out, "o", "text", "output: text or json")
	fs.Uint64Var(&f.version, "version", 0, rc.versionHelp)
	fs.StringVar(&f.reason, "reason", "", "why (required for changes; recorded in the audit trail)")
	rc.flags(fs)
	timeout := fs.Duration("timeout", 15*time.Second, "request timeout")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if f.out != "text" && f.out != "json" {
		return fmt.Errorf("%s: -o: %q is not text or json", rc.name, f.out)
	}
	call, err := rc.request(verb, name, f)
	if err != nil {
		return fmt.Errorf("%s %s: %w", rc.name, verb, err)
	}
	client, err := connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	answer, err := call(ctx, client)
	if err != nil {
		return fmt.Errorf("%s %s: %w", rc.name, verb, err)
	}
	if f.out == "json" {
		return writeJSONTo(out, answer)
	}
	return rc.text(out, answer)
}
