package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/flagvalue"
)

// quotaTimeout bounds one request of `gateway quota` to the admin API.
const quotaTimeout = 10 * time.Second

// quotaSubcommands are the subcommands of `gateway quota`.
const quotaSubcommands = "get, set, delete, list, reset, throttled, rules, enforce, blocks, unblock, groups, group, set-group, delete-group"

// quotaClient is what `gateway quota` knows of the admin API: the typed
// client, and how to print.
type quotaClient struct {
	api  *admin.Client
	json bool
	out  io.Writer
}

// quotaFlags are the flags every quota subcommand takes, plus the ones
// of set and throttled (ignored elsewhere, rejected if given).
type quotaFlags struct {
	adminAddr string
	token     string
	dataDir   string
	json      bool

	limit     flagvalue.Int
	window    flagvalue.Duration
	windows   string
	classes   classFlags
	shadow    bool
	feedback  string
	policy    string
	expiresAt string
	forDur    flagvalue.Duration
	top       flagvalue.Int
}

func newQuotaFlags(sub string, f *quotaFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("quota "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.adminAddr, "admin-addr", "", "admin API `address` (default $GATEWAY_ADMIN_ADDR, else "+config.Default().Admin.Addr+")")
	fs.StringVar(&f.token, "token", "", "bearer `token` (default $GATEWAY_ADMIN_TOKEN, else the token file in --data-dir)")
	fs.StringVar(&f.dataDir, "data-dir", config.Default().DataDir, "the gateway's data `directory`, where it keeps its token file")
	fs.BoolVar(&f.json, "json", false, "print the API's JSON instead of a table")
	switch sub {
	case "set-group":
		fs.Var(&f.limit, "limit", "`N` messages per window (required, unless --windows)")
		fs.Var(&f.window, "window", "window `duration` such as 10s (required, unless --windows)")
		fs.StringVar(&f.windows, "windows", "", "instead of --limit and --window, several `windows`, as for set")
		fs.BoolVar(&f.shadow, "shadow", false, "shadow mode: the group's windows decide and count, and what they would refuse is let through")
		fs.StringVar(&f.expiresAt, "expires-at", "", "the override lapses at this RFC 3339 `time`")
		fs.Var(&f.forDur, "for", "the override lapses after this `duration` from now")
	case "set":
		fs.Var(&f.limit, "limit", "`N` messages per window (required, unless --windows)")
		fs.Var(&f.window, "window", "window `duration` such as 10s (required, unless --windows)")
		fs.StringVar(&f.windows, "windows", "", "instead of --limit and --window, several `windows`: N/DURATION for N messages, SIZE/DURATION for bytes (SIZE with a unit: B, KiB, MiB, GiB), comma-separated, e.g. 10/1m,1000/24h,5MiB/24h")
		fs.Var(&f.classes, "class", "a topic `class` of the override, NAME:WINDOWS:FILTER (WINDOWS as --windows), e.g. alarms:2/1m:devices/+/alarm/#; repeat for more filters of a class (same NAME and WINDOWS) and for more classes; the override's classes replace the device's rule's; each class takes --policy")
		fs.StringVar(&f.policy, "policy", "", "`policy` over the limit: drop, defer or disconnect (default: the API's)")
		fs.BoolVar(&f.shadow, "shadow", false, "shadow mode: the override's quota is decided and counted, and what it would refuse is let through (counted as would-refuse)")
		fs.StringVar(&f.feedback, "feedback", "", "when the device's MQTT 5 acks carry its standing: off, refusals, always or \"below N%\" (default: the API's, below 25%); its classes take it too")
		fs.StringVar(&f.expiresAt, "expires-at", "", "the override lapses at this RFC 3339 `time`")
		fs.Var(&f.forDur, "for", "the override lapses after this `duration` from now")
	case "throttled":
		f.top.V = 10
		fs.Var(&f.top, "limit", "show at most `N` devices")
	}
	return fs
}

