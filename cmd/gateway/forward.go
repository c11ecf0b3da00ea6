package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
)

const forwardUsage = `Usage:
  gateway forward status [flags]
  gateway forward dead list UPSTREAM [--limit N] [flags]
  gateway forward dead replay UPSTREAM [--id ID]... [flags]
  gateway forward dead drop UPSTREAM [--id ID]... [flags]
  gateway forward drop-log FORMER --data-dir DIR

Shows each upstream the gateway forwards to (forward: in its config):
how many of its connections are up, the messages the upstream
acknowledged since start, the messages and bytes waiting in its forward
logs and how long the oldest has waited, what never went (dropped
oldest, refused, expired), the dead letters, and why a connection is
down (or not answering).

dead list shows the messages an upstream refused for good (its
dead-letter logs): each one's ID, when, why, the device and the topic;
an entry that cannot be read shows DAMAGED. dead replay sends them again
(each appended to its forward log after what waits there, under the ID
it had; do it once the cause is gone) and says how many, a damaged one
left; dead drop deletes them for good and says how many. --id picks
dead letters by their ID (repeat it); without it, every one. The admin API's address and
token come as for gateway quota.

drop-log deletes, for good, the messages waiting in the forward logs of
FORMER, an entry no longer in forward: (renamed or removed), and their
dead letters, and says how many per log; the gateway must be stopped
(it refuses to start while such a log holds messages or dead letters,
unless an entry adopts it). It works on the data file in --data-dir.
`

// forwardCmd runs `gateway forward SUB ...`.
func forwardCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "dead" {
		return forwardDeadCmd(ctx, args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "drop-log" {
		return forwardDropLogCmd(args[1:], stdout)
	}
	if len(args) == 0 || args[0] != "status" {
		if len(args) > 0 && (wantsHelp(args[:1]) || args[0] == "help") {
			return subcommandHelp(stdout, "forward", "status", forwardUsage, newQuotaFlags("status", new(quotaFlags)))
		}
		return usagef("forward: want the subcommand status, dead or drop-log (run \"gateway help forward\")")
	}
	var f quotaFlags
	fs := newQuotaFlags("status", &f)
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return subcommandHelp(stdout, "forward", "status", forwardUsage, fs)
		}
		return usagef("forward status: %v (run \"gateway help forward\")", err)
	}
	if len(pos) > 0 {
		return usagef("forward status: takes no arguments (got %q)", pos)
	}
	c, err := newQuotaClient(f, stdout)
	if err != nil {
		return fmt.Errorf("forward status: %w", err)
	}
	c.prefix = ""
	v, raw, err := c.api.Forward(ctx)
	return c.print("forward status", raw, err, func() { v.WriteText(c.out) })
}

// forwardDeadSubcommands are the subcommands of `gateway forward dead`.
var forwardDeadSubcommands = []string{"list", "replay", "drop"}

// newForwardDeadFlags returns the flags of `gateway forward dead SUB`:
// the admin API's, --limit for list, --id for replay and drop.
func newForwardDeadFlags(sub string, f *quotaFlags, limit *int, ids *idList) *flag.FlagSet {
	fs := newQuotaFlags(sub, f)
	switch sub {
	case "list":
		fs.IntVar(limit, "limit", 100, "the most dead letters to list, 1 to 10000")
	case "replay", "drop":
		fs.Var(ids, "id", "only the dead letter of this `ID` (as dead list shows it); repeat for more; every dead letter when not given")
	}
	return fs
}

// idList is a repeated --id.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }
func (l *idList) Set(s string) error {
	if s == "" {
		return errors.New("an empty ID")
	}
	*l = append(*l, s)
	return nil
}

// forwardDeadCmd runs `gateway forward dead list|replay|drop UPSTREAM`.
func forwardDeadCmd(ctx context.Context, args []string, stdout io.Writer) error {
	var f quotaFlags
	limit := 100
	var ids idList
	if len(args) == 0 || !slices.Contains(forwardDeadSubcommands, args[0]) {
		if len(args) > 0 && (wantsHelp(args[:1]) || args[0] == "help") {
			return subcommandHelp(stdout, "forward", "dead", forwardUsage, newForwardDeadFlags("list", &f, &limit, &ids))
		}
		return usagef("forward dead: want list, replay or drop and an upstream's name (run \"gateway help forward\")")
	}
	sub := "forward dead " + args[0]
	fs := newForwardDeadFlags(args[0], &f, &limit, &ids)
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return subcommandHelp(stdout, "forward", "dead "+args[0], forwardUsage, fs)
		}
		return usagef("%s: %v (run \"gateway help forward\")", sub, err)
	}
	if len(pos) != 1 {
		return usagef("%s: want one upstream's name (got %q)", sub, pos)
	}
	if limit < 1 || limit > 10000 {
		return usagef("%s: --limit must be between 1 and 10000 (got %d)", sub, limit)
	}
	name := pos[0]
	c, err := newQuotaClient(f, stdout)
	if err != nil {
		return fmt.Errorf("%s: %w", sub, err)
	}
	c.prefix = ""
	switch args[0] {
	case "replay":
		v, raw, err := c.api.ReplayDead(ctx, name, ids...)
		return c.print(sub, raw, err, func() { fmt.Fprintf(c.out, "%s: %d dead letters sent again\n", name, deref(v.Replayed)) })
	case "drop":
		v, raw, err := c.api.DropDead(ctx, name, ids...)
		return c.print(sub, raw, err, func() { fmt.Fprintf(c.out, "%s: %d dead letters deleted for good\n", name, deref(v.Dropped)) })
	}
	v, raw, err := c.api.DeadLetters(ctx, name, limit)
	return c.print(sub, raw, err, func() { v.WriteText(c.out) })
}

func deref(n *int) int {
	if n == nil {
		return 0
	}
	return *n
}

// forwardDropLogCmd runs `gateway forward drop-log FORMER --data-dir
// DIR`: it deletes the messages of FORMER's forward logs in the data
// file, with the gateway stopped.
func forwardDropLogCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("drop-log", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("data-dir", config.Default().DataDir, "the gateway's data `directory`")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return subcommandHelp(stdout, "forward", "drop-log", forwardUsage, fs)
		}
		return usagef("forward drop-log: %v (run \"gateway help forward\")", err)
	}
	if len(pos) != 1 || pos[0] == "" || strings.Contains(pos[0], "/") {
		return usagef("forward drop-log: want one former entry's name, without '/' (got %q)", pos)
	}
	dropped, err := server.DropFormerLogs(*dir, pos[0])
	total := 0
	for _, d := range dropped {
		total += d.Messages + d.DeadLetters
		fmt.Fprintf(stdout, "dropped %d messages and %d dead letters of forward log %s\n", d.Messages, d.DeadLetters, d.Log)
	}
	if err != nil {
		return fmt.Errorf("forward drop-log: %w", err)
	}
	if total == 0 {
		fmt.Fprintf(stdout, "no forward log of %q holds messages or dead letters in %s\n", pos[0], *dir)
	}
	return nil
}
