package admin

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// The text forms of the API's answers, as `gateway quota` prints them
// without --json (docs/quotas.md shows them): a table or a line each.

// OrDash is s, or "-" when empty, for a table cell.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// WriteText writes a device's status as rows of name and value.
func (v DeviceJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("device", OrDash(v.Device))
	if len(v.Quota.Windows) > 0 {
		for i, w := range v.Quota.Windows {
			row(fmt.Sprintf("window %d", i+1), windowState(w))
		}
	} else {
		row("limit", v.Quota.Limit)
		row("window", OrDash(v.Quota.Window))
	}
	row("policy", OrDash(v.Quota.Policy))
	if b := v.Quota.Block; b != nil {
		row("block", fmt.Sprintf("after %d refusals within %s, for %s", b.After, b.Within, b.For))
	}
	if v.Quota.Enforce != nil && !*v.Quota.Enforce {
		row("enforce", "false (shadow mode: what it would refuse is let through)")
	}
	for _, cl := range v.Classes {
		ws := cl.Quota.Windows
		if len(ws) == 0 {
			ws = []WindowJSON{{Messages: cl.Quota.Limit, Window: cl.Quota.Window, Used: cl.Quota.Used, Remaining: cl.Quota.Remaining, RetryAfter: cl.Quota.RetryAfter}}
		}
		for i, w := range ws {
			row(fmt.Sprintf("class %s (%s) window %d", cl.Name, strings.Join(cl.Topics, " "), i+1), windowState(w))
		}
	}
	row("source", OrDash(v.Source))
	if v.OverrideExpiresAt != "" {
		row("override expires at", v.OverrideExpiresAt)
	}
	if v.Group != "" {
		row("group", v.Group+" (gateway quota group "+v.Group+")")
	}
	row("used", v.Used)
	row("remaining", v.Remaining)
	row("retry after", OrDash(v.RetryAfter))
	row("deferred", v.Deferred)
	if v.BlockedUntil != "" {
		row("blocked until", v.BlockedUntil+" (CONNECTs refused; gateway quota unblock "+v.Device+" lifts it)")
		if v.BlockedSince != "" {
			row("blocked since", v.BlockedSince)
		}
		if v.BlockReason != "" {
			row("block reason", v.BlockReason)
		}
	}
	row("connected", v.Connected)
	lastSeen := "-"
	switch {
	case v.LastSeen != nil:
		lastSeen = OrDash(*v.LastSeen)
	case v.neverSeen():
		lastSeen = "never: this gateway knows nothing of the device (no connection in the last 24 hours, window, deferred message or block); the quota above is the one it would get"
	}
	row("last seen", lastSeen)
	tw.Flush()
}

// neverSeen reports a device status that holds nothing of the device:
// not connected, not seen in the last 24 hours, nothing counted,
// deferred, refused or blocked.
func (v DeviceJSON) neverSeen() bool {
	return !v.Connected && v.LastSeen == nil && v.Used == 0 && v.Deferred == 0 && v.BlockedUntil == "" && len(v.Refusals) == 0
}

// WriteText writes the override set on device id as one line.
func (v OverrideJSON) WriteText(w io.Writer, id string) {
	if len(v.Windows) > 0 {
		fmt.Fprintf(w, "device %s: %s, policy %s", id, describeWindows(v.Windows), OrDash(v.Policy))
	} else {
		fmt.Fprintf(w, "device %s: %d messages per %s, policy %s", id, v.Limit, OrDash(v.Window), OrDash(v.Policy))
	}
	if v.Enforce != nil && !*v.Enforce {
		fmt.Fprint(w, ", shadow mode")
	}
	if v.ExpiresAt != "" {
		fmt.Fprintf(w, ", until %s", v.ExpiresAt)
	}
	for _, cl := range v.Classes {
		fmt.Fprintf(w, "; class %s (%s): %s", cl.Name, strings.Join(cl.Topics, " "), describeQuota(cl.Quota))
	}
	fmt.Fprintln(w)
}

