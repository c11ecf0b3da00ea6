package server

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/logtest"
	"github.com/devicegate/devicegate/internal/openapicheck"
)

// TestReloadAnswersMatchOpenAPI: POST /api/v1/reload answers 200 with
// the changed keys, 409 naming a key that needs a restart and 400 for a
// configuration that cannot be read, each as admin/openapi.json says;
// only the 200 changes the gateway.
func TestReloadAnswersMatchOpenAPI(t *testing.T) {
	cfg := testConfig(t.TempDir(), 5, time.Hour)
	cfg.Admin.Token = "test-token"
	next := cfg
	var loadErr error
	g := mustStart(t, cfg, Deps{Load: func() (config.Config, error) { return next, loadErr }})
	base := "http://" + g.AdminAddr().String()
	doc, err := openapicheck.Parse([]byte(httpGet(t, base+"/api/v1/openapi.json", "")))
	if err != nil {
		t.Fatal(err)
	}
	post := func(want int, body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/api/v1/reload", nil)
		req.Header.Set("Authorization", "Bearer test-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(b), body) {
			t.Fatalf("POST /api/v1/reload: %d %s, want %d with %q", resp.StatusCode, b, want, body)
		}
		if err := doc.Check("POST", "/api/v1/reload", resp.StatusCode, resp.Header.Get("Content-Type"), b); err != nil {
			t.Errorf("%v\n  body: %s", err, b)
		}
	}
	next.Limits.Default.Limit = 7
	post(200, `{"changes":[{"key":"limits.default.limit","old":"5","new":"7"}]}`)
	if g.resolver.Default().Limit != 7 {
		t.Fatalf("default quota %d after the reload, want 7", g.resolver.Default().Limit)
	}
	next.MQTT.MaxConnections = 9
	next.Limits.Default.Limit = 8
	post(409, `mqtt.max_connections: cannot change without a restart (running \"50000\", file \"9\")`)
	loadErr = io.ErrUnexpectedEOF
	post(400, "unexpected EOF")
	if g.resolver.Default().Limit != 7 {
		t.Fatalf("default quota %d after refused reloads, want 7", g.resolver.Default().Limit)
	}
}

// TestReloadACLInAllowAllWarns: with authentication off no topic ACL is
// checked, so a reload that changes auth.acl warns that the change
// applies to nothing; a reload that changes other keys does not.
func TestReloadACLInAllowAllWarns(t *testing.T) {
	logs := new(logtest.Capture)
	cfg := testConfig(t.TempDir(), 5, time.Hour)
	g := mustStart(t, cfg, Deps{Logger: slog.New(logs)})
	next := cfg
	next.Limits.Default.Limit = 6
	if _, err := g.Reload(next); err != nil {
		t.Fatal(err)
	}
	const warning = "auth.acl changed but applies to nothing"
	if rec := logs.Find(warning); rec != nil {
		t.Fatalf("warned with auth.acl unchanged: %v", rec)
	}
	next.Auth.ACL.Publish = "sensors/{device}/#"
	changes, err := g.Reload(next)
	if err != nil || len(changes) != 1 || changes[0].Key != "auth.acl.publish" {
		t.Fatalf("reload: %v, %v", changes, err)
	}
	if rec := logs.Find(warning); rec == nil || rec["level"] != "WARN" || rec["acl_publish"] != "sensors/{device}/#" {
		t.Fatalf("no warning that auth.acl applies to nothing in allow-all:\n%s", logs)
	}
}