const quotaUsage = `Usage:
  gateway quota get ID [flags]
  gateway quota set ID (--limit N --window D | --windows W) [--class C]... [--policy P] [--shadow] [--feedback F] [--expires-at RFC3339 | --for D] [flags]
  gateway quota delete ID [flags]
  gateway quota list [flags]
  gateway quota reset ID [flags]
  gateway quota throttled [--limit N] [flags]
  gateway quota rules [flags]
  gateway quota blocks [flags]
  gateway quota unblock ID [flags]
  gateway quota enforce RULE true|false [flags]
  gateway quota groups [flags]
  gateway quota group NAME [flags]
  gateway quota set-group NAME (--limit N --window D | --windows W) [--shadow] [--expires-at RFC3339 | --for D] [flags]
  gateway quota delete-group NAME [flags]

Reads and changes per-device quotas through a running gateway's admin
API. get shows a device's quota in force, where it comes from, its use
of the current window and its deferred messages; set puts a runtime
override (kept in the data directory, so it survives restarts); delete
removes it, restoring the configured quota; list shows every override;
reset empties a device's window; throttled lists the devices refused
most in the last one to two minutes; rules lists the configured rules
and whether each is enforced; enforce switches a rule (its own quota
and its topic classes, not its group) between enforcing and shadow mode
until the gateway stops; blocks lists the devices blocked by automatic
blocking, with when and why; unblock lifts a device's block. groups
lists the groups (tenants) the gateway knows, group shows a group's
windows, shared by all its devices; set-group overrides a group's
quota, delete-group removes that override.

The API's address comes from --admin-addr, else $GATEWAY_ADMIN_ADDR, else
127.0.0.1:8080; the token from --token, else $GATEWAY_ADMIN_TOKEN, else
the token file the gateway wrote in --data-dir.
`

func printQuotaUsage(w io.Writer) {
	fmt.Fprint(w, quotaUsage)
	for _, sub := range []string{"set", "set-group", "throttled"} {
		fmt.Fprintf(w, "\nFlags of %s:\n", sub)
		printFlags(w, newQuotaFlags(sub, new(quotaFlags)))
	}
}

