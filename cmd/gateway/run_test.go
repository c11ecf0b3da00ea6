package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
	"log/slog"

	"github.com/devicegate/devicegate/devicelimit"
)

func TestRunArgs(t *testing.T) {
	// The quota cases must not see an operator's settings.
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	tests := []struct {
		args   []string
		code   int    // exitCode of the error
		out    string // in stdout
		errMsg string // in the error
	}{
		{args: []string{"help"}, out: `Run "gateway help serve"`},
		{args: []string{"help", "serve"}, out: "--mqtt-addr address"},
		{args: []string{"help", "serve"}, out: "--data-dir directory"},
		{args: []string{"help", "serve"}, out: "--snapshot-interval duration"},
		{args: []string{"help", "version"}, out: "Usage: gateway version"},
		{args: []string{"help", "nope"}, code: 2, errMsg: `help: unknown command "nope"`},
		{args: []string{"version"}, out: "devicegate "},
		{args: []string{"version", "--short"}, code: 2, errMsg: "version takes no arguments"},
		{args: []string{"--version"}, out: "devicegate "},
		{args: []string{"help", "check"}, out: "Usage: gateway check --config FILE [--print]"},
		{args: []string{"help", "reload"}, out: "Usage: gateway reload"},
		{args: []string{"help", "backup"}, out: "Usage: gateway backup --out FILE"},
		{args: []string{"help", "health"}, out: "Usage: gateway health"},
		{args: []string{"reload", "x"}, code: 2, errMsg: `reload: takes no arguments (got ["x"])`},
		{args: []string{"bogus"}, code: 2, errMsg: `unknown command "bogus"; commands are serve, quota, forward, simulate, passwd, check, reload, backup, health, version, help`},
		{args: []string{"help", "quota"}, out: "gateway quota set ID (--limit N --window D | --windows W) [--class C]..."},
		{args: []string{"help", "serve"}, out: "--admin-addr address"},
		{args: []string{"quota"}, code: 2, errMsg: "quota: missing subcommand; subcommands are get, set, delete, list, reset, throttled"},
		{args: []string{"quota", "bump", "x"}, code: 2, errMsg: `quota: unknown subcommand "bump"`},
		{args: []string{"quota", "get"}, code: 2, errMsg: "quota get: want one device ID (got 0 arguments)"},
		{args: []string{"quota", "list", "x", "--token", "t"}, code: 2, errMsg: `quota list: takes no arguments (got ["x"])`},
		{args: []string{"quota", "set", "d", "--limit", "5", "--token", "t"}, code: 2, errMsg: "quota set: --limit and --window are required"},
		{args: []string{"quota", "set", "d", "--token", "t", "--limit", "5", "--window", "1s", "--for", "1m", "--expires-at", "2030-01-01T00:00:00Z"}, code: 2, errMsg: "quota set: give --expires-at or --for, not both"},
		{args: []string{"quota", "set", "d", "--token", "t", "--limit", "5", "--window", "1s", "--feedback", "sometimes"}, code: 2, errMsg: `quota set: --feedback must be off, refusals, always or "below N%" with N from 1 to 100 (got "sometimes")`},
		{args: []string{"quota", "set", "d", "--limit", "five"}, code: 2, errMsg: `invalid value "five" for flag -limit: must be an integer`},
		{args: []string{"quota", "get", "d", "--data-dir", "/nonexistent"}, code: 1, errMsg: "quota get: no token: give --token or GATEWAY_ADMIN_TOKEN, or --data-dir of the gateway"},
		{args: []string{"quota", "get", "d", "--token", "t", "--admin-addr", "127.0.0.1:1"}, code: 1, errMsg: "quota get: cannot reach the admin API at 127.0.0.1:1"},
		{args: []string{"serve", "extra"}, code: 2, errMsg: `serve: unexpected argument "extra"`},
		{args: []string{"serve", "-h"}, out: "Usage: gateway serve [flags]"},
		{args: []string{"--help"}, out: "Flags of serve, the default command:"},
		{args: []string{"--limit", "x"}, code: 2, errMsg: `invalid value "x" for flag -limit: must be an integer`},
		{args: []string{"serve", "--nope"}, code: 2, errMsg: "flag provided but not defined: -nope"},
		{args: []string{"--limit", "0"}, code: 1, errMsg: "--limit: must be between 1 and 1000000000 (got 0)"},
		{args: []string{"serve", "--config", "/nonexistent.yaml"}, code: 1, errMsg: "/nonexistent.yaml"},
		{args: []string{"--snapshot-interval", "0s"}, code: 1, errMsg: `--snapshot-interval: must be > 0 (got "0s")`},
		{args: []string{"--snapshot-interval", "soon"}, code: 2, errMsg: `invalid value "soon" for flag -snapshot-interval: must be a duration like "10s"`},
		{args: []string{"--data-dir", ""}, code: 1, errMsg: `--data-dir: must name a directory (got "")`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			var report bytes.Buffer
			if code := exitCode(err, &report); code != tt.code {
				t.Fatalf("exit code %d, want %d (err %v)", code, tt.code, err)
			}
			if tt.errMsg != "" && (err == nil || !strings.Contains(err.Error(), tt.errMsg)) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.errMsg)
			}
			if !strings.Contains(stdout.String(), tt.out) {
				t.Fatalf("stdout %q lacks %q", stdout.String(), tt.out)
			}
			if stderr.Len() > 0 {
				t.Fatalf("run wrote to stderr: %q", stderr.String())
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		err    error
		code   int
		report string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{errors.New("boom"), 1, "gateway: boom\n"},
		{usagef("bad %s", "flag"), 2, "gateway: bad flag\n"},
		{config.Prefix("invalid settings", errors.Join(errors.New("a: x"), errors.New("b: y"))), 1,
			"gateway: invalid settings:\n  a: x\n  b: y\n"},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		if code := exitCode(tt.err, &b); code != tt.code || b.String() != tt.report {
			t.Errorf("exitCode(%v) = %d, %q; want %d, %q", tt.err, code, b.String(), tt.code, tt.report)
		}
	}
}

