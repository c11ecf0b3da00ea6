// Command gateway runs devicegate, an MQTT gateway that holds every
// device to its message quota. "gateway help" lists its commands
// (docs/cli.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	keepStacks(os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default handling so that a
	// second one ends a shutdown that hangs.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode reports err on stderr and returns the process exit code: 0
// for success and for a help request, 2 for a command-line mistake, 1
// for anything else.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.As(err, new(reportedError)) {
		return 1
	}
	// Several problems come one per line; indent all but the first.
	msg := strings.ReplaceAll(strings.TrimRight(err.Error(), "\n"), "\n", "\n  ")
	fmt.Fprintf(stderr, "gateway: %s\n", msg)
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// usageError is a mistake in the command line rather than in what the
// command did.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// reportedError is an error the command has already reported, in its
// log's format (serve with log.format json): exit status 1, and nothing
// more on stderr.
type reportedError struct{ err error }

func (e reportedError) Error() string { return e.err.Error() }
func (e reportedError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

const commands = "serve, quota, forward, simulate, passwd, check, reload, backup, health, version, help"

// run runs the command named by args (without the program name) until it
// finishes or ctx is cancelled; serve treats cancellation as the signal
// to shut down.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd, rest := "serve", args
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		cmd, rest = "version", nil
	}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, rest = args[0], args[1:]
	} else if wantsHelp(args) {
		// "gateway --help": the commands, and the default command's flags.
		_ = help(nil, stdout)
		fmt.Fprintln(stdout, "\nFlags of serve, the default command:")
		printFlags(stdout, newServeFlags(new(serveFlags)))
		return flag.ErrHelp
	}
	if (cmd == "version" || cmd == "help") && wantsHelp(rest) {
		_ = help([]string{cmd}, stdout)
		return flag.ErrHelp
	}
	if c, ok := commandsByName()[cmd]; ok {
		return c.run(ctx, rest, stdout, stderr)
	}
	return usagef("unknown command %q; commands are %s (run \"gateway help\")", cmd, commands)
}

// command is a command's action and its help.
type command struct {
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	help func(w io.Writer)
}

// commandsByName are the commands, by name.
func commandsByName() map[string]command {
	text := func(s string) func(io.Writer) { return func(w io.Writer) { fmt.Fprint(w, s) } }
	return map[string]command{
		"serve":    {serve, func(w io.Writer) { printServeUsage(w, newServeFlags(new(serveFlags))) }},
		"quota":    {func(ctx context.Context, a []string, out, _ io.Writer) error { return quota(ctx, a, out) }, printQuotaUsage},
		"forward":  {func(ctx context.Context, a []string, out, _ io.Writer) error { return forwardCmd(ctx, a, out) }, text(forwardUsage)},
		"simulate": {simulate, func(w io.Writer) { printSimulateUsage(w, simulateFlagSet()) }},
		"passwd": {func(_ context.Context, a []string, out, _ io.Writer) error { return passwd(a, os.Stdin, out) },
			func(w io.Writer) { printPasswdUsage(w, newPasswdFlags(new(passwdFlags))) }},
		"check":  {func(_ context.Context, a []string, out, _ io.Writer) error { return check(a, out) }, text(checkUsage)},
		"backup": {func(ctx context.Context, a []string, out, _ io.Writer) error { return backupCmd(ctx, a, out) }, text(backupUsage)},
		"health": {func(ctx context.Context, a []string, out, _ io.Writer) error { return healthCmd(ctx, a, out) }, text(healthUsage)},
		"reload": {func(ctx context.Context, a []string, out, _ io.Writer) error { return reloadCmd(ctx, a, out) }, text(reloadUsage)},
		"version": {func(_ context.Context, a []string, out, _ io.Writer) error {
			if len(a) > 0 {
				return usagef("version takes no arguments (got %q)", a)
			}
			fmt.Fprint(out, buildVersion().String())
			return nil
		}, text(versionUsage)},
		"help": {func(_ context.Context, a []string, out, _ io.Writer) error { return help(a, out) }, text("Usage: gateway help [command]\n")},
	}
}

func help(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, `gateway runs devicegate, an MQTT gateway that holds every device to its
message quota.

Usage:
  gateway [serve] [flags]   run the gateway (the default command)
  gateway quota SUBCOMMAND  read and change device quotas through the admin API
  gateway forward status    show the upstreams the gateway forwards to
  gateway simulate [flags]  drive a simulated fleet at a gateway (running, spawned or embedded) and judge it
  gateway passwd ...        add or replace an account in a credentials file
  gateway check --config F  validate a configuration file as serve would
  gateway reload            make the running gateway read its config file again
  gateway backup --out F    write a copy of the running gateway's data file
  gateway health            ask a running gateway's /healthz (exit 0: healthy)
  gateway version           print the version
  gateway help [command]    show this help, or a command's flags

Run "gateway help serve" for the flags of serve, "gateway help quota"
for the quota subcommands, "gateway help simulate" for the simulator's.
`)
		return nil
	case len(args) == 1:
		if c, ok := commandsByName()[args[0]]; ok {
			c.help(stdout)
			return nil
		}
	}
	return usagef("help: unknown command %q; commands are %s", strings.Join(args, " "), commands)
}
