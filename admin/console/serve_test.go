package console_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/admin/console"
)

// The console's files come with the CSP and the other headers; /ui
// leads to /ui/; what is not a file is a 404; nothing but GET and HEAD.
// The page has no inline script or style, and the script no HTML sink.
func TestConsoleServed(t *testing.T) {
	g := startGateway(t, "", true)
	base := "http://" + g.AdminAddr().String()
	files := []struct {
		path, ctype string
	}{
		{"/ui/", "text/html"},
		{"/ui/console.css", "text/css"},
		{"/ui/favicon.svg", "image/svg+xml"},
	}
	// Every script the page loads, each with no HTML sink, under the
	// size the static files keep to.
	scripts := regexp.MustCompile(`<script src="([a-z]+\.js)" defer></script>`).FindAllStringSubmatch(mustGet(t, base+"/ui/"), -1)
	if len(scripts) < 5 {
		t.Fatalf("the page loads %d scripts, want the console's (core.js ...)", len(scripts))
	}
	for _, m := range scripts {
		files = append(files, struct{ path, ctype string }{"/ui/" + m[1], "text/javascript"})
	}
	for _, c := range files {
		resp, body := request(t, "GET", base+c.path, "")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), c.ctype) {
			t.Fatalf("%s: %d %s, want 200 %s", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), c.ctype)
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != console.Policy {
			t.Errorf("%s: CSP %q, want %q", c.path, got, console.Policy)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", c.path, resp.Header)
		}
		if c.path == "/ui/" && regexp.MustCompile(`<script>|<script [^>]*>[^<]|<style|\sstyle=|\son[a-z]+=`).MatchString(body) {
			t.Errorf("the page holds inline script or style")
		}
		if strings.HasSuffix(c.path, ".js") {
			if regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`).MatchString(body) {
				t.Errorf("%s uses an HTML sink or eval", c.path)
			}
			if n := strings.Count(body, "\n"); n > 500 {
				t.Errorf("%s: %d lines, want 500 at most (split it by view)", c.path, n)
			}
		}
	}
	if !strings.Contains(console.Policy, "script-src 'self'") || strings.Contains(console.Policy, "unsafe") {
		t.Errorf("CSP %q allows more than the origin's scripts", console.Policy)
	}
	if resp, _ := request(t, "GET", base+"/ui", ""); resp.StatusCode != 301 || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("/ui: %d to %q, want 301 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, p := range []string{"/ui/nosuch.js", "/ui/static/index.html", "/ui/..%2fconsole.go"} {
		if resp, _ := request(t, "GET", base+p, ""); resp.StatusCode != 404 {
			t.Errorf("%s: %d, want 404", p, resp.StatusCode)
		}
	}
	if resp, _ := request(t, "POST", base+"/ui/", ""); resp.StatusCode != 405 {
		t.Errorf("POST /ui/: %d, want 405", resp.StatusCode)
	}
}

// admin.console: false: /ui/ is an unknown path, the API unchanged.
func TestConsoleOff(t *testing.T) {
	g := startGateway(t, "", false)
	base := "http://" + g.AdminAddr().String()
	for _, p := range []string{"/ui/", "/ui/core.js", "/ui"} {
		if resp, body := request(t, "GET", base+p, ""); resp.StatusCode != 404 || !strings.Contains(body, "no such route") {
			t.Errorf("%s with the console off: %d %s, want the API's 404", p, resp.StatusCode, body)
		}
	}
	if body := apiGet(t, base, "/api/v1/rates"); !strings.Contains(body, `"samples"`) {
		t.Errorf("the API with the console off: %s", body)
	}
}

// mustGet returns a GET's body, failing on another status than 200.
func mustGet(t *testing.T, url string) string {
	t.Helper()
	resp, body := request(t, "GET", url, "")
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	return body
}
