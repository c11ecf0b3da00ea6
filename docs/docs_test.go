// Package docs holds the user documentation; its tests keep the
// examples of README.md and docs/*.md true.
package docs_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/doctest"
)

// root is the repository root, relative to this package.
const root = ".."

func pages(t *testing.T) []doctest.Page {
	t.Helper()
	ps, err := doctest.Pages(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) < 10 {
		t.Fatalf("found %d pages, want README.md and docs/*.md", len(ps))
	}
	return ps
}

// TestDocsYAMLBlocksParse: every yaml block of the README and docs/
// parses as a configuration and validates: what a reader pastes into
// the file starts a gateway (the hosts in it resolve nowhere; an address
// is checked only for its form).
func TestDocsYAMLBlocksParse(t *testing.T) {
	n := 0
	for _, p := range pages(t) {
		for _, b := range p.Blocks() {
			if b.Lang != "yaml" {
				continue
			}
			n++
			cfg, err := config.Parse(strings.NewReader(b.Code))
			if err == nil {
				err = cfg.Validate()
			}
			if err != nil {
				t.Errorf("%s:%d: the yaml block does not hold:\n%s\n%v", p.Path, b.Line, b.Code, err)
			}
		}
	}
	if n < 10 {
		t.Fatalf("checked %d yaml blocks, want the docs' examples", n)
	}
}

// TestDocsLinksResolve: every relative link of the README and docs/
// names a file of the repository, and its #anchor a heading of that
// page (or of the page itself).
func TestDocsLinksResolve(t *testing.T) {
	ps := pages(t)
	anchors := make(map[string]map[string]bool)
	for _, p := range ps {
		anchors[p.Path] = p.Anchors()
	}
	n := 0
	for _, p := range ps {
		for _, l := range p.Links() {
			if strings.Contains(l.Target, "://") || strings.HasPrefix(l.Target, "mailto:") {
				continue
			}
			n++
			file, anchor, _ := strings.Cut(l.Target, "#")
			target := p.Path
			if file != "" {
				target = path.Clean(path.Join(path.Dir(p.Path), file))
			}
			if _, err := os.Stat(path.Join(root, target)); err != nil {
				t.Errorf("%s:%d: link %s: no file %s", p.Path, l.Line, l.Target, target)
				continue
			}
			if anchor == "" {
				continue
			}
			a, ok := anchors[target]
			if !ok {
				t.Errorf("%s:%d: link %s: an anchor into %s, which is not a page", p.Path, l.Line, l.Target, target)
			} else if !a[anchor] {
				t.Errorf("%s:%d: link %s: %s has no heading #%s", p.Path, l.Line, l.Target, target, anchor)
			}
		}
	}
	if n < 50 {
		t.Fatalf("checked %d links, want the docs' links", n)
	}
}

var (
	// urlHostRE matches the host part of a URL: scheme://HOSTS.
	urlHostRE = regexp.MustCompile(`\b([a-z][a-z0-9+.-]*)://([^/\s"'` + "`" + `)\[\]]+)`)
	// hostPortRE matches a dotted host name or IPv4 address with a port.
	hostPortRE = regexp.MustCompile(`(?:^|[\s"'(\[=,])((?:[A-Za-z0-9-]+\.)+[A-Za-z0-9-]+):\d{1,5}\b`)
	// ipv4RE matches an IPv4 address.
	ipv4RE = regexp.MustCompile(`\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b`)
	// placeholders are words that stand for an address in a syntax.
	placeholders = map[string]bool{"host": true, "HOST": true, "HOST:PORT": true, "host:port": true}
)

