package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
)

const healthUsage = `Usage: gateway health [--admin-addr A]

Asks a running gateway's GET /healthz (no token needed) and exits 0 when
it answers 200, 1 otherwise, printing the answer: the container image's
health check, which has no shell nor curl to do it. The address is
--admin-addr, else $GATEWAY_ADMIN_ADDR, else ` + "127.0.0.1:8080" + `.
`

// healthCmd is `gateway health`.
func healthCmd(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("admin-addr", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, healthUsage)
			return err
		}
		return usagef("health: %v (run \"gateway help health\")", err)
	}
	if fs.NArg() > 0 {
		return usagef("health: unexpected argument %q", fs.Arg(0))
	}
	if *addr == "" {
		*addr = os.Getenv("GATEWAY_ADMIN_ADDR")
	}
	if *addr == "" {
		*addr = config.Default().Admin.Addr
	}
	status, body, err := admin.Health(ctx, *addr)
	if errors.As(err, new(*admin.AddrError)) {
		return usagef("health: %v", err)
	}
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("health: %s answered %d: %s", *addr, status, strings.TrimSpace(body))
	}
	fmt.Fprint(stdout, body)
	return nil
}
