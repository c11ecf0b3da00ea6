package main

import (
	"context"
	"fmt"
)

// groups runs the group subcommands of `gateway quota`: groups, group
// NAME, set-group NAME and delete-group NAME.
func (c *quotaClient) groups(ctx context.Context, sub, name string, f quotaFlags, set map[string]bool) error {
	switch sub {
	case "groups":
		v, raw, err := c.api.Groups(ctx)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
	case "group":
		v, raw, err := c.api.Group(ctx, name)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
	case "set-group":
		body, err := f.quotaBody(sub, set)
		if err != nil {
			return err
		}
		v, raw, err := c.api.SetGroupQuota(ctx, name, body)
		return c.print(sub, raw, err, func() { v.WriteOverride(c.out, name) })
	case "delete-group":
		_, raw, err := c.api.DeleteGroupQuota(ctx, name)
		return c.print(sub, raw, err, func() {
			fmt.Fprintf(c.out, "group %s: override deleted; the configured quota applies\n", name)
		})
	}
	return nil
}