// parseInterleaved parses flags that may come before or after the
// positional arguments ("set dev-1 --limit 5") and returns those.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// quota runs `gateway quota SUB ...`.
func quota(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usagef("quota: missing subcommand; subcommands are %s (run \"gateway help quota\")", quotaSubcommands)
	}
	sub, rest := args[0], args[1:]
	wantIDs := map[string]int{"get": 1, "set": 1, "delete": 1, "list": 0, "reset": 1, "throttled": 0, "rules": 0, "enforce": 2, "blocks": 0, "unblock": 1,
		"groups": 0, "group": 1, "set-group": 1, "delete-group": 1}
	n, ok := wantIDs[sub]
	if !ok {
		if sub == "-h" || sub == "--help" || sub == "help" {
			printQuotaUsage(stdout)
			return flag.ErrHelp
		}
		return usagef("quota: unknown subcommand %q; subcommands are %s", sub, quotaSubcommands)
	}
	var f quotaFlags
	fs := newQuotaFlags(sub, &f)
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return subcommandHelp(stdout, "quota", sub, quotaUsage, fs)
		}
		return usagef("quota %s: %v (run \"gateway help quota\")", sub, err)
	}
	if len(pos) != n {
		if sub == "enforce" {
			return usagef("quota enforce: want a rule name and true or false (got %d arguments)", len(pos))
		}
		if n == 1 && strings.Contains(sub, "group") {
			return usagef("quota %s: want one group name (got %d arguments)", sub, len(pos))
		}
		if n == 1 {
			return usagef("quota %s: want one device ID (got %d arguments)", sub, len(pos))
		}
		return usagef("quota %s: takes no arguments (got %q)", sub, pos)
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })

	c, err := newQuotaClient(f, stdout)
	if err != nil {
		return fmt.Errorf("quota %s: %w", sub, err)
	}
	var id string
	if n == 1 && sub != "enforce" {
		id = pos[0]
		if id == "" && strings.Contains(sub, "group") {
			return usagef("quota %s: the group name is empty", sub)
		}
		if id == "" {
			return usagef("quota %s: the device ID is empty", sub)
		}
	}
	switch sub {
	case "get":
		return c.get(ctx, id)
	case "set":
		body, err := f.quotaBody(sub, set)
		if err != nil {
			return err
		}
		body.Policy = f.policy
		if f.feedback != "" {
			if _, err := devicelimit.ParseFeedback(f.feedback); err != nil {
				return usagef("quota set: --feedback must be off, refusals, always or \"below N%%\" with N from 1 to 100 (got %q)", f.feedback)
			}
			body.Feedback = f.feedback
		}
		if body.Classes, err = f.classes.json(f.policy); err != nil {
			return usagef("quota set: --class: %v", err)
		}
		return c.set(ctx, id, body)
	case "delete":
		_, raw, err := c.api.DeleteQuota(ctx, id)
		return c.print(sub, raw, err, func() {
			fmt.Fprintf(c.out, "device %s: override deleted; the configured quota applies\n", id)
		})
	case "reset":
		v, raw, err := c.api.Reset(ctx, id)
		return c.print(sub, raw, err, func() {
			if v.Reset {
				fmt.Fprintf(c.out, "device %s: window reset\n", id)
			} else {
				fmt.Fprintf(c.out, "device %s: no window to reset\n", id)
			}
		})
	case "list":
		return c.list(ctx)
	case "throttled":
		return c.throttled(ctx, f.top.V)
	case "blocks":
		v, raw, err := c.api.Blocks(ctx)
		return c.print(sub, raw, err, func() {
			tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "DEVICE\tBLOCKED UNTIL\tSINCE\tREASON")
			for _, b := range v.Blocks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", orDash(b.Device), b.Until, orDash(b.Since), orDash(b.Reason))
			}
			tw.Flush()
		})
	case "unblock":
		_, raw, err := c.api.Unblock(ctx, id)
		return c.print(sub, raw, err, func() {
			fmt.Fprintf(c.out, "device %s: unblocked\n", id)
		})
	case "groups", "group", "set-group", "delete-group":
		return c.groups(ctx, sub, id, f, set)
	case "rules":
		v, raw, err := c.api.Rules(ctx)
		return c.print(sub, raw, err, func() {
			tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "RULE\tENFORCE\tCLASSES\tGROUP")
			for _, r := range v.Rules {
				classes := joinNames(r.Classes, func(c admin.RuleClassJSON) string { return fmt.Sprintf("%s: %v", c.Name, c.Enforce) }, ", ")
				group := "-"
				if r.Group != nil {
					group = fmt.Sprintf("%s: %v (not switched with the rule)", r.Group.Name, r.Group.Enforce)
				}
				fmt.Fprintf(tw, "%s\t%v\t%s\t%s\n", r.Rule, r.Enforce, orDash(classes), group)
			}
			tw.Flush()
		})
	case "enforce":
		enforce, err := strconv.ParseBool(pos[1])
		if err != nil {
			return usagef("quota enforce: %q is not true or false", pos[1])
		}
		v, raw, err := c.api.SetRuleEnforce(ctx, pos[0], enforce)
		return c.print(sub, raw, err, func() { printRuleSwitch(c.out, v) })
	}
	return nil
}

// quotaBody builds the quota of set and set-group from the flags:
// --limit and --window or --windows, --shadow, --expires-at or --for.
func (f *quotaFlags) quotaBody(sub string, set map[string]bool) (admin.SetQuotaJSON, error) {
	var body admin.SetQuotaJSON
	switch {
	case set["windows"] && (set["limit"] || set["window"]):
		return body, usagef("quota %s: give --limit and --window, or --windows, not both", sub)
	case set["windows"]:
		ws, err := parseWindowsFlag(f.windows)
		if err != nil {
			return body, usagef("quota %s: --windows: %v", sub, err)
		}
		body.Windows = ws
	case !set["limit"] || !set["window"]:
		return body, usagef("quota %s: --limit and --window are required (or --windows)", sub)
	default:
		body.Limit, body.Window = f.limit.V, f.window.V.String()
	}
	if set["expires-at"] && set["for"] {
		return body, usagef("quota %s: give --expires-at or --for, not both", sub)
	}
	if f.shadow {
		body.Enforce = new(bool) // false
	}
	switch {
	case set["expires-at"]:
		body.ExpiresAt = f.expiresAt
	case set["for"]:
		body.ExpiresAt = time.Now().Add(f.forDur.V).UTC().Format(time.RFC3339Nano)
	}
	return body, nil
}

