package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"

	"github.com/devicegate/devicegate/admin"
)

const backupUsage = `Usage: gateway backup --out FILE [--admin-addr A] [--token T] [--data-dir D]

Asks the running gateway for a consistent copy of its data file
(GET /api/v1/backup) and writes it to FILE, while the gateway goes on
serving: every window, quota override, block, deferred message and
forward log entry as of the moment of the copy. The gateway checks the
copy before it sends it; FILE appears only once the whole copy is in it
(written beside it, synced, then renamed). To restore, stop the gateway
(or start another one) with FILE as devicegate.db in an empty data
directory. The admin API's address and token come as for gateway quota.
`

// backupCmd is `gateway backup --out FILE`.
func backupCmd(ctx context.Context, args []string, stdout io.Writer) error {
	var f quotaFlags
	fs := newQuotaFlags("backup", &f)
	out := fs.String("out", "", "")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, backupUsage)
			return err
		}
		return usagef("backup: %v (run \"gateway help backup\")", err)
	}
	if len(pos) > 0 {
		return usagef("backup: takes no arguments (got %q)", pos)
	}
	if *out == "" {
		return usagef("backup: --out FILE is required")
	}
	c, err := newQuotaClient(f, stdout)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	// The copy may take longer than an API call's timeout: ctx bounds it.
	api := *c.api
	api.HTTP = &http.Client{}
	n, err := api.BackupFile(ctx, *out)
	if err != nil {
		var te *admin.TransportError
		if errors.As(err, &te) {
			return fmt.Errorf("backup: from the admin API at %s: %w", api.Addr, err)
		}
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(stdout, "backup: %d bytes written to %s\n", n, *out)
	return nil
}
