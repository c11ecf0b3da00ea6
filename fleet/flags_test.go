package fleet

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimulateAuthFlags: bad credential and TLS flags are refused with
// an error naming the problem; a password comes from its file or the
// environment, never from the command line.
func TestSimulateAuthFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good, twoLines, empty := write("good", "pw\n"), write("two", "pw\nother\n"), write("empty", "\n")
	notPEM := write("ca.pem", "not a certificate\n")
	t.Setenv(SimPasswordEnv, "")
	t.Setenv(SimSubPasswordEnv, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--username", "fleet", "--password-file", filepath.Join(dir, "missing")}, "--password-file: open " + filepath.Join(dir, "missing") + ": no such file"},
		{[]string{"--username", "fleet", "--password-file", twoLines}, "has more than one line"},
		{[]string{"--username", "fleet", "--password-file", empty}, "the password is empty"},
		{[]string{"--password-file", good}, "--password-file: only with --username"},
		{[]string{"--username", "fleet"}, "--username: needs --password-file or $GATEWAY_SIM_PASSWORD"},
		{[]string{"--username", "", "--password-file", good}, "--password-file: only with --username"},
		{[]string{"--sub-password-file", good}, "--sub-password-file: only with --sub-username"},
		{[]string{"--sub-username", "backend"}, "--sub-username: needs --sub-password-file or $GATEWAY_SIM_SUB_PASSWORD"},
		{[]string{"--sub-client-id", ""}, "--sub-client-id: must not be empty"},
		{[]string{"--password", "pw"}, "flag provided but not defined: -password"},
		{[]string{"--embedded", "--tls-ca", good}, "--tls-ca: only with --addr"},
		{[]string{"--tls-ca", notPEM}, "holds no PEM certificate"},
		{[]string{"--tls-ca", filepath.Join(dir, "missing")}, "--tls-ca: open"},
	} {
		_, err := ParseSimulate(tc.args)
		var u *UsageError
		if err == nil || !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}

	sim, err := ParseSimulate([]string{"--username", "fleet", "--password-file", good, "--sub-username", "backend"})
	if err == nil {
		t.Fatalf("--sub-username without a password accepted: %+v", sim.Config.Auth)
	}
	t.Setenv(SimPasswordEnv, "from-env")
	t.Setenv(SimSubPasswordEnv, "sub-from-env")
	sim, err = ParseSimulate([]string{"--username", "fleet", "--sub-username", "backend"})
	if err != nil || sim.Config.Auth.Password != "from-env" || sim.Config.Auth.SubPassword != "sub-from-env" {
		t.Fatalf("passwords from the environment: %v, %+v", err, sim.Config.Auth)
	}
	// The file wins over the environment; one trailing newline is not
	// part of the password.
	sim, err = ParseSimulate([]string{"--username", "fleet", "--password-file", good})
	if err != nil || sim.Config.Auth.Password != "pw" {
		t.Fatalf("password from the file: %v, %+v", err, sim.Config.Auth)
	}
	if _, err := ParseSimulate([]string{"--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
}

// --seed reaches the simulator (the poisson pattern's gaps); --drain 0,
// which used to mean the 2 s default without saying so, is refused.
func TestSimulateSeedAndDrainFlags(t *testing.T) {
	sim, err := ParseSimulate([]string{"--addr", "127.0.0.1:1883", "--pattern", "poisson", "--seed", "42"})
	if err != nil || sim.Config.Seed != 42 {
		t.Fatalf("--seed 42: seed %d, err %v", sim.Config.Seed, err)
	}
	if _, err := ParseSimulate([]string{"--addr", "127.0.0.1:1883", "--drain", "0"}); err == nil || !strings.Contains(err.Error(), "--drain: must be > 0") {
		t.Fatalf("--drain 0: err %v, want one naming --drain", err)
	}
}