// allowedHost reports whether host may appear in an example: a name
// under .example (RFC 2606), localhost, or a loopback or unspecified
// address.
func allowedHost(host string) bool {
	if placeholders[host] || host == "" || host == "localhost" || strings.HasSuffix(host, ".example") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// TestDocsAddresses: every address in the code of the README and docs/
// (code blocks and code spans, what a reader pastes) is a name under
// .example or loopback, never one a pasted example would make a gateway
// dial on someone's network.
func TestDocsAddresses(t *testing.T) {
	n := 0
	check := func(where, code string) {
		var hosts []string
		for _, m := range urlHostRE.FindAllStringSubmatch(code, -1) {
			if m[1] == "file" {
				continue // a local file, no host
			}
			for hp := range strings.SplitSeq(strings.TrimRight(m[2], ":.;"), ",") {
				host, _, err := net.SplitHostPort(hp)
				if err != nil {
					host = hp
				}
				if _, after, ok := strings.Cut(host, "@"); ok {
					host = after
				}
				hosts = append(hosts, host)
			}
		}
		for _, m := range hostPortRE.FindAllStringSubmatch(code, -1) {
			hosts = append(hosts, m[1])
		}
		hosts = append(hosts, ipv4RE.FindAllString(code, -1)...)
		slices.Sort(hosts)
		for _, h := range slices.Compact(hosts) {
			n++
			if !allowedHost(h) {
				t.Errorf("%s: address %q: examples use names under .example or loopback", where, h)
			}
		}
	}
	for _, p := range pages(t) {
		for _, b := range p.Blocks() {
			check(fmt.Sprintf("%s:%d", p.Path, b.Line), b.Code)
		}
		for line, spans := range p.CodeSpans() {
			for _, s := range spans {
				check(fmt.Sprintf("%s:%d", p.Path, line), s)
			}
		}
	}
	if n < 20 {
		t.Fatalf("checked %d addresses, want the docs' examples", n)
	}
}

// TestDocsShellBlocks: every sh block of the README and docs/ is one a
// reader can paste as written on a fresh machine, or is clearly a
// template. Each parses (bash -n). A block not run by a test
// (<!-- runnable -->) uses no shell variable it does not set, and hands
// no absolute path to a file flag (--file, --out, --config, --data-dir,
// ...) outside /tmp: on a fresh machine the variable is empty and the
// directory missing. A block marked "<!-- template: WORDS -->" may,
// for the placeholders it lists: each must be in the block and be
// explained, in backquotes, in the prose just before or after it.
func TestDocsShellBlocks(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range pages(t) {
		lines := strings.Split(p.Text, "\n")
		for _, b := range p.Blocks() {
			if b.Lang != "sh" {
				continue
			}
			n++
			where := fmt.Sprintf("%s:%d", p.Path, b.Line)
			cmd := exec.Command(bash, "-n")
			cmd.Stdin = strings.NewReader(b.Code)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: the sh block does not parse: %v\n%s", where, err, out)
			}
			if b.Runnable != "" {
				continue
			}
			placeholder := map[string]bool{}
			near := strings.Join(lines[max(0, b.Line-14):min(len(lines), b.Line+strings.Count(b.Code, "\n")+16)], "\n")
			for _, w := range b.Placeholders {
				placeholder[w] = true
				if !strings.Contains(b.Code, w) {
					t.Errorf("%s: the template's placeholder %s is not in the block", where, w)
				}
				if !strings.Contains(near, "`"+w+"`") {
					t.Errorf("%s: the template's placeholder %s is not explained (in backquotes) next to the block", where, w)
				}
			}
			for _, v := range undefinedVars(b.Code) {
				if !placeholder["$"+v] {
					t.Errorf("%s: $%s is not set in the block: set it, or mark the block <!-- template: $%s ... --> and explain it", where, v, v)
				}
			}
			for _, m := range absFileArgRE.FindAllStringSubmatch(b.Code, -1) {
				if !strings.HasPrefix(m[2], "/tmp/") && !slices.ContainsFunc(b.Placeholders, func(w string) bool { return strings.Contains(m[0], w) }) {
					t.Errorf("%s: %s %s: a directory a fresh machine lacks; use a relative path, or a placeholder of a template", where, m[1], m[2])
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("checked %d sh blocks, want the docs' examples", n)
	}
}

var (
	// absFileArgRE matches a file or directory flag given an absolute path.
	absFileArgRE = regexp.MustCompile(`(--(?:file|out|config|data-dir|password-file|json|report|cafile|tls-ca))[ =](/\S+)`)
	// varRE matches a shell variable's expansion: $NAME, ${NAME...}, ${#NAME}.
	varRE = regexp.MustCompile(`\$(?:\{#?)?([A-Za-z_][A-Za-z0-9_]*)`)
	// singleQuotedRE matches a single-quoted string, which expands nothing.
	singleQuotedRE = regexp.MustCompile(`'[^']*'`)
	// environment are the variables every shell has.
	environment = map[string]bool{"PWD": true, "HOME": true, "PATH": true, "USER": true, "SHELL": true, "TMPDIR": true}
)

// undefinedVars returns the variables code expands without setting them
// (an assignment NAME=, a for loop, read), in order.
func undefinedVars(code string) []string {
	var out []string
	for _, m := range varRE.FindAllStringSubmatch(singleQuotedRE.ReplaceAllString(code, "''"), -1) {
		v := m[1]
		set := regexp.MustCompile(`(?m)(^|[\s;(&|])` + v + `=|\bfor ` + v + ` in\b|\bread (-\w+ )*` + v + `\b`)
		if !environment[v] && !set.MatchString(code) && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// TestMakefileCitesNoIssues: the Makefile's comments say what a target
// does, not which issue asked for it (that history is git's).
func TestMakefileCitesNoIssues(t *testing.T) {
	b, err := os.ReadFile(path.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	issue := regexp.MustCompile(`(?i)\bissues? \d+|\bissue \d+'s\b`)
	for i, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") && issue.MatchString(line) {
			t.Errorf("Makefile:%d cites an issue: %s", i+1, line)
		}
	}
}
