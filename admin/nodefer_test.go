package admin

import (
	"strings"
	"testing"

	"github.com/devicegate/devicegate/devicelimit"
)

// With Options.NoDefer (owner mode), an override with policy defer, its
// own or a class's, is refused with the reason and the field, and
// nothing is set; the same override with drop is set.
func TestOverrideDeferRefused(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	const reason = "defer cannot be used here"
	e.srv.opts.NoDefer = reason
	before := e.state()
	for _, c := range []struct{ body, field string }{
		{`{"limit":5,"window":"1m","policy":"defer"}`, "policy: "},
		{`{"limit":5,"window":"1m","classes":[{"name":"bulk","topics":["bulk/#"],"quota":{"limit":1,"window":"1m","policy":"defer"}}]}`, "classes[0].quota.policy: "},
	} {
		m := wantStatus(t, e.do("PUT", devPath("dev-1", "/quota"), c.body, nil), 400)
		if msg, _ := m["error"].(string); !strings.HasPrefix(msg, c.field+reason) || !strings.HasSuffix(msg, "nothing was set") {
			t.Errorf("%s: error %q, want %q and the reason", c.body, msg, c.field)
		}
		if s := e.state(); len(s.live) != len(before.live) || len(s.stored) != len(before.stored) {
			t.Fatalf("%s: refused, but the overrides changed: %+v", c.body, s)
		}
	}
	wantStatus(t, e.do("PUT", devPath("dev-1", "/quota"), `{"limit":5,"window":"1m","policy":"drop"}`, nil), 200)
	e.srv.opts.NoDefer = ""
	wantStatus(t, e.do("PUT", devPath("dev-2", "/quota"), `{"limit":5,"window":"1m","policy":"defer"}`, nil), 200)
}
