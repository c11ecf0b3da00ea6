package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/server"
)

// testVersion is stamped into the binary the tests run, as a release
// build would be.
const testVersion = "v9.9.9-test"

// binary is the gateway built once for the process tests.
var binary string

// sourceDir is the package's directory; the tests run in a temporary
// one.
var sourceDir string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gateway-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-ldflags", "-X main.version="+testVersion, "-o", binary, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build gateway: %v\n%s", err, out)
		return 1
	}
	// The children and `gateway quota` find the token in the data
	// directory, not in an operator's environment.
	os.Unsetenv("GATEWAY_ADMIN_TOKEN")
	os.Unsetenv("GATEWAY_ADMIN_ADDR")
	if sourceDir, err = os.Getwd(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Every test passes its own --data-dir; should one forget, the
	// default ./data lands in this temporary directory, not the source
	// tree, and children inherit it.
	if err := os.Chdir(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// process is a gateway child process whose stderr is read line by line.
type process struct {
	t     *testing.T
	cmd   *exec.Cmd
	lines chan string // stderr, closed at EOF

	mu  sync.Mutex
	log []string // every stderr line so far, for failure messages
}

// start runs the binary with args.
func start(t *testing.T, args ...string) *process {
	t.Helper()
	return startEnv(t, nil, args...)
}

// startEnv runs the binary with args, and with env's variables (NAME=value;
// empty strings are skipped) in place of the test's own of those names
// and of GODEBUG.
func startEnv(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(binary, ownAdminPort(args)...)
	if env != nil {
		drop := map[string]bool{"GODEBUG": true}
		for _, kv := range env {
			name, _, _ := strings.Cut(kv, "=")
			drop[name] = true
		}
		for _, kv := range os.Environ() {
			if name, _, _ := strings.Cut(kv, "="); !drop[name] {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		for _, kv := range env {
			if kv != "" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{t: t, cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log = append(p.log, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // still running: the test failed
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return p
}

func (p *process) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

// waitLine returns the submatches of the first stderr line matching re,
// failing the test if none comes within timeout.
func (p *process) waitLine(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("stderr ended before a line matching %s; stderr:\n%s", re, p.stderr())
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-deadline.C:
			p.t.Fatalf("no stderr line matching %s within %s; stderr:\n%s", re, timeout, p.stderr())
		}
	}
}

// wait waits for the process to exit, at most timeout, and returns its
// exit code and how long it took.
func (p *process) wait(timeout time.Duration) (int, time.Duration) {
	p.t.Helper()
	begin := time.Now()
	// Read stderr to its end, which comes when the child exits: Wait
	// closes the pipe, so calling it earlier could lose the last lines.
	eof := make(chan struct{})
	go func() {
		for range p.lines {
		}
		close(eof)
	}()
	select {
	case <-eof:
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		p.cmd.Wait()
		p.t.Fatalf("still running %s after it was asked to stop; stderr:\n%s", timeout, p.stderr())
	}
	took := time.Since(begin)
	err := p.cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		p.t.Fatalf("wait: %v", err)
	}
	return p.cmd.ProcessState.ExitCode(), took
}

// ownAdminPort adds --admin-addr 127.0.0.1:0 to the arguments of a
// gateway that serves (they name a --data-dir, and are no quota or
// forward command) and do not choose an
// admin address, so that tests running in parallel never contend for
// the default 127.0.0.1:8080.
func ownAdminPort(args []string) []string {
	if !slices.Contains(args, "--data-dir") || slices.Contains(args, "--admin-addr") || slices.Contains(args, "quota") || slices.Contains(args, "forward") {
		return args
	}
	return append(slices.Clip(args), "--admin-addr", "127.0.0.1:0")
}

// runBinaryBound is how long runBinary lets a run take before it calls
// the run hung. It is a guard against a hang, not a measure: a 1.5 s
// simulate run over TLS with MQTT 3.1.1 (which waits out its 2 s drain)
// takes 3.7 s on a quiet machine and passed 10 s in CI beside the race
// suite of every other package.
const runBinaryBound = 90 * time.Second

// runBinary runs the binary to completion (at most runBinaryBound) and
// returns its exit code, stdout and stderr.
func runBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runBinaryBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, ownAdminPort(args)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("gateway %v still running after %s; stderr:\n%s", args, runBinaryBound, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mqttConnect opens an MQTT 3.1.1 session with a raw CONNECT (with a
// username when not empty), checks the CONNACK accepts it and a PINGREQ
// is answered.
func mqttConnect(t *testing.T, addr, clientID, username string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(5 * time.Second))

	// Variable header: protocol "MQTT", level 4, flags (clean session,
	// username), keep alive 60 s; payload: the client ID, the username.
	flags := byte(0x02)
	if username != "" {
		flags |= 0x80
	}
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, flags, 0, 60}
	for _, s := range []string{clientID, username} {
		if s != "" {
			body = append(body, byte(len(s)>>8), byte(len(s)))
			body = append(body, s...)
		}
	}
	if _, err := conn.Write(append([]byte{0x10, byte(len(body))}, body...)); err != nil {
		t.Fatalf("write CONNECT: %v", err)
	}
	connack := make([]byte, 4)
	if _, err := io.ReadFull(conn, connack); err != nil {
		t.Fatalf("read CONNACK: %v", err)
	}
	if want := []byte{0x20, 2, 0, 0}; !bytes.Equal(connack, want) {
		t.Fatalf("CONNACK = % x, want % x (accepted)", connack, want)
	}
	if _, err := conn.Write([]byte{0xc0, 0}); err != nil {
		t.Fatalf("write PINGREQ: %v", err)
	}
	pingresp := make([]byte, 2)
	if _, err := io.ReadFull(conn, pingresp); err != nil {
		t.Fatalf("read PINGRESP: %v", err)
	}
	if want := []byte{0xd0, 0}; !bytes.Equal(pingresp, want) {
		t.Fatalf("PINGRESP = % x, want % x", pingresp, want)
	}
	conn.SetDeadline(time.Time{})
	return conn
}

var (
	listeningRE = regexp.MustCompile(`level=INFO msg="mqtt listening" addr=(\S+)`)
	quotaRE     = regexp.MustCompile(`level=INFO msg="default quota" (.*)`)
)

func TestServeProcess(t *testing.T) {
	p := start(t, "serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", t.TempDir())
	addr := p.waitLine(listeningRE, 10*time.Second)[1]
	if strings.HasSuffix(addr, ":0") {
		t.Fatalf("logged addr %q, want the bound port", addr)
	}
	quota := p.waitLine(quotaRE, 5*time.Second)[1]
	if want := "limit=100 window=10s policy=drop buckets=20 identity=client_id rules=0"; quota != want {
		t.Errorf("default quota line %q, want %q", quota, want)
	}

	conn := mqttConnect(t, addr, "sensor-1", "")

	// Stop it with a client still connected.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, took := p.wait(server.ShutdownTimeout + 2*time.Second)
	if code != 0 || took > server.ShutdownTimeout {
		t.Fatalf("after SIGTERM: exit %d in %s, want 0 within %s; stderr:\n%s", code, took, server.ShutdownTimeout, p.stderr())
	}
	for _, want := range []string{`msg="shutting down"`, `msg=stopped`} {
		if !strings.Contains(p.stderr(), want) {
			t.Errorf("stderr lacks %s:\n%s", want, p.stderr())
		}
	}
	// The client's connection was closed, not left hanging.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after shutdown (read % x)", rest)
	}
}

func TestServeProcessInterrupt(t *testing.T) {
	path := writeConfig(t, `
mqtt: {tcp: "127.0.0.1:0"}
limits:
  default: {limit: 5, window: 2s, policy: disconnect}
  identity: username
  rules: [{match: {client_id: "s-*"}, quota: {limit: 1}}]
log: {level: debug}
`)
	p := start(t, "--config", path, "--limit", "7", "--data-dir", t.TempDir())
	addr := p.waitLine(listeningRE, 10*time.Second)[1]
	quota := p.waitLine(quotaRE, 5*time.Second)[1]
	if want := "limit=7 window=2s policy=disconnect buckets=20 identity=username rules=1"; quota != want {
		t.Errorf("default quota line %q, want %q", quota, want)
	}
	mqttConnect(t, addr, "s-1", "device-1")
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code, took := p.wait(server.ShutdownTimeout + 2*time.Second); code != 0 || took > server.ShutdownTimeout {
		t.Fatalf("after SIGINT: exit %d in %s, want 0 within %s; stderr:\n%s", code, took, server.ShutdownTimeout, p.stderr())
	}
	if !strings.Contains(p.stderr(), "level=DEBUG") {
		t.Errorf("log.level debug from the file logged no debug lines:\n%s", p.stderr())
	}
}

func TestServeProcessPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	code, _, stderr := runBinary(t, "serve", "--mqtt-addr", l.Addr().String(), "--data-dir", t.TempDir())
	if code != 1 || !strings.Contains(stderr, l.Addr().String()) || !strings.Contains(stderr, "address already in use") ||
		!strings.Contains(stderr, "\ngateway: mqtt.tcp: ") {
		t.Fatalf("exit %d, stderr %q; want 1 and a bind error naming mqtt.tcp and %s", code, stderr, l.Addr())
	}
	// The same for the admin API's address, and the WebSocket listener's.
	code, _, stderr = runBinary(t, "serve", "--mqtt-addr", "127.0.0.1:0", "--admin-addr", l.Addr().String(), "--data-dir", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "address already in use") || !strings.Contains(stderr, "\ngateway: admin.addr: ") {
		t.Fatalf("admin: exit %d, stderr %q; want 1 and a bind error naming admin.addr", code, stderr)
	}
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("mqtt: {tcp: \"127.0.0.1:0\", websocket: {addr: \""+l.Addr().String()+"\"}}\nadmin: {addr: \"127.0.0.1:0\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBinary(t, "serve", "--config", cfg, "--data-dir", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "\ngateway: mqtt.websocket.addr: ") {
		t.Fatalf("websocket: exit %d, stderr %q; want 1 and a bind error naming mqtt.websocket.addr", code, stderr)
	}
}

// TestBadSettingsProcess checks that a bad file or flag stops the
// gateway before it listens, with a message naming the key (or flag)
// and the value.
func TestBadSettingsProcess(t *testing.T) {
	tests := []struct {
		name string
		yaml string // written to a file passed with --config, if set
		args []string
		code int
		want []string
	}{
		{name: "unknown key", yaml: "limits:\n  burst: 5\n", code: 1,
			want: []string{"line 2: limits.burst: unknown key"}},
		{name: "forward: bad address and filter", yaml: "forward: [{name: cloud, to: \"tcp://up:1883\", topics: [\"a/#/b\"]}]\n", code: 1,
			want: []string{`forward[0].to: must be mqtt[s]://host:port, redis[s]://host:port[/DB], nats[s]://host:port[,host:port...] or kafka[s]://host:port[,host:port...]: unknown kind of destination "tcp" (got "tcp://up:1883")`, `forward[0].topics[0]: is not a valid topic filter`}},
		{name: "forward: unknown key", yaml: "forward: [{name: cloud, to: \"mqtt://up:1883\", topics: [t], burst: 5}]\n", code: 1,
			want: []string{"forward[0].burst: unknown key"}},
		{name: "forward: rate 0 and a mapping that cannot be reversed", yaml: "forward: [{name: cloud, to: \"mqtt://up:1883\", topics: [t], rate: 0, local_prefix: d, remote_prefix: s/}]\n", code: 1,
			want: []string{"forward[0].rate: must be > 0 messages per second, or left out for no bound (got 0)", `forward[0].remote_prefix: local_prefix and remote_prefix must end in '/' so the mapping is of whole levels and can be reversed (got "d" and "s/")`}},
		{name: "forward to a stream: wildcard subject, no Kafka topic, bad SASL", yaml: "forward:\n" +
			"  - {name: js, to: \"nats://n:4222\", topics: [t], subject: \"devices.+.t\"}\n" +
			"  - {name: kafka, to: \"kafka://k:9092\", topics: [t], sasl: GSSAPI, username: u, password: p}\n", code: 1,
			want: []string{`forward[0].subject: must not hold '+' (got "devices.+.t")`,
				`forward[1].kafka_topic: must name the Kafka topic: fixed text, {topic} and {device} (got "")`,
				`forward[1].sasl: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (got "GSSAPI")`}},
		{name: "zero window", yaml: "limits: {default: {window: 0s}}\n", code: 1,
			want: []string{`limits.default.window: must be > 0 (got "0s")`}},
		{name: "limit 0", yaml: "limits: {default: {limit: 0}}\n", code: 1,
			want: []string{`limits.default.limit: must be between 1 and 1000000000 (got 0)`}},
		{name: "unparsable duration", yaml: "limits: {default: {window: soon}}\n", code: 1,
			want: []string{`limits.default.window: must be a duration like "10s" (got "soon")`}},
		{name: "bare number duration", yaml: "limits:\n  rules:\n    - match: {client_id: a}\n      quota: {window: 10}\n", code: 1,
			want: []string{`line 4: limits.rules[0].quota.window: must be a duration like "10s" (got 10)`}},
		{name: "unknown policy", yaml: "limits: {default: {policy: hold}}\n", code: 1,
			want: []string{`limits.default.policy: must be drop, defer or disconnect (got "hold")`}},
		{name: "defer queue size", yaml: "limits: {defer: {max_total_bytes: 1TB}}\n", code: 1,
			want: []string{`limits.defer.max_total_bytes: must be a size in bytes like 1048576 or "1MiB" (got "1TB")`}},
		{name: "several problems", yaml: "limits: {buckets: 0, identity: ip}\nlog: {level: loud}\n", code: 1,
			want: []string{"invalid settings (config ", "\n  limits.buckets: must be between 1 and 1000 (got 0)",
				"\n  limits.identity: must be client_id or username (got \"ip\")", "\n  log.level: must be debug, info, warn or error (got \"loud\")"}},

		{name: "missing file", args: []string{"--config", "/nonexistent/gateway.yaml"}, code: 1,
			want: []string{"/nonexistent/gateway.yaml", "no such file"}},
		{name: "flag limit 0", args: []string{"--limit", "0"}, code: 1,
			want: []string{`--limit: must be between 1 and 1000000000 (got 0)`}},
		{name: "flag limit text", args: []string{"--limit", "ten"}, code: 2,
			want: []string{`invalid value "ten" for flag -limit: must be an integer`}},
		{name: "flag window zero", args: []string{"--window", "0s"}, code: 1,
			want: []string{`--window: must be > 0 (got "0s")`}},
		{name: "flag window bare", args: []string{"--window", "10"}, code: 2,
			want: []string{`invalid value "10" for flag -window: must be a duration like "10s"`}},
		{name: "flag policy", args: []string{"--policy", "hold"}, code: 1,
			want: []string{`--policy: must be drop, defer or disconnect (got "hold")`}},
		{name: "flag restore delay", args: []string{"--defer-restore-delay", "-1s"}, code: 1,
			want: []string{`--defer-restore-delay: must be between 0s and 1h (got "-1s")`}},
		{name: "flag buckets", args: []string{"--buckets", "5000"}, code: 1,
			want: []string{`--buckets: must be between 1 and 1000 (got 5000)`}},
		{name: "flag log level", args: []string{"--log-level", "trace"}, code: 1,
			want: []string{`--log-level: must be debug, info, warn or error (got "trace")`}},
		{name: "flag data dir empty", args: []string{"--data-dir", ""}, code: 1,
			want: []string{`--data-dir: must name a directory (got "")`}},
		{name: "flag snapshot interval zero", args: []string{"--snapshot-interval", "0s"}, code: 1,
			want: []string{`--snapshot-interval: must be > 0 (got "0s")`}},
		{name: "flag snapshot interval too long", args: []string{"--snapshot-interval", "2h"}, code: 1,
			want: []string{`--snapshot-interval: must be at most 1h0m0s (got "2h0m0s")`}},
		{name: "flag snapshot interval bare", args: []string{"--snapshot-interval", "1"}, code: 2,
			want: []string{`invalid value "1" for flag -snapshot-interval: must be a duration like "10s"`}},
		{name: "file snapshot interval", yaml: "persist: {snapshot_interval: 0s}\n", code: 1,
			want: []string{`persist.snapshot_interval: must be > 0 (got "0s")`}},
		{name: "flag mqtt addr", args: []string{"--mqtt-addr", "1883"}, code: 1,
			want: []string{`--mqtt-addr: must be host:port`, `(got "1883")`}},
		{name: "unknown flag", args: []string{"--tls-addr", ":8883"}, code: 2,
			want: []string{"flag provided but not defined: -tls-addr"}},
		{name: "flag beats file", yaml: "limits: {default: {limit: 5}, buckets: 10}\n", args: []string{"--buckets", "0"}, code: 1,
			want: []string{"--buckets: must be between 1 and 1000 (got 0)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Should a case ever start the gateway, keep it off :1883.
			args := []string{"serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}
			if tt.yaml != "" {
				args = append(args, "--config", writeConfig(t, tt.yaml))
			}
			args = append(args, tt.args...)
			code, stdout, stderr := runBinary(t, args...)
			if code != tt.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.code, stderr)
			}
			if !strings.HasPrefix(stderr, "gateway: ") {
				t.Errorf("stderr %q does not start with \"gateway: \"", stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if stdout != "" || strings.Contains(stderr, "mqtt listening") {
				t.Errorf("gateway started or printed to stdout: %q / %q", stdout, stderr)
			}
		})
	}
}

// TestVersionProcess: `gateway version` and `gateway --version` print
// the stamped version with the toolchain and platform; a plain
// `go build` in a git checkout says its module version (a
// pseudo-version of the commit), the commit and its time, from the
// build information alone.
func TestVersionProcess(t *testing.T) {
	first := fmt.Sprintf("devicegate %s (%s %s/%s)\n", testVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := runBinary(t, args...)
		if code != 0 || !strings.HasPrefix(stdout, first) || stderr != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want 0, %q first, nothing", args, code, stdout, stderr, first)
		}
	}

	// The go command stamps the commit only in a plain checkout (this
	// may be a worktree, whose .git is a file): build in a fresh
	// repository of the module's files as they are now.
	repo := t.TempDir()
	root := filepath.Dir(filepath.Dir(sourceDir))
	files, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(root, f))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com", "-C", repo}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "snapshot")
	head := git("rev-parse", "HEAD")
	plain := filepath.Join(t.TempDir(), "gateway")
	// -buildvcs=true: this machine's go env may turn stamping off.
	build := exec.Command("go", "build", "-buildvcs=true", "-o", plain, "./cmd/gateway")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(plain, "version").Output()
	if err != nil {
		t.Fatalf("plain build's version: %v", err)
	}
	// v0.0.0-20261127055400-0b30119abcde: the commit's pseudo-version.
	pseudo := regexp.MustCompile(`^devicegate v\d+\.\d+\.\d+-\S*` + head[:12] + ` \(go`)
	if !pseudo.Match(out) || !strings.Contains(string(out), "\nrevision "+head+"\n") || !strings.Contains(string(out), "\ntime 20") {
		t.Fatalf("plain go build's version:\n%s\nwant a pseudo-version of %s, the revision and its time", out, head[:12])
	}
}

// TestLimitFlagOverWindows: --limit over a file whose default quota has
// several windows makes it one window: the flag's limit and the
// built-in window (config.Quota.OneWindow).
func TestLimitFlagOverWindows(t *testing.T) {
	file := writeConfig(t, "limits:\n  default: {windows: [{messages: 1, window: 1s}]}\n")
	cfg, err := serveConfig([]string{"--config", file, "--limit", "7"}, io.Discard)
	q := cfg.Limits.Default
	if err != nil || q.Windows != nil || q.Limit != 7 || q.Window != config.Default().Limits.Default.Window {
		t.Fatalf("after --limit 7: %+v %v", q, err)
	}
}