// WriteText writes the overrides as a table.
func (v OverridesJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	fmt.Fprintln(tw, "DEVICE\tLIMIT\tWINDOW\tPOLICY\tENFORCE\tEXPIRES AT\tCLASSES")
	for _, o := range v.Overrides {
		enforce := "true"
		if o.Enforce != nil && !*o.Enforce {
			enforce = "false (shadow)"
		}
		classes := OrDash(joinNames(o.Classes, func(c ClassJSON) string { return c.Name }, ","))
		if len(o.Windows) > 0 {
			fmt.Fprintf(tw, "%s\t-\t%s\t%s\t%s\t%s\t%s\n", OrDash(o.Device), describeWindows(o.Windows), OrDash(o.Policy), enforce, OrDash(o.ExpiresAt), classes)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", OrDash(o.Device), o.Limit, OrDash(o.Window), OrDash(o.Policy), enforce, OrDash(o.ExpiresAt), classes)
	}
	tw.Flush()
}

// WriteText writes the devices refused most as a table.
func (v ThrottledListJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	fmt.Fprintln(tw, "DEVICE\tREFUSED")
	for _, d := range v.Devices {
		fmt.Fprintf(tw, "%s\t%d\n", OrDash(d.Device), d.Refused)
	}
	tw.Flush()
}

// WriteText writes the blocked devices as a table.
func (v BlocksJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	fmt.Fprintln(tw, "DEVICE\tBLOCKED UNTIL\tSINCE\tREASON")
	for _, b := range v.Blocks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", OrDash(b.Device), b.Until, OrDash(b.Since), OrDash(b.Reason))
	}
	tw.Flush()
}

// WriteText writes the rules and their modes as a table.
func (v RulesJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	fmt.Fprintln(tw, "RULE\tENFORCE\tCLASSES\tGROUP")
	for _, r := range v.Rules {
		classes := joinNames(r.Classes, func(c RuleClassJSON) string { return fmt.Sprintf("%s: %v", c.Name, c.Enforce) }, ", ")
		group := "-"
		if r.Group != nil {
			group = fmt.Sprintf("%s: %v (not switched with the rule)", r.Group.Name, r.Group.Enforce)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\n", r.Rule, r.Enforce, OrDash(classes), group)
	}
	tw.Flush()
}

// WriteText says what a rule switch switched (the rule's quota and its
// topic classes) and what it did not (its group).
func (v RuleJSON) WriteText(w io.Writer) {
	mode := "enforced"
	if !v.Enforce {
		mode = "in shadow mode (decided and counted, let through)"
	}
	what := "its own quota"
	if len(v.Classes) > 0 {
		what += " and its topic classes " + joinNames(v.Classes, func(c RuleClassJSON) string { return c.Name }, ", ")
	}
	fmt.Fprintf(w, "rule %s: %s until the gateway stops: %s\n", v.Rule, mode, what)
	if g := v.Group; g != nil {
		gm := "enforcing"
		if !g.Enforce {
			gm = "shadow mode"
		}
		shared := ""
		if len(g.SharedWith) > 0 {
			shared = ", shared with rules " + strings.Join(g.SharedWith, ", ")
		}
		fmt.Fprintf(w, "group %s: not switched, keeps its own mode (%s as configured%s; gateway quota set-group NAME ... [--shadow] changes one group)\n", g.Name, gm, shared)
	}
}

// WriteText writes the groups as a table.
func (v GroupListJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	fmt.Fprintln(tw, "GROUP\tLABEL\tSOURCE\tCONNECTED\tQUOTA")
	for _, g := range v.Groups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", OrDash(g.Group), OrDash(g.Label), OrDash(g.Source), g.Connected, groupQuota(g.Quota))
	}
	tw.Flush()
}

// WriteText writes a group's status as rows of name and value.
func (v GroupJSON) WriteText(w io.Writer) {
	tw := newTable(w)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("group", OrDash(v.Group))
	for i, w := range v.Quota.Windows {
		row(fmt.Sprintf("window %d", i+1), windowState(w))
	}
	if v.Quota.Enforce != nil && !*v.Quota.Enforce {
		row("enforce", "false (shadow mode: what it would refuse is let through)")
	}
	row("source", OrDash(v.Source))
	if v.OverrideExpiresAt != "" {
		row("override expires at", v.OverrideExpiresAt)
	}
	row("connected", v.Connected)
	tw.Flush()
}

// WriteOverride writes the override set on group name as one line.
func (v GroupJSON) WriteOverride(w io.Writer, name string) {
	fmt.Fprintf(w, "group %s: %s", name, groupQuota(v.Quota))
	if v.OverrideExpiresAt != "" {
		fmt.Fprintf(w, ", until %s", v.OverrideExpiresAt)
	}
	fmt.Fprintln(w)
}

// groupQuota says what a group's quota allows, and whether it is in
// shadow mode: "100 messages per 10s, shadow mode".
func groupQuota(q QuotaJSON) string {
	s := describeWindows(quotaWindows(q))
	if q.Enforce != nil && !*q.Enforce {
		s += ", shadow mode"
	}
	return s
}

