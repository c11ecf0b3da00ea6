package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestEveryCommandAnswersHelp: every command and subcommand (those of
// quota and forward, from the lists the dispatch uses, so that one added
// later is checked too) answers --help and -h with its flags and exit
// status 0. Before, "gateway --help" showed serve's flags only, "forward
// status --help" no flags, and "version --help" was a usage error;
// "forward dead --help" exited 2 and "forward dead list --help" listed
// no flags.
func TestEveryCommandAnswersHelp(t *testing.T) {
	flagsOf := func(sub string) *flag.FlagSet { return newQuotaFlags(sub, new(quotaFlags)) }
	cases := []struct {
		args  []string
		flags *flag.FlagSet // each of its flags must be listed
		want  []string      // and these
	}{
		{args: nil, flags: newServeFlags(new(serveFlags)), want: []string{"gateway quota", "gateway forward status", "gateway simulate"}},
		{args: []string{"serve"}, flags: newServeFlags(new(serveFlags))},
		{args: []string{"simulate"}, flags: simulateFlagSet()},
		{args: []string{"passwd"}, flags: newPasswdFlags(new(passwdFlags))},
		{args: []string{"version"}, want: []string{"Usage: gateway version"}},
		{args: []string{"help"}, want: []string{"Usage: gateway help"}},
		{args: []string{"quota"}, flags: flagsOf("set"), want: []string{"gateway quota unblock ID"}},
		{args: []string{"forward"}, flags: flagsOf("status"), want: []string{"gateway forward status"}},
		{args: []string{"forward", "status"}, flags: flagsOf("status"), want: []string{"Usage: gateway forward status"}},
	}
	deadFlags := func(sub string) *flag.FlagSet {
		return newForwardDeadFlags(sub, new(quotaFlags), new(int), new(idList))
	}
	cases = append(cases, struct {
		args  []string
		flags *flag.FlagSet
		want  []string
	}{args: []string{"forward", "dead"}, flags: deadFlags("list"), want: []string{"gateway forward dead list", "gateway forward dead replay", "gateway forward dead drop"}})
	for _, sub := range forwardDeadSubcommands {
		cases = append(cases, struct {
			args  []string
			flags *flag.FlagSet
			want  []string
		}{args: []string{"forward", "dead", sub}, flags: deadFlags(sub), want: []string{"Usage: gateway forward dead " + sub}})
	}
	for _, sub := range strings.Split(quotaSubcommands, ", ") {
		cases = append(cases, struct {
			args  []string
			flags *flag.FlagSet
			want  []string
		}{args: []string{"quota", sub}, flags: flagsOf(sub), want: []string{"Usage: gateway quota " + sub}})
	}
	for _, c := range cases {
		for _, h := range []string{"--help", "-h"} {
			args := append(append([]string{}, c.args...), h)
			var out, errOut bytes.Buffer
			err := run(context.Background(), args, &out, &errOut)
			if code := exitCode(err, &errOut); code != 0 || !errors.Is(err, flag.ErrHelp) {
				t.Errorf("gateway %s: exit %d, %v, stderr %q", strings.Join(args, " "), code, err, errOut.String())
				continue
			}
			var missing []string
			if c.flags != nil {
				c.flags.VisitAll(func(f *flag.Flag) {
					if !strings.Contains(out.String(), "--"+f.Name) {
						missing = append(missing, "--"+f.Name)
					}
				})
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					missing = append(missing, w)
				}
			}
			if len(missing) > 0 {
				t.Errorf("gateway %s: output lacks %q:\n%s", strings.Join(args, " "), missing, out.String())
			}
		}
	}
}
