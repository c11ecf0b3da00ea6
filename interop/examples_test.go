package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/internal/doctest"
	"github.com/devicegate/devicegate/internal/proctest"
	"github.com/devicegate/devicegate/simulator"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = ".."

// examples returns the docs' device examples by language: the code
// blocks of docs/*.md marked "<!-- runnable: TestDeviceExamples -->"
// (docs/device-feedback.md, "Device examples"). Each language must have
// exactly one.
func examples(t *testing.T) map[string]string {
	t.Helper()
	pages, err := doctest.Pages(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pages {
		for _, b := range p.Blocks() {
			if b.Runnable != "TestDeviceExamples" {
				continue
			}
			if _, dup := out[b.Lang]; dup {
				t.Fatalf("%s:%d: a second %s device example", p.Path, b.Line, b.Lang)
			}
			out[b.Lang] = b.Code
		}
	}
	for _, lang := range []string{"js", "python", "go"} {
		if out[lang] == "" {
			t.Fatalf("no %s device example marked <!-- runnable: TestDeviceExamples --> in the docs", lang)
		}
	}
	return out
}

// npmDir is where scripts/ensure-tools.sh installs MQTT.js.
func npmDir(t *testing.T) string {
	if d := os.Getenv("DEVICEGATE_NPM_DIR"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(cache, "devicegate", "npm")
}

// exampleCommand returns the command that runs the example code of lang
// in dir, failing the test when its tool is missing.
func exampleCommand(t *testing.T, ctx context.Context, lang, code, dir string) *exec.Cmd {
	t.Helper()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	switch lang {
	case "js":
		modules := filepath.Join(npmDir(t), "node_modules")
		if _, err := os.Stat(filepath.Join(modules, "mqtt", "package.json")); err != nil {
			t.Fatalf("MQTT.js not found in %s: run scripts/ensure-tools.sh, which installs it with npm", modules)
		}
		cmd := exec.CommandContext(ctx, proctest.Tool(t, "node"), write("device.js", code))
		cmd.Dir, cmd.Env = dir, append(os.Environ(), "NODE_PATH="+modules)
		return cmd
	case "python":
		// Debian's python3, which has Debian's python3-paho-mqtt.
		py := "/usr/bin/python3"
		if out, err := exec.Command(py, "-c", "import paho.mqtt.client").CombinedOutput(); err != nil {
			t.Fatalf("%s cannot import paho.mqtt (%v: %s): run scripts/ensure-tools.sh, which installs python3-paho-mqtt", py, err, out)
		}
		cmd := exec.CommandContext(ctx, py, write("device.py", code))
		cmd.Dir, cmd.Env = dir, os.Environ()
		return cmd
	case "go":
		// A module of its own, with the repository's requirements (the
		// module cache has them all: nothing is downloaded).
		mod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		sum, err := os.ReadFile(filepath.Join(repoRoot, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		first, rest, _ := strings.Cut(string(mod), "\n")
		if !strings.HasPrefix(first, "module ") {
			t.Fatalf("go.mod starts with %q", first)
		}
		write("go.mod", "module device.example\n"+rest)
		write("go.sum", string(sum))
		write("main.go", code)
		cmd := exec.CommandContext(ctx, proctest.Tool(t, "go"), "run", ".")
		cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
		return cmd
	}
	t.Fatalf("no way to run %s", lang)
	return nil
}

// TestDeviceExamples runs the docs' device examples, MQTT.js 5, Python
// paho and paho.golang, against a gateway: each reads RateLimit-Policy
// at connect and RateLimit on its acknowledgements (PUBACK; PUBREC for
// the QoS 2 one of MQTT.js and Python), 5 messages against a quota of 4
// an hour, and the values match the admin API's status of the device
// right after: the policies' q and w, and r (t within a second of the
// retry-after) of the last acknowledgement, the refusal; the example
// waits for the refusing window's t. Then a byte-window refusal (each
// example's "bulk" run).
func TestDeviceExamples(t *testing.T) {
	code := examples(t)
	g := startGateway(t)
	for _, lang := range []string{"js", "python", "go"} {
		t.Run(lang, func(t *testing.T) {
			id := "example-" + lang
			out := runExample(t, lang, code[lang], "DEVICEGATE_MQTT="+g.mqtt, "DEVICE_ID="+id, "TOPIC=devices/"+id+"/telemetry", "COUNT=5")
			checkExampleOutput(t, lang, out, g.device(t, id))
		})
		t.Run(lang+" bulk", func(t *testing.T) {
			id := "bulk-" + lang
			out := runExample(t, lang, code[lang], "DEVICEGATE_MQTT="+g.mqtt, "DEVICE_ID="+id, "TOPIC=devices/"+id+"/bulk", "COUNT=5", "LAST_SIZE=1000")
			checkByteRefusal(t, lang, out)
		})
	}
}

// runExample runs the example code of lang with the environment env
// added and returns what it printed.
func runExample(t *testing.T, lang, code string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exampleCommand(t, ctx, lang, code, t.TempDir())
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s example: %v\n%s", lang, err, out.String())
	}
	t.Logf("%s example printed:\n%s", lang, out.String())
	return out.String()
}

// refusal returns the RateLimit of the last of an example's 5
// acknowledgements, which must be a refusal, and the line the example
// printed after it ("" when none).
func refusal(t *testing.T, lang, out string) ([]simulator.RateRemaining, string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	var acks []int
	for i, line := range lines {
		if strings.HasPrefix(line, "PUBACK ") || strings.HasPrefix(line, "PUBREC ") {
			acks = append(acks, i)
		}
	}
	if len(acks) != 5 {
		t.Fatalf("%d acknowledgements printed, want 5", len(acks))
	}
	last := lines[acks[4]]
	wantAck := "PUBREC 0x97 RateLimit: "
	if lang == "go" {
		wantAck = "PUBACK 0x97 RateLimit: "
	}
	field, ok := strings.CutPrefix(last, wantAck)
	if !ok {
		t.Fatalf("last acknowledgement %q, want a refusal: %s...", last, wantAck)
	}
	rs, err := simulator.ParseRateRemaining(field)
	if err != nil {
		t.Fatalf("RateLimit of the refusal: %v", err)
	}
	return rs, lines[acks[4]+1]
}

// checkByteRefusal checks an example's bulk run: its fifth message, of
// 1000 bytes, is refused by the byte window of the class "x,y;z", whose
// RateLimit item comes after the class's message window, which has room
// (r > 0); the example waits for the byte window's t.
func checkByteRefusal(t *testing.T, lang, out string) {
	t.Helper()
	rs, after := refusal(t, lang, out)
	const msgs, bytes = "x,y;z/20m", "x,y;z/1h30m-bytes"
	if len(rs) != 2 || rs[0].Name != msgs || rs[0].R != 6 || rs[1].Name != bytes || rs[1].R != int64(1000-4*len("reading 0")) || rs[1].T <= rs[0].T {
		t.Fatalf("refusal's RateLimit %+v: want %s with room first, then %s with 964 bytes left and the later t", rs, msgs, bytes)
	}
	if want := fmt.Sprintf("wait %ds (%s)", int64(rs[1].T/time.Second), bytes); after != want {
		t.Fatalf("after the refusal the example printed %q, want %q", after, want)
	}
}

// checkExampleOutput checks what an example printed against the admin
// API's status of its device.
func checkExampleOutput(t *testing.T, lang, out string, d admin.DeviceJSON) {
	t.Helper()
	aw := windows(t, d)
	var policy string
	var acks []string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "RateLimit-Policy: "); ok {
			policy = v
		}
		if strings.HasPrefix(line, "PUBACK ") || strings.HasPrefix(line, "PUBREC ") {
			acks = append(acks, line)
		}
	}
	ps, err := simulator.ParseRatePolicies(policy)
	if err != nil {
		t.Fatalf("RateLimit-Policy at connect: %v", err)
	}
	if len(ps) != len(aw) {
		t.Fatalf("RateLimit-Policy %q, admin windows %+v", policy, aw)
	}
	for _, p := range ps {
		w, ok := aw[p.Name]
		if !ok || int64(w.limit) != p.Quota || w.window != p.Window || p.Bytes != strings.HasSuffix(p.Name, "-bytes") {
			t.Fatalf("policy %+v, admin window %+v", p, w)
		}
	}
	if len(acks) != 5 {
		t.Fatalf("%d acknowledgements printed, want 5", len(acks))
	}
	rs, after := refusal(t, lang, out)
	if rs[0].Name != "1h" || rs[0].R != 0 {
		t.Fatalf("refusal's RateLimit %+v: want the full 1h window first", rs)
	}
	for _, r := range rs {
		w, ok := aw[r.Name]
		if !ok || int64(w.remaining) != r.R {
			t.Fatalf("RateLimit %+v, admin window %+v", r, w)
		}
		if r.R == 0 && (r.T < w.retryAfter || r.T > w.retryAfter+2*time.Second) {
			t.Fatalf("RateLimit %+v: t, admin retry after %s", r, w.retryAfter)
		}
	}
	if want := fmt.Sprintf("wait %ds (1h)", int64(rs[0].T/time.Second)); after != want {
		t.Fatalf("after the refusal the example printed %q, want %q", after, want)
	}
	// The admitted acknowledgements before it: r counts down.
	for i, a := range acks[:4] {
		if !strings.HasPrefix(a, "PUBACK 0x00 RateLimit: ") {
			t.Fatalf("acknowledgement %d %q: want an admitted PUBACK", i+1, a)
		}
	}
}
