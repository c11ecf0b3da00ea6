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
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"devicegate/admin"
	"devicegate/config"
)

// quotaTimeout bounds one request of `gateway quota` to the admin API.
const quotaTimeout = 10 * time.Second

// quotaSubcommands are the subcommands of `gateway quota`.
const quotaSubcommands = "get, set, delete, list, reset, throttled"

// quotaClient is what `gateway quota` knows of the admin API: where it
// is, the token, and how to print.
type quotaClient struct {
	addr  string
	token string
	json  bool
	out   io.Writer
	http  *http.Client
}

// quotaFlags are the flags every quota subcommand takes, plus the ones
// of set and throttled (ignored elsewhere, rejected if given).
type quotaFlags struct {
	adminAddr string
	token     string
	dataDir   string
	json      bool

	limit     intValue
	window    durationValue
	policy    string
	expiresAt string
	forDur    durationValue
	top       intValue
}

func newQuotaFlags(sub string, f *quotaFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("quota "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.adminAddr, "admin-addr", "", "admin API `address` (default $GATEWAY_ADMIN_ADDR, else "+config.Default().Admin.Addr+")")
	fs.StringVar(&f.token, "token", "", "bearer `token` (default $GATEWAY_ADMIN_TOKEN, else the token file in --data-dir)")
	fs.StringVar(&f.dataDir, "data-dir", config.Default().DataDir, "the gateway's data `directory`, where it keeps its token file")
	fs.BoolVar(&f.json, "json", false, "print the API's JSON instead of a table")
	switch sub {
	case "set":
		fs.Var(&f.limit, "limit", "`N` messages per window (required)")
		fs.Var(&f.window, "window", "window `duration` such as 10s (required)")
		fs.StringVar(&f.policy, "policy", "", "`policy` over the limit: drop, defer or disconnect (default: the API's)")
		fs.StringVar(&f.expiresAt, "expires-at", "", "the override lapses at this RFC 3339 `time`")
		fs.Var(&f.forDur, "for", "the override lapses after this `duration` from now")
	case "throttled":
		f.top.v = 10
		fs.Var(&f.top, "limit", "show at most `N` devices")
	}
	return fs
}

const quotaUsage = `Usage:
  gateway quota get ID [flags]
  gateway quota set ID --limit N --window D [--policy P] [--expires-at RFC3339 | --for D] [flags]
  gateway quota delete ID [flags]
  gateway quota list [flags]
  gateway quota reset ID [flags]
  gateway quota throttled [--limit N] [flags]

Reads and changes per-device quotas through a running gateway's admin
API. get shows a device's quota in force, where it comes from, its use
of the current window and its deferred messages; set puts a runtime
override (kept in the data directory, so it survives restarts); delete
removes it, restoring the configured quota; list shows every override;
reset empties a device's window; throttled lists the devices refused
most in the last one to two minutes.

The API's address comes from --admin-addr, else $GATEWAY_ADMIN_ADDR, else
127.0.0.1:8080; the token from --token, else $GATEWAY_ADMIN_TOKEN, else
the token file the gateway wrote in --data-dir.
`

func printQuotaUsage(w io.Writer) {
	fmt.Fprint(w, quotaUsage)
	for _, sub := range []string{"set", "throttled"} {
		fmt.Fprintf(w, "\nFlags of %s:\n", sub)
		newQuotaFlags(sub, new(quotaFlags)).VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(w, "  --%s %s\n    \t%s\n", f.Name, name, usage)
		})
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
	wantIDs := map[string]int{"get": 1, "set": 1, "delete": 1, "list": 0, "reset": 1, "throttled": 0}
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
			printQuotaUsage(stdout)
			return err
		}
		return usagef("quota %s: %v (run \"gateway help quota\")", sub, err)
	}
	if len(pos) != n {
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
	if n == 1 {
		id = pos[0]
		if id == "" {
			return usagef("quota %s: the device ID is empty", sub)
		}
	}
	switch sub {
	case "get":
		return c.get(ctx, id)
	case "set":
		if !set["limit"] || !set["window"] {
			return usagef("quota set: --limit and --window are required")
		}
		if set["expires-at"] && set["for"] {
			return usagef("quota set: give --expires-at or --for, not both")
		}
		body := map[string]any{"limit": f.limit.v, "window": f.window.v.String()}
		if f.policy != "" {
			body["policy"] = f.policy
		}
		switch {
		case set["expires-at"]:
			body["expires_at"] = f.expiresAt
		case set["for"]:
			body["expires_at"] = time.Now().Add(f.forDur.v).UTC().Format(time.RFC3339Nano)
		}
		return c.set(ctx, id, body)
	case "delete":
		return c.simple(ctx, sub, http.MethodDelete, "/api/v1/devices/"+url.PathEscape(id)+"/quota", nil, func(m map[string]any) {
			fmt.Fprintf(c.out, "device %s: override deleted; the configured quota applies\n", id)
		})
	case "reset":
		return c.simple(ctx, sub, http.MethodPost, "/api/v1/devices/"+url.PathEscape(id)+"/reset", nil, func(m map[string]any) {
			if m["reset"] == true {
				fmt.Fprintf(c.out, "device %s: window reset\n", id)
			} else {
				fmt.Fprintf(c.out, "device %s: no window to reset\n", id)
			}
		})
	case "list":
		return c.list(ctx)
	case "throttled":
		return c.throttled(ctx, f.top.v)
	}
	return nil
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
	return &quotaClient{addr: addr, token: token, json: f.json, out: out, http: &http.Client{Timeout: quotaTimeout}}, nil
}

