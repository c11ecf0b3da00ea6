package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// TestCLIReferenceMatchesHelp: docs/cli.md has, for every command that
// "gateway help" lists and every subcommand of quota and forward, a
// section of its command ("## gateway CMD") naming every flag the
// command's or subcommand's own --help prints, an example in a sh block
// (a line starting "gateway CMD [SUB]") and its exit status; the command
// table lists every command; the version block shows what version
// prints.
func TestCLIReferenceMatchesHelp(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(sourceDir, "..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	helpOf := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(context.Background(), append(args, "--help"), &out, &errOut)
		if code := exitCode(err, &errOut); code != 0 {
			t.Errorf("gateway %s --help: exit %d: %s", strings.Join(args, " "), code, errOut.String())
		}
		return out.String()
	}
	var top bytes.Buffer
	if err := run(context.Background(), []string{"help"}, &top, &top); err != nil {
		t.Fatal(err)
	}
	flagRE := regexp.MustCompile(`(?:^|[\s\[(|])--([a-z][a-z0-9-]*)`)
	sh := regexp.MustCompile("(?s)```sh\n(.*?)```")
	checked := 0
	for _, cmd := range strings.Split(commands, ", ") {
		if !strings.Contains(top.String(), "gateway "+cmd) && cmd != "serve" {
			t.Errorf("gateway help does not list %s", cmd)
		}
		if !regexp.MustCompile("(?m)^\\| `gateway (\\[" + cmd + "\\]|" + cmd + ")[ `]").MatchString(page) {
			t.Errorf("docs/cli.md: the command table lacks gateway %s", cmd)
		}
		heading := "## gateway " + cmd
		if !strings.Contains(page, "\n"+heading+"\n") {
			t.Errorf("docs/cli.md has no section %q", heading)
			continue
		}
		sec := "\n" + section(t, page, heading)
		if !strings.Contains(sec, "\nExit status: ") {
			t.Errorf("docs/cli.md, gateway %s: no \"Exit status: \" paragraph", cmd)
		}
		var examples []string
		for _, m := range sh.FindAllStringSubmatch(sec, -1) {
			examples = append(examples, strings.Split(m[1], "\n")...)
		}
		paths := [][]string{{cmd}}
		switch cmd {
		case "quota":
			for _, sub := range strings.Split(quotaSubcommands, ", ") {
				paths = append(paths, []string{cmd, sub})
			}
		case "forward":
			for _, m := range regexp.MustCompile(`(?m)^  gateway forward ((?:dead )?[a-z-]+)`).FindAllStringSubmatch(forwardHelp(t), -1) {
				paths = append(paths, append([]string{cmd}, strings.Fields(m[1])...))
			}
		}
		for _, path := range paths {
			checked++
			name := strings.Join(path, " ")
			for _, m := range flagRE.FindAllStringSubmatch(helpOf(path...), -1) {
				if !strings.Contains(sec, "--"+m[1]) {
					t.Errorf("docs/cli.md, section gateway %s: no --%s, which gateway %s --help prints", cmd, m[1], name)
				}
			}
			if len(path) == 1 && cmd != "quota" && cmd != "forward" || len(path) > 1 {
				prefix := "gateway " + name
				if cmd == "serve" {
					prefix = "gateway"
				}
				if !slices.ContainsFunc(examples, func(l string) bool {
					return l == prefix || strings.HasPrefix(l, prefix+" ") || strings.Contains(l, "| "+prefix+" ")
				}) {
					t.Errorf("docs/cli.md, section gateway %s: no example (a line of a sh block starting %q)", cmd, prefix)
				}
			}
		}
	}
	if checked < 25 {
		t.Fatalf("checked %d commands and subcommands, want every one", checked)
	}
	var v bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &v, &v); err != nil {
		t.Fatal(err)
	}
	first := regexp.MustCompile(`^devicegate \S+ \(go\S+ [a-z0-9]+/[a-z0-9]+\)$`)
	if got, _, _ := strings.Cut(v.String(), "\n"); !first.MatchString(got) {
		t.Errorf("gateway version printed %q; the test's pattern is out of date", got)
	}
	vsec := section(t, page, "## gateway version")
	if m := regexp.MustCompile("(?m)^```\n(devicegate .*)\nrevision [0-9a-f]{40}\ntime \\S+Z\n```").FindStringSubmatch(vsec); m == nil || !first.MatchString(m[1]) {
		t.Errorf("docs/cli.md's version block is not what gateway version prints (%q then revision and time lines)", first)
	}
}

// forwardHelp is "gateway help forward".
func forwardHelp(t *testing.T) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help", "forward"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