func newQuotaClient(f quotaFlags, out io.Writer) (*quotaClient, error) {
	addr := f.adminAddr
	if addr == "" {
		addr = os.Getenv("GATEWAY_ADMIN_ADDR")
	}
	if addr == "" {
		addr = config.Default().Admin.Addr
	}
	token := f.token
	if token == "" {
		token = os.Getenv("GATEWAY_ADMIN_TOKEN")
	}
	if token == "" {
		path := tokenFilePath(f.dataDir)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("no token: give --token or GATEWAY_ADMIN_TOKEN, or --data-dir of the gateway (%w)", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return &quotaClient{api: newAdminClient(addr, token), json: f.json, out: out}, nil
}

// newAdminClient is the admin API client of `gateway quota` and the
// simulator.
func newAdminClient(addr, token string) *admin.Client {
	return &admin.Client{Addr: addr, Token: token, HTTP: &http.Client{Timeout: quotaTimeout}}
}

// print prints a call's answer: the API's JSON indented with --json,
// else text; err becomes the subcommand's error, with a hint when the
// API could not be reached.
func (c *quotaClient) print(sub string, raw []byte, err error, text func()) error {
	if err != nil {
		var te *admin.TransportError
		if errors.As(err, &te) {
			return fmt.Errorf("quota %s: cannot reach the admin API at %s (is the gateway running? --admin-addr or GATEWAY_ADMIN_ADDR): %w", sub, c.api.Addr, te.Err)
		}
		return fmt.Errorf("quota %s: %w", sub, err)
	}
	if c.json {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("the admin API answered something other than JSON: %q", raw)
		}
		buf.WriteByte('\n')
		_, err := c.out.Write(buf.Bytes())
		return err
	}
	text()
	return nil
}

// orDash is s, or "-" when empty, for a table cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (c *quotaClient) get(ctx context.Context, id string) error {
	v, raw, err := c.api.Device(ctx, id)
	return c.print("get", raw, err, func() {
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
		row("device", orDash(v.Device))
		if len(v.Quota.Windows) > 0 {
			for i, w := range v.Quota.Windows {
				row(fmt.Sprintf("window %d", i+1), windowState(w))
			}
		} else {
			row("limit", v.Quota.Limit)
			row("window", orDash(v.Quota.Window))
		}
		row("policy", orDash(v.Quota.Policy))
		if b := v.Quota.Block; b != nil {
			row("block", fmt.Sprintf("after %d refusals within %s, for %s", b.After, b.Within, b.For))
		}
		if v.Quota.Enforce != nil && !*v.Quota.Enforce {
			row("enforce", "false (shadow mode: what it would refuse is let through)")
		}
		for _, cl := range v.Classes {
			ws := cl.Quota.Windows
			if len(ws) == 0 {
				ws = []admin.WindowJSON{{Messages: cl.Quota.Limit, Window: cl.Quota.Window, Used: cl.Quota.Used, Remaining: cl.Quota.Remaining, RetryAfter: cl.Quota.RetryAfter}}
			}
			for i, w := range ws {
				row(fmt.Sprintf("class %s (%s) window %d", cl.Name, strings.Join(cl.Topics, " "), i+1), windowState(w))
			}
		}
		row("source", orDash(v.Source))
		if v.OverrideExpiresAt != "" {
			row("override expires at", v.OverrideExpiresAt)
		}
		if v.Group != "" {
			row("group", v.Group+" (gateway quota group "+v.Group+")")
		}
		row("used", v.Used)
		row("remaining", v.Remaining)
		row("retry after", orDash(v.RetryAfter))
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
			lastSeen = orDash(*v.LastSeen)
		case neverSeen(v):
			lastSeen = "never: this gateway knows nothing of the device (no connection in the last 24 hours, window, deferred message or block); the quota above is the one it would get"
		}
		row("last seen", lastSeen)
		tw.Flush()
	})
}

