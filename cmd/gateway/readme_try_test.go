package main

import (
	"bytes"
	"context"
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
// uses the gateway's default ports (1883 and 8080), so the test fails if
// something else holds them.
func TestREADMETryIt(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(sourceDir, "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	script, want := tryItBlocks(t, string(readme))
	needDefaultPorts(t, "the README's try-it block")
	checkout := copyCheckout(t, filepath.Join(sourceDir, "..", ".."))
	out, runErr := runPasted(checkout, script)
	gwlog, _ := os.ReadFile(filepath.Join(checkout, "gateway.log"))
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
	if !strings.Contains(string(gwlog), "msg=stopped") {
		t.Fatalf("the gateway did not log that it stopped after kill %%1:\n%s", gwlog)
	}
	if _, err := os.Stat(filepath.Join(checkout, "data", "devicegate.db")); err != nil {
		t.Fatalf("no data file after the try-it block: %v", err)
	}
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
// shell there would (bashArgs such as "-e" before it), for at most 3
// minutes, and returns what it printed on stdout and stderr.
func runPasted(dir, script string, bashArgs ...string) (*bytes.Buffer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append(bashArgs, "-c", script)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GATEWAY_ADMIN_TOKEN=", "GATEWAY_ADMIN_ADDR=")
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
