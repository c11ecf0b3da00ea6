package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/flagvalue"
)

// quotaSubcommands are the subcommands of `gateway quota`.
const quotaSubcommands = "get, set, delete, list, reset, throttled, rules, enforce, blocks, unblock, groups, group, set-group, delete-group"

// quotaClient is what `gateway quota` knows of the admin API: the typed
// client, and how to print.
type quotaClient struct {
	api    *admin.Client
	json   bool
	out    io.Writer
	prefix string // of the subcommand in errors: "quota "
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
		v, raw, err := c.api.Device(ctx, id)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
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
		if body.Classes, err = admin.ParseClasses(f.classes, f.policy); err != nil {
			return usagef("quota set: --class: %v", err)
		}
		v, raw, err := c.api.SetQuota(ctx, id, body)
		return c.print(sub, raw, err, func() { v.WriteText(c.out, id) })
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
		v, raw, err := c.api.Quotas(ctx)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
	case "throttled":
		if f.top.V < 1 {
			return usagef("quota throttled: --limit must be at least 1 (got %d)", f.top.V)
		}
		v, raw, err := c.api.Throttled(ctx, f.top.V)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
	case "blocks":
		v, raw, err := c.api.Blocks(ctx)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
	case "unblock":
		_, raw, err := c.api.Unblock(ctx, id)
		return c.print(sub, raw, err, func() {
			fmt.Fprintf(c.out, "device %s: unblocked\n", id)
		})
	case "groups", "group", "set-group", "delete-group":
		return c.groups(ctx, sub, id, f, set)
	case "rules":
		v, raw, err := c.api.Rules(ctx)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
	case "enforce":
		enforce, err := strconv.ParseBool(pos[1])
		if err != nil {
			return usagef("quota enforce: %q is not true or false", pos[1])
		}
		v, raw, err := c.api.SetRuleEnforce(ctx, pos[0], enforce)
		return c.print(sub, raw, err, func() { v.WriteText(c.out) })
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
		ws, err := admin.ParseWindows(f.windows)
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
	api, err := admin.NewClientFor(f.adminAddr, f.token, f.dataDir)
	if err != nil {
		return nil, err
	}
	return &quotaClient{api: api, json: f.json, out: out, prefix: "quota "}, nil
}

// print prints a call's answer: the API's JSON indented with --json,
// else text; err becomes the subcommand's error, with a hint when the
// API could not be reached.
func (c *quotaClient) print(sub string, raw []byte, err error, text func()) error {
	if err != nil {
		var te *admin.TransportError
		if errors.As(err, &te) {
			return fmt.Errorf("%s%s: cannot reach the admin API at %s (is the gateway running? --admin-addr or GATEWAY_ADMIN_ADDR): %w", c.prefix, sub, c.api.Addr, te.Err)
		}
		return fmt.Errorf("%s%s: %w", c.prefix, sub, err)
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

// classFlags collects --class NAME:WINDOWS:FILTER flags
// (admin.ParseClasses reads them).
type classFlags []string

func (c *classFlags) String() string     { return strings.Join(*c, " ") }
func (c *classFlags) Set(v string) error { *c = append(*c, v); return nil }
