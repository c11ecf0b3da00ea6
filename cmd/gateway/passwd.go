package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/devicegate/devicegate/auth"
)

// passwdFlags are the flags of gateway passwd.
type passwdFlags struct {
	file, clientIDs, role, hash string
}

func newPasswdFlags(f *passwdFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("passwd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.file, "file", "", "the credentials `file` to change (auth.credentials_file); created if missing")
	fs.StringVar(&f.clientIDs, "client-ids", "", "comma-separated `patterns` ('*', '?') of the client IDs the user may connect as (default: exactly the username)")
	fs.StringVar(&f.role, "role", "device", "`role`: device (publishes under its own prefix) or consumer (subscribes anywhere, publishes nowhere)")
	fs.StringVar(&f.hash, "hash", auth.Bcrypt, "password hash `algorithm`: bcrypt or argon2id")
	return fs
}

func printPasswdUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Usage: gateway passwd --file FILE [flags] USERNAME

Reads a password from standard input (its first line) and adds USERNAME
to the credentials file, or replaces its entry, with the password's
bcrypt or argon2id hash. The file is rewritten atomically with mode 0600.
A running gateway rereads the file on SIGHUP.

  echo "$PASSWORD" | gateway passwd --file creds sensor-17
  gateway passwd --file creds --client-ids 'sensor-*' --hash argon2id fleet < pw.txt

Flags:
`)
	printFlags(w, fs)
}

// passwd runs gateway passwd. Flags may come before or after USERNAME.
func passwd(args []string, stdin io.Reader, stdout io.Writer) error {
	var f passwdFlags
	fs := newPasswdFlags(&f)
	positional, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printPasswdUsage(stdout, fs)
		return err
	}
	if err != nil {
		return usagef("passwd: %v (run \"gateway help passwd\")", err)
	}
	switch {
	case len(positional) != 1:
		return usagef("passwd: want exactly one USERNAME (got %d arguments; run \"gateway help passwd\")", len(positional))
	case f.file == "":
		return usagef("passwd: --file is required")
	}
	role, err := auth.ParseRole(f.role)
	if err != nil {
		return usagef("passwd: --role must be device or consumer (got %q)", f.role)
	}
	e := auth.Entry{Username: positional[0], Role: role}
	if f.clientIDs != "" {
		e.ClientIDs = strings.Split(f.clientIDs, ",")
	}
	password, err := auth.ReadPassword(stdin)
	if errors.Is(err, auth.ErrEmptyPassword) || errors.Is(err, auth.ErrPasswordTooLong) {
		return fmt.Errorf("passwd: %w; nothing changed", err)
	}
	if err != nil {
		return fmt.Errorf("passwd: %w", err)
	}
	if e.Hash, err = auth.HashPassword(f.hash, []byte(password)); err != nil {
		return fmt.Errorf("passwd: %w; nothing changed", err)
	}
	if err := auth.Put(f.file, e); err != nil {
		return fmt.Errorf("passwd: %w; nothing changed", err)
	}
	ids := strings.Join(e.ClientIDs, ",")
	if ids == "" {
		ids = e.Username
	}
	fmt.Fprintf(stdout, "%s: user %q written (role %s, client IDs %s, %s)\n", f.file, e.Username, e.Role, ids, f.hash)
	return nil
}
