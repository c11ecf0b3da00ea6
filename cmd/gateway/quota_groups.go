package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/devicegate/devicegate/admin"
)

// groups runs the group subcommands of `gateway quota`: groups, group
// NAME, set-group NAME and delete-group NAME.
func (c *quotaClient) groups(ctx context.Context, sub, name string, f quotaFlags, set map[string]bool) error {
	switch sub {
	case "groups":
		v, raw, err := c.api.Groups(ctx)
		return c.print(sub, raw, err, func() {
			tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "GROUP\tLABEL\tSOURCE\tCONNECTED\tQUOTA")
			for _, g := range v.Groups {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", orDash(g.Group), orDash(g.Label), orDash(g.Source), g.Connected, groupQuota(g.Quota))
			}
			tw.Flush()
		})
	case "group":
		v, raw, err := c.api.Group(ctx, name)
		return c.print(sub, raw, err, func() {
			tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
			row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
			row("group", orDash(v.Group))
			for i, w := range v.Quota.Windows {
				row(fmt.Sprintf("window %d", i+1), windowState(w))
			}
			if v.Quota.Enforce != nil && !*v.Quota.Enforce {
				row("enforce", "false (shadow mode: what it would refuse is let through)")
			}
			row("source", orDash(v.Source))
			if v.OverrideExpiresAt != "" {
				row("override expires at", v.OverrideExpiresAt)
			}
			row("connected", v.Connected)
			tw.Flush()
		})
	case "set-group":
		body, err := f.quotaBody(sub, set)
		if err != nil {
			return err
		}
		v, raw, err := c.api.SetGroupQuota(ctx, name, body)
		return c.print(sub, raw, err, func() {
			fmt.Fprintf(c.out, "group %s: %s", name, groupQuota(v.Quota))
			if v.OverrideExpiresAt != "" {
				fmt.Fprintf(c.out, ", until %s", v.OverrideExpiresAt)
			}
			fmt.Fprintln(c.out)
		})
	case "delete-group":
		_, raw, err := c.api.DeleteGroupQuota(ctx, name)
		return c.print(sub, raw, err, func() {
			fmt.Fprintf(c.out, "group %s: override deleted; the configured quota applies\n", name)
		})
	}
	return nil
}

// groupQuota says what a group's quota allows, and whether it is in
// shadow mode: "100 messages per 10s, shadow mode".
func groupQuota(q admin.QuotaJSON) string {
	ws := q.Windows
	if len(ws) == 0 {
		ws = []admin.WindowJSON{{Messages: q.Limit, Window: q.Window}}
	}
	s := describeWindows(ws)
	if q.Enforce != nil && !*q.Enforce {
		s += ", shadow mode"
	}
	return s
}