// neverSeen reports a device status that holds nothing of the device:
// not connected, not seen in the last 24 hours, nothing counted,
// deferred, refused or blocked.
func neverSeen(v admin.DeviceJSON) bool {
	return !v.Connected && v.LastSeen == nil && v.Used == 0 && v.Deferred == 0 && v.BlockedUntil == "" && len(v.Refusals) == 0
}

func (c *quotaClient) set(ctx context.Context, id string, body admin.SetQuotaJSON) error {
	v, raw, err := c.api.SetQuota(ctx, id, body)
	return c.print("set", raw, err, func() {
		if len(v.Windows) > 0 {
			fmt.Fprintf(c.out, "device %s: %s, policy %s", id, describeWindows(v.Windows), orDash(v.Policy))
		} else {
			fmt.Fprintf(c.out, "device %s: %d messages per %s, policy %s", id, v.Limit, orDash(v.Window), orDash(v.Policy))
		}
		if v.Enforce != nil && !*v.Enforce {
			fmt.Fprint(c.out, ", shadow mode")
		}
		if v.ExpiresAt != "" {
			fmt.Fprintf(c.out, ", until %s", v.ExpiresAt)
		}
		for _, cl := range v.Classes {
			fmt.Fprintf(c.out, "; class %s (%s): %s", cl.Name, strings.Join(cl.Topics, " "), describeQuota(cl.Quota))
		}
		fmt.Fprintln(c.out)
	})
}

