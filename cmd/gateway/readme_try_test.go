package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestREADMETryIt runs the README's "Try it" block as a new user would
// paste it: in a copy of the checkout, with bash, and compares what it
// prints with the output block the README shows under it. The block
// writes only into its temporary directory (mktemp -d, here under the
// test's own TMPDIR): the checkout's files are the same after it. The
// block uses the gateway's default ports (1883 and 8080), so the test
// fails if something else holds them.
func TestREADMETryIt(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(sourceDir, "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	script, want := tryItBlocks(t, string(readme))
	needDefaultPorts(t, "the README's try-it block")
	checkout := copyCheckout(t, filepath.Join(sourceDir, "..", ".."))
	before := treeListing(t, checkout)
	tmp := t.TempDir()
	out, runErr := runPasted(checkout, script, tmpdirEnv(tmp))
	logs, _ := filepath.Glob(filepath.Join(tmp, "*", "gateway.log"))
	var gwlog []byte
	if len(logs) == 1 {
		gwlog, _ = os.ReadFile(logs[0])
	}
	if runErr != nil {
		t.Fatalf("the try-it block failed: %v\noutput:\n%s\ngateway.log:\n%s", runErr, out.String(), gwlog)
	}
	if !sameTryItOutput(out.String(), want) {
		t.Fatalf("the try-it block printed\n%s\nthe README shows\n%s\ngateway.log:\n%s", out.String(), want, gwlog)
	}
	// The README says the retry-after lies between about 9.9 and 10.5 s:
	// at most the window and a bucket after the bucket of the first
	// reading began, less the time the readings took.
	for _, m := range retryAfterRE.FindAllStringSubmatch(out.String(), -1) {
		d, err := time.ParseDuration(m[1])
		if err != nil || d < 9*time.Second || d > 10500*time.Millisecond {
			t.Errorf("retry after %s (%v), want between 9s and 10.5s as the README says", m[1], err)
		}
	}
	// kill %1 stopped the gateway gracefully: it wrote its state and
	// let go of the ports.
	if len(logs) != 1 || !strings.Contains(string(gwlog), "msg=stopped") {
		t.Fatalf("the gateway did not log in one gateway.log under TMPDIR (%v) that it stopped after kill %%1:\n%s", logs, gwlog)
	}
	if db, _ := filepath.Glob(filepath.Join(tmp, "*", "data", "devicegate.db")); len(db) != 1 {
		t.Fatalf("no data file under the block's temporary directory: %v", db)
	}
	if after := treeListing(t, checkout); !slices.Equal(before, after) {
		t.Fatalf("the try-it block wrote into the checkout:\nbefore %q\nafter  %q", before, after)
	}
}

// tmpdirEnv is the environment entry that points mktemp at dir.
func tmpdirEnv(dir string) string { return "TMPDIR=" + dir }

// treeListing lists the files and directories under dir, with their
// sizes, sorted.
func treeListing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out = append(out, fmt.Sprintf("%s %d", rel, info.Size()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// needDefaultPorts fails the test when the gateway's default ports,
// which a pasted block uses, are held by something else.
func needDefaultPorts(t *testing.T, what string) {
	t.Helper()
	for _, addr := range []string{":1883", "127.0.0.1:8080"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s needs %s, which is in use: %v", what, addr, err)
		}
		ln.Close()
	}
}

// runPasted runs script with bash in dir, as a reader pasting it into a
// shell there would (arguments starting with "-" go to bash before it,
// such as "-e"; NAME=VALUE ones into its environment), and returns
// what it printed on stdout and stderr. pastedTimeout bounds a block
// that hangs.
func runPasted(dir, script string, opts ...string) (*bytes.Buffer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pastedTimeout)
	defer cancel()
	var bashArgs []string
	env := append(os.Environ(), "GATEWAY_ADMIN_TOKEN=", "GATEWAY_ADMIN_ADDR=")
	for _, o := range opts {
		if strings.HasPrefix(o, "-") {
			bashArgs = append(bashArgs, o)
		} else {
			env = append(env, o)
		}
	}
	cmd := exec.CommandContext(ctx, "bash", append(bashArgs, "-c", script)...)
	cmd.Dir = dir
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	// The block runs in a process group of its own, so that whatever it
	// left running (a gateway the block failed to stop) is ended with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	return &out, err
}

// pastedTimeout bounds one pasted block: its go build compiles the
// checkout's packages again in the copy (the build cache keys them by
// directory), which took over 3 minutes at load 17 on 2 cores.
const pastedTimeout = 10 * time.Minute

// tryItBlocks returns the sh block of the README's "Try it" section and
// the text block that follows it (what the block prints).
func tryItBlocks(t *testing.T, readme string) (script, output string) {
	t.Helper()
	i := strings.Index(readme, "\n## Try it\n")
	if i < 0 {
		t.Fatal(`README has no "## Try it" section`)
	}
	section := readme[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	blocks := regexp.MustCompile("(?s)```(sh|text)\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) < 2 || blocks[0][1] != "sh" || blocks[1][1] != "text" {
		t.Fatalf("README's Try it section must hold a sh block and then a text block of its output; found %d blocks", len(blocks))
	}
	return blocks[0][2], blocks[1][2]
}

// retryAfterRE matches the retry-after in a refusal's reason string,
// which differs from run to run by up to half a second (the bucket
// phase).
var retryAfterRE = regexp.MustCompile(`retry after ([0-9.]+m?s)`)

// sameTryItOutput reports whether got holds the lines of want, the
// retry-afters aside: the same lines as many times each, and the
// subscriber's lines (those of the received topic) in want's order. The
// subscriber and the publishers are separate processes, so their lines
// may interleave either way.
func sameTryItOutput(got, want string) bool {
	lines := func(s string) []string {
		return strings.Split(strings.TrimSpace(retryAfterRE.ReplaceAllString(s, "retry after Ds")), "\n")
	}
	g, w := lines(got), lines(want)
	received := func(ls []string) []string {
		var r []string
		for _, l := range ls {
			if strings.HasPrefix(l, "devices/") {
				r = append(r, l)
			}
		}
		return r
	}
	if !slices.Equal(received(g), received(w)) {
		return false
	}
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// copyCheckout copies the checkout's source files (tracked, or new and
// not ignored: what `git ls-files` lists) into a temporary directory, so
// that the block's go build, ./data and gateway.log land there.
func copyCheckout(t *testing.T, root string) string {
	t.Helper()
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	list, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	dst := t.TempDir()
	for name := range strings.SplitSeq(strings.TrimSuffix(string(list), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		if err := copyFile(src, filepath.Join(dst, name), info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func copyFile(src, dst string, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestREADMEFirstScreen: the README's first 40 lines say what devicegate
// is in two sentences, give the two commands (go run ./cmd/gateway,
// make test) each with how long it takes and how to stop the gateway,
// and hold the whole try-it block and its output, a refusal with its
// retry-after among it. Its Prerequisites name every package and npm
// module scripts/ensure-tools.sh installs, and every registry it and
// the go command reach.
func TestREADMEFirstScreen(t *testing.T) {
	root := filepath.Join(sourceDir, "..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(readme), "\n")
	first := strings.Join(lines[:min(40, len(lines))], "\n") + "\n"

	para, _, _ := strings.Cut(strings.TrimLeft(strings.SplitN(first, "\n\n", 2)[1], "\n"), "\n\n")
	if n := len(regexp.MustCompile(`[.!?](\s|$)`).FindAllString(para, -1)); n != 2 {
		t.Errorf("the first paragraph has %d sentences, want 2 (what devicegate is):\n%s", n, para)
	}
	took := regexp.MustCompile(`\d+(\.\d+)? (min|s)\b`)
	for _, cmd := range []string{"go run ./cmd/gateway", "make test"} {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(cmd) + `\s.*$`)
		if l := re.FindString(first); l == "" || !took.MatchString(l) {
			t.Errorf("the first 40 lines have no line starting %q that says how long it takes (got %q)", cmd, l)
		}
	}
	if !strings.Contains(first, "Ctrl-C stops it") || !strings.Contains(first, "kill %1") {
		t.Error("the first 40 lines do not say how to stop the gateway (Ctrl-C, kill %1)")
	}
	script, output := tryItBlocks(t, string(readme))
	if !strings.Contains(first, "```sh\n"+script+"```") || !strings.Contains(first, "```text\n"+output+"```") {
		t.Error("the try-it block and its output do not both end within the first 40 lines")
	}
	if !regexp.MustCompile(`(?m)^quota exceeded: .*retry after `).MatchString(output) {
		t.Errorf("the try-it output shows no refusal with its retry-after:\n%s", output)
	}

	prereq := section(t, string(readme), "## Prerequisites")
	tools, err := os.ReadFile(filepath.Join(root, "scripts", "ensure-tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range regexp.MustCompile(`(?m)^\s+"\S+ (\S+)"$`).FindAllStringSubmatch(string(tools), -1) {
		want = append(want, "`"+m[1]+"`")
	}
	if m := regexp.MustCompile(`(?m)^MQTTJS=(\S+)$`).FindStringSubmatch(string(tools)); m != nil {
		want = append(want, "MQTT.js", "`"+m[1]+"`", "npm registry")
	}
	if len(want) < 10 {
		t.Fatalf("found %d tools in scripts/ensure-tools.sh, want its TOOLS and MQTTJS: %q", len(want), want)
	}
	if strings.Contains(string(tools), "apt-get install") {
		want = append(want, "package archive")
	}
	want = append(want, "Go module proxy")
	for _, w := range want {
		if !strings.Contains(prereq, w) {
			t.Errorf("Prerequisites do not name %s", w)
		}
	}
}

// section returns the text of markdown page from the heading line
// heading up to the next heading of the same level.
func section(t *testing.T, page, heading string) string {
	t.Helper()
	i := strings.Index(page, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no section %q", heading)
	}
	s := page[i+1:]
	level := heading[:strings.IndexByte(heading, ' ')+1]
	if j := strings.Index(s[len(heading):], "\n"+level); j >= 0 {
		s = s[:len(heading)+j+1]
	}
	return s
}