// describeQuota says what a quota allows: "2 messages per 1m0s, policy
// drop".
func describeQuota(q QuotaJSON) string {
	return describeWindows(quotaWindows(q)) + ", policy " + OrDash(q.Policy)
}

// quotaWindows is q's windows, its limit and window as one when it has
// no list.
func quotaWindows(q QuotaJSON) []WindowJSON {
	if len(q.Windows) == 0 {
		return []WindowJSON{{Messages: q.Limit, Window: q.Window}}
	}
	return q.Windows
}

// describeWindows says what windows allow: "10 messages per 1m0s, 5242880
// bytes per 24h0m0s".
func describeWindows(ws []WindowJSON) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		if w.Bytes > 0 {
			parts[i] = fmt.Sprintf("%d bytes per %s", w.Bytes, w.Window)
		} else {
			parts[i] = fmt.Sprintf("%d messages per %s", w.Messages, w.Window)
		}
	}
	return strings.Join(parts, ", ")
}

// windowState is a window and its state: "10 messages per 1m0s: used 3,
// remaining 7, retry after 0s".
func windowState(w WindowJSON) string {
	s := describeWindows([]WindowJSON{w})
	if w.Used != nil && w.Remaining != nil {
		s += fmt.Sprintf(": used %d, remaining %d, retry after %s", *w.Used, *w.Remaining, OrDash(w.RetryAfter))
	}
	return s
}

// joinNames joins the names of xs with sep.
func joinNames[T any](xs []T, name func(T) string, sep string) string {
	names := make([]string, len(xs))
	for i, x := range xs {
		names[i] = name(x)
	}
	return strings.Join(names, sep)
}

// WriteText writes the upstreams as `gateway forward status` prints
// them: a table, then a line for each upstream's error, low disk and
// dead letters by reason.
func (v ForwardListJSON) WriteText(w io.Writer) {
	if len(v.Upstreams) == 0 {
		fmt.Fprintln(w, "no upstreams: the gateway's config has no forward:")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "UPSTREAM\tCONNECTED\tFORWARDED\tBACKLOG\tBACKLOG BYTES\tOLDEST\tDROPPED OLDEST\tREFUSED\tEXPIRED\tDEAD LETTERS")
	for _, u := range v.Upstreams {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\n", u.Name, u.Connected, u.Connections, u.Forwarded, u.BacklogMessages,
			u.BacklogBytes, seconds(u.OldestAgeSeconds), u.DroppedOldest, u.Refused, u.Expired, u.DeadLetters)
	}
	tw.Flush()
	for _, u := range v.Upstreams {
		switch {
		case u.LastError != "" && u.RetryInSeconds > 0:
			fmt.Fprintf(w, "%s: %s (next attempt in %s)\n", u.Name, u.LastError, seconds(u.RetryInSeconds))
		case u.LastError != "":
			fmt.Fprintf(w, "%s: %s\n", u.Name, u.LastError)
		}
		if u.LowSpace > 0 {
			fmt.Fprintf(w, "%s: %d messages refused or dropped since start: the data file's disk at its free-space floor (persist.min_free_bytes)\n", u.Name, u.LowSpace)
		}
		if len(u.DeadLettersByReason) > 0 {
			reasons := make([]string, 0, len(u.DeadLettersByReason))
			for r, n := range u.DeadLettersByReason {
				reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
			}
			sort.Strings(reasons)
			fmt.Fprintf(w, "%s: refused for good since start: %s (gateway forward dead list %s)\n", u.Name, strings.Join(reasons, ", "), u.Name)
		}
	}
}

// seconds is s seconds as a duration, to the millisecond.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}

// WriteText writes the dead letters as `gateway forward dead list`
// prints them: a table, and how many of the total it shows.
func (v DeadListJSON) WriteText(w io.Writer) {
	if v.Total == 0 {
		fmt.Fprintf(w, "%s: no dead letters\n", v.Upstream)
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tREFUSED AT\tREASON\tDEVICE\tTOPIC\tBYTES\tERROR")
	for _, d := range v.DeadLetters {
		reason := d.Reason
		if d.Damaged {
			reason = "DAMAGED " + reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, OrDash(d.RefusedAt), OrDash(reason), d.Device, d.Topic, d.PayloadBytes, d.Error)
	}
	tw.Flush()
	if v.Total > len(v.DeadLetters) {
		fmt.Fprintf(w, "%d of %d shown (--limit)\n", len(v.DeadLetters), v.Total)
	}
}