func (c *quotaClient) list(ctx context.Context) error {
	v, raw, err := c.api.Quotas(ctx)
	return c.print("list", raw, err, func() {
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tLIMIT\tWINDOW\tPOLICY\tENFORCE\tEXPIRES AT\tCLASSES")
		for _, o := range v.Overrides {
			enforce := "true"
			if o.Enforce != nil && !*o.Enforce {
				enforce = "false (shadow)"
			}
			classes := orDash(joinNames(o.Classes, func(c admin.ClassJSON) string { return c.Name }, ","))
			if len(o.Windows) > 0 {
				fmt.Fprintf(tw, "%s\t-\t%s\t%s\t%s\t%s\t%s\n", orDash(o.Device), describeWindows(o.Windows), orDash(o.Policy), enforce, orDash(o.ExpiresAt), classes)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", orDash(o.Device), o.Limit, orDash(o.Window), orDash(o.Policy), enforce, orDash(o.ExpiresAt), classes)
		}
		tw.Flush()
	})
}

func (c *quotaClient) throttled(ctx context.Context, n int) error {
	if n < 1 {
		return usagef("quota throttled: --limit must be at least 1 (got %d)", n)
	}
	v, raw, err := c.api.Throttled(ctx, n)
	return c.print("throttled", raw, err, func() {
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tREFUSED")
		for _, d := range v.Devices {
			fmt.Fprintf(tw, "%s\t%d\n", orDash(d.Device), d.Refused)
		}
		tw.Flush()
	})
}

// tokenFilePath is where the gateway keeps the admin token it created
// in dataDir.
func tokenFilePath(dataDir string) string {
	return filepath.Join(dataDir, admin.TokenFile)
}

// parseWindowsFlag reads --windows: N/DURATION (messages) or
// SIZE/DURATION (bytes, SIZE with a unit), comma-separated.
func parseWindowsFlag(s string) ([]admin.WindowJSON, error) {
	ls, err := devicelimit.ParseLimits(s, ",")
	if err != nil {
		return nil, err
	}
	return admin.WindowsJSON(ls), nil
}

// classFlags collects --class NAME:WINDOWS:FILTER flags.
type classFlags []string

func (c *classFlags) String() string     { return strings.Join(*c, " ") }
func (c *classFlags) Set(v string) error { *c = append(*c, v); return nil }

// json returns the classes in the admin API's terms, in the order their
// names first appear; a class's policy is the override's.
func (c classFlags) json(policy string) ([]admin.SetClassJSON, error) {
	var out []admin.SetClassJSON
	at := map[string]int{}
	spec := map[string]string{}
	for _, v := range c {
		name, rest, ok1 := strings.Cut(v, ":")
		windows, filter, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || name == "" || filter == "" {
			return nil, fmt.Errorf("%q is not NAME:WINDOWS:FILTER, such as alarms:2/1m:devices/+/alarm/#", v)
		}
		if i, seen := at[name]; seen {
			if spec[name] != windows {
				return nil, fmt.Errorf("class %q: windows %q, and %q in an earlier --class", name, windows, spec[name])
			}
			out[i].Topics = append(out[i].Topics, filter)
			continue
		}
		ls, err := devicelimit.ParseLimits(windows, ",")
		if err != nil {
			return nil, fmt.Errorf("class %q: %v", name, err)
		}
		q := admin.SetQuotaJSON{Windows: admin.WindowsJSON(ls), Policy: policy}
		if len(ls) == 1 && ls[0].Unit == devicelimit.Messages {
			q = admin.SetQuotaJSON{Limit: ls[0].N, Window: ls[0].Window.String(), Policy: policy}
		}
		at[name], spec[name] = len(out), windows
		out = append(out, admin.SetClassJSON{Name: name, Topics: []string{filter}, Quota: q})
	}
	return out, nil
}

// describeQuota says what a quota allows: "2 messages per 1m0s, policy
// drop".
func describeQuota(q admin.QuotaJSON) string {
	ws := q.Windows
	if len(ws) == 0 {
		ws = []admin.WindowJSON{{Messages: q.Limit, Window: q.Window}}
	}
	return describeWindows(ws) + ", policy " + orDash(q.Policy)
}

// describeWindows says what windows allow: "10 messages per 1m0s, 5242880
// bytes per 24h0m0s".
func describeWindows(ws []admin.WindowJSON) string {
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
func windowState(w admin.WindowJSON) string {
	s := describeWindows([]admin.WindowJSON{w})
	if w.Used != nil && w.Remaining != nil {
		s += fmt.Sprintf(": used %d, remaining %d, retry after %s", *w.Used, *w.Remaining, orDash(w.RetryAfter))
	}
	return s
}

// printRuleSwitch says what a rule switch switched (the rule's quota
// and its topic classes) and what it did not (its group).
func printRuleSwitch(out io.Writer, v admin.RuleJSON) {
	mode := "enforced"
	if !v.Enforce {
		mode = "in shadow mode (decided and counted, let through)"
	}
	what := "its own quota"
	if len(v.Classes) > 0 {
		what += " and its topic classes " + joinNames(v.Classes, func(c admin.RuleClassJSON) string { return c.Name }, ", ")
	}
	fmt.Fprintf(out, "rule %s: %s until the gateway stops: %s\n", v.Rule, mode, what)
	if g := v.Group; g != nil {
		gm := "enforcing"
		if !g.Enforce {
			gm = "shadow mode"
		}
		shared := ""
		if len(g.SharedWith) > 0 {
			shared = ", shared with rules " + strings.Join(g.SharedWith, ", ")
		}
		fmt.Fprintf(out, "group %s: not switched, keeps its own mode (%s as configured%s; gateway quota set-group NAME ... [--shadow] changes one group)\n", g.Name, gm, shared)
	}
}

// joinNames joins the names of xs with sep.
func joinNames[T any](xs []T, name func(T) string, sep string) string {
	names := make([]string, len(xs))
	for i, x := range xs {
		names[i] = name(x)
	}
	return strings.Join(names, sep)
}
