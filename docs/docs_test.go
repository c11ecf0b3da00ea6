// Package docs holds the user documentation; its tests keep the
// examples of README.md and docs/*.md true.
package docs_test

import (
	"fmt"
	"net"
	"os"
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
