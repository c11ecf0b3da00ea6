package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

const forwardUsage = `Usage:
  gateway forward status [flags]

Shows each upstream the gateway forwards to (forward: in its config):
how many of its connections are up, the messages the upstream
acknowledged since start, the messages and bytes waiting in its forward
logs and how long the oldest has waited, what never went (dropped
oldest, refused, expired), and why a connection is down. The admin
API's address and token come as for gateway quota.
`

// forwardCmd runs `gateway forward SUB ...`.
func forwardCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "status" {
		if len(args) > 0 && (wantsHelp(args[:1]) || args[0] == "help") {
			return subcommandHelp(stdout, "forward", "status", forwardUsage, newQuotaFlags("status", new(quotaFlags)))
		}
		return usagef("forward: want the subcommand status (run \"gateway help forward\")")
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
	v, raw, err := c.api.Forward(ctx)
	return c.print("forward status", raw, err, func() {
		if len(v.Upstreams) == 0 {
			fmt.Fprintln(c.out, "no upstreams: the gateway's config has no forward:")
			return
		}
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "UPSTREAM\tCONNECTED\tFORWARDED\tBACKLOG\tBACKLOG BYTES\tOLDEST\tDROPPED OLDEST\tREFUSED\tEXPIRED")
		for _, u := range v.Upstreams {
			fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\n", u.Name, u.Connected, u.Connections, u.Forwarded, u.BacklogMessages,
				u.BacklogBytes, time.Duration(u.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond), u.DroppedOldest, u.Refused, u.Expired)
		}
		tw.Flush()
		for _, u := range v.Upstreams {
			switch {
			case u.LastError != "" && u.RetryInSeconds > 0:
				fmt.Fprintf(c.out, "%s: %s (next attempt in %s)\n", u.Name, u.LastError, time.Duration(u.RetryInSeconds*float64(time.Second)).Round(time.Millisecond))
			case u.LastError != "":
				fmt.Fprintf(c.out, "%s: %s\n", u.Name, u.LastError)
			}
		}
	})
}