func TestVersionString(t *testing.T) {
	// Without -ldflags, as in this test binary: the module version or "dev".
	if got := buildVersion().String(); !regexp.MustCompile(`^devicegate \S+ \(go1\.\d+\S* \w+/\w+`).MatchString(got) {
		t.Fatalf("version = %q", got)
	}
	old := version
	t.Cleanup(func() { version = old })
	version = "v1.2.3"
	if got := buildVersion().String(); !strings.HasPrefix(got, "devicegate v1.2.3 (go1.") {
		t.Fatalf("version = %q, want the -ldflags version", got)
	}
	v := versionInfo{Version: "v1.2.3", Revision: "abc", Time: "2026-01-02T03:04:05Z", Modified: true, Go: "go1.26.0", Platform: "linux/arm/v7"}
	if got, want := v.String(), "devicegate v1.2.3 (go1.26.0 linux/arm/v7)\nrevision abc (modified)\ntime 2026-01-02T03:04:05Z\n"; got != want {
		t.Fatalf("version = %q, want %q", got, want)
	}
}

func TestServeConfig(t *testing.T) {
	file := writeConfig(t, `
mqtt: {tcp: "127.0.0.1:1999"}
data_dir: /var/lib/gw
persist: {snapshot_interval: 5s}
limits:
  default: {limit: 5, window: 2s}
  buckets: 10
  rules: [{match: {username: u}}]
log: {level: warn}
`)
	fromFile := config.Default()
	fromFile.MQTT.TCP = "127.0.0.1:1999"
	fromFile.DataDir = "/var/lib/gw"
	fromFile.Persist.SnapshotInterval = config.Duration(5 * time.Second)
	fromFile.Limits.Default = config.Quota{Limit: 5, Window: config.Duration(2 * time.Second), Policy: devicelimit.PolicyDrop}
	fromFile.Limits.Buckets = 10
	fromFile.Limits.Rules = []config.Rule{{Match: config.Match{Username: "u"}, Quota: fromFile.Limits.Default}}
	fromFile.Log.Level = slog.LevelWarn

	tests := []struct {
		name string
		args []string
		want func() config.Config
	}{
		{"no file, no flags: defaults", nil, config.Default},
		{"flags only", []string{"--mqtt-addr", ":2883", "--data-dir", "/srv/gw", "--snapshot-interval", "250ms",
			"--limit", "9", "--window", "1m", "--policy", "disconnect", "--buckets", "60", "--log-level", "debug"},
			func() config.Config {
				c := config.Default()
				c.MQTT.TCP = ":2883"
				c.DataDir = "/srv/gw"
				c.Persist.SnapshotInterval = config.Duration(250 * time.Millisecond)
				c.Limits.Default = config.Quota{Limit: 9, Window: config.Duration(time.Minute), Policy: devicelimit.PolicyDisconnect}
				c.Limits.Buckets = 60
				c.Log.Level = slog.LevelDebug
				return c
			}},
		{"file only", []string{"--config", file}, func() config.Config { return fromFile }},
		{"--data-dir and --snapshot-interval override the file", []string{"--config", file, "--data-dir", "x", "--snapshot-interval", "3s"},
			func() config.Config {
				c := fromFile
				c.DataDir = "x"
				c.Persist.SnapshotInterval = config.Duration(3 * time.Second)
				return c
			}},
		{"flags override the file, the rest of the file stays", []string{"--config", file, "--limit", "7"},
			func() config.Config {
				c := fromFile
				c.Limits.Default.Limit = 7
				return c
			}},
		{"a flag set to its default value still overrides the file", []string{"--buckets", "20", "--config", file, "--mqtt-addr", ":1883"},
			func() config.Config {
				c := fromFile
				c.Limits.Buckets = 20
				c.MQTT.TCP = ":1883"
				return c
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := serveConfig(tt.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if want := tt.want(); !reflect.DeepEqual(got, want) {
				t.Fatalf("config = %+v, want %+v", got, want)
			}
		})
	}
}

// TestRunServe runs the gateway in this process, so the race detector
// sees the wiring, and stops it by cancelling the context as a signal
// would.
func TestRunServe(t *testing.T) {
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		// The default command, chosen by the leading flag.
		done <- run(ctx, []string{"--mqtt-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir", dataDir}, io.Discard, pw)
		pw.Close()
	}()
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	var addr string
	var log []string
	deadline := time.After(10 * time.Second)
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("run ended before listening: %v\n%s", <-done, strings.Join(log, "\n"))
			}
			log = append(log, l)
			if m := listeningRE.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
		case <-deadline:
			t.Fatalf("no \"mqtt listening\" line within 10s:\n%s", strings.Join(log, "\n"))
		}
	}
	rest := make(chan []string)
	go func() { // keep reading, or the logger blocks on the pipe
		var more []string
		for l := range lines {
			more = append(more, l)
		}
		rest <- more
	}()

	mqttConnect(t, addr, "in-process", "")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v, want nil after cancel", err)
		}
	case <-time.After(server.ShutdownTimeout + time.Second):
		t.Fatalf("run still going %s after cancel", server.ShutdownTimeout+time.Second)
	}
	log = append(log, <-rest...)
	all := strings.Join(log, "\n")
	for _, want := range []string{`msg="default quota" limit=100 window=10s policy=drop buckets=20 identity=client_id rules=0`, `msg="shutting down"`, `msg=stopped`} {
		if !strings.Contains(all, want) {
			t.Errorf("log lacks %s:\n%s", want, all)
		}
	}
}
