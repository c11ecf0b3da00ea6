package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/devicegate/devicegate/admin"
)

const reloadUsage = `Usage: gateway reload [--admin-addr A] [--token T] [--data-dir D] [--json]

Asks the running gateway to read its configuration file again and put
it in force without a restart, as SIGHUP does (POST /api/v1/reload), and
prints the keys that changed. A change to a key that needs a restart
is refused, naming each key, and a file that does not parse or validate
changes nothing: the exit status is then 1. What reloads:
docs/deployment.md, "Reloading". The admin API's address and token come
as for gateway quota.
`

// reloadCmd is `gateway reload`.
func reloadCmd(ctx context.Context, args []string, stdout io.Writer) error {
	var f quotaFlags
	fs := newQuotaFlags("reload", &f)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, reloadUsage)
			return err
		}
		return usagef("reload: %v (run \"gateway help reload\")", err)
	}
	if len(pos) > 0 {
		return usagef("reload: takes no arguments (got %q)", pos)
	}
	c, err := newQuotaClient(f, stdout)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	v, raw, err := c.api.Reload(ctx)
	if err != nil {
		return reloadError(c, err)
	}
	return c.print("reload", raw, nil, func() {
		if len(v.Changes) == 0 {
			fmt.Fprintln(c.out, "reloaded: nothing changed")
			return
		}
		fmt.Fprintf(c.out, "reloaded: %d changes\n", len(v.Changes))
		for _, ch := range v.Changes {
			fmt.Fprintf(c.out, "  %s: %q -> %q\n", ch.Key, ch.Old, ch.New)
		}
	})
}

// reloadError is a failed reload's error, named "reload:"; with --json
// it also prints the refusal as JSON on stdout, {"error": ..., "status":
// HTTP status}, status 0 when the API could not be reached, so a script
// reading stdout sees why.
func reloadError(c *quotaClient, err error) error {
	var te *admin.TransportError
	if errors.As(err, &te) {
		err = fmt.Errorf("cannot reach the admin API at %s (is the gateway running? --admin-addr or GATEWAY_ADMIN_ADDR): %w", c.api.Addr, te.Err)
	}
	if c.json {
		v := struct {
			Error  string `json:"error"`
			Status int    `json:"status"`
		}{Error: err.Error()}
		var ae *admin.APIError
		if errors.As(err, &ae) {
			v.Error, v.Status = ae.Message, ae.Status
		}
		b, _ := json.MarshalIndent(v, "", "  ")
		fmt.Fprintf(c.out, "%s\n", b)
	}
	if strings.HasPrefix(err.Error(), "reload ") {
		return err // the API's "reload refused: ..." names the command already
	}
	return fmt.Errorf("reload: %w", err)
}