// do sends a request and returns the response body of a 2xx answer; any
// other answer becomes an error with the API's message and the status.
func (c *quotaClient) do(ctx context.Context, sub, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("quota %s: %w", sub, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, rd)
	if err != nil {
		return nil, fmt.Errorf("quota %s: admin address %q: %w", sub, c.addr, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("quota %s: cannot reach the admin API at %s (is the gateway running? --admin-addr or GATEWAY_ADMIN_ADDR): %w", sub, c.addr, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("quota %s: read the answer from %s: %w", sub, c.addr, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
			if e.Error == "" {
				e.Error = http.StatusText(resp.StatusCode)
			}
		}
		return nil, fmt.Errorf("quota %s: %s (HTTP %d)", sub, e.Error, resp.StatusCode)
	}
	return b, nil
}

// printJSON writes the API's answer indented.
func (c *quotaClient) printJSON(b []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return fmt.Errorf("the admin API answered something other than JSON: %q", b)
	}
	buf.WriteByte('\n')
	_, err := c.out.Write(buf.Bytes())
	return err
}

// decode reads an answer into an ordered-agnostic map, numbers kept as
// written.
func decode(b []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("the admin API answered something other than a JSON object: %q", b)
	}
	return m, nil
}

// show formats a JSON value for a table cell; absent is "-".
func show(v any) string {
	switch v := v.(type) {
	case nil:
		return "-"
	case string:
		if v == "" {
			return "-"
		}
		return v
	case json.Number:
		return v.String()
	case bool:
		return strconv.FormatBool(v)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func (c *quotaClient) simple(ctx context.Context, sub, method, path string, body any, text func(map[string]any)) error {
	b, err := c.do(ctx, sub, method, path, body)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(b)
	}
	m, err := decode(b)
	if err != nil {
		return fmt.Errorf("quota %s: %w", sub, err)
	}
	text(m)
	return nil
}

func (c *quotaClient) get(ctx context.Context, id string) error {
	return c.simple(ctx, "get", http.MethodGet, "/api/v1/devices/"+url.PathEscape(id), nil, func(m map[string]any) {
		q, _ := m["quota"].(map[string]any)
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%s\n", k, show(v)) }
		row("device", m["device"])
		row("limit", q["limit"])
		row("window", q["window"])
		row("policy", q["policy"])
		row("source", m["source"])
		if _, ok := m["override_expires_at"]; ok {
			row("override expires at", m["override_expires_at"])
		}
		row("used", m["used"])
		row("remaining", m["remaining"])
		row("retry after", m["retry_after"])
		row("deferred", m["deferred"])
		row("connected", m["connected"])
		row("last seen", m["last_seen"])
		tw.Flush()
	})
}

func (c *quotaClient) set(ctx context.Context, id string, body map[string]any) error {
	return c.simple(ctx, "set", http.MethodPut, "/api/v1/devices/"+url.PathEscape(id)+"/quota", body, func(m map[string]any) {
		fmt.Fprintf(c.out, "device %s: %s messages per %s, policy %s", id, show(m["limit"]), show(m["window"]), show(m["policy"]))
		if e, ok := m["expires_at"]; ok && e != nil {
			fmt.Fprintf(c.out, ", until %s", show(e))
		}
		fmt.Fprintln(c.out)
	})
}

func (c *quotaClient) list(ctx context.Context) error {
	return c.simple(ctx, "list", http.MethodGet, "/api/v1/quotas", nil, func(m map[string]any) {
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tLIMIT\tWINDOW\tPOLICY\tEXPIRES AT")
		list, _ := m["overrides"].([]any)
		for _, o := range list {
			o, _ := o.(map[string]any)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", show(o["device"]), show(o["limit"]), show(o["window"]), show(o["policy"]), show(o["expires_at"]))
		}
		tw.Flush()
	})
}

func (c *quotaClient) throttled(ctx context.Context, n int) error {
	if n < 1 {
		return usagef("quota throttled: --limit must be at least 1 (got %d)", n)
	}
	return c.simple(ctx, "throttled", http.MethodGet, "/api/v1/throttled?limit="+strconv.Itoa(n), nil, func(m map[string]any) {
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tREFUSED")
		list, _ := m["devices"].([]any)
		for _, d := range list {
			d, _ := d.(map[string]any)
			fmt.Fprintf(tw, "%s\t%s\n", show(d["device"]), show(d["refused"]))
		}
		tw.Flush()
	})
}

// tokenFilePath is where the gateway keeps the admin token it created
// in dataDir.
func tokenFilePath(dataDir string) string {
	return filepath.Join(dataDir, admin.TokenFile)
}
