package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
)

const checkUsage = `Usage: gateway check --config FILE [--print]

Validates FILE exactly as "gateway serve --config FILE" would before it
opens the data file and binds its ports: every problem is listed with
its key and value, and the exit status is 1. The TLS certificates and
keys, the credentials file and the forward destinations' password files
are read; no port is bound, the data directory is not touched and no
destination is contacted. Exit status 0: serve would start with this
file (unless a port is taken or the data file cannot be opened).

Flags:
  --config FILE
    	the YAML configuration file to check (required)
  --print
    	print the effective configuration: every key, with the defaults
    	filled in, secrets shown as REDACTED
`

// check is `gateway check`.
func check(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "", "")
	printCfg := fs.Bool("print", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, checkUsage)
			return err
		}
		return usagef("check: %v (run \"gateway help check\")", err)
	}
	if fs.NArg() > 0 {
		return usagef("check: unexpected argument %q (run \"gateway help check\")", fs.Arg(0))
	}
	if *path == "" {
		return usagef("check: --config FILE is required")
	}
	cfg, err := serveConfig([]string{"--config", *path}, io.Discard)
	if err == nil {
		err = server.Check(cfg)
		if err != nil {
			err = config.Prefix("invalid settings (config "+*path+")", err)
		}
	}
	if err != nil {
		return err
	}
	if *printCfg {
		return cfg.Print(stdout)
	}
	fmt.Fprintf(stdout, "config %s: ok\n", *path)
	return nil
}
