package admin

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestOverrideClasses: an override may carry topic classes, which then
// replace the device's rule's: stored and in force, listed, shown with
// their windows' state in the device's status. Bad classes are refused
// with 400 naming the class and field, and change nothing.
func TestOverrideClasses(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	body := `{"limit":10,"window":"1m","classes":[{"name":"alarms","topics":["devices/+/alarm/#"],"quota":{"limit":2,"window":"1m"}},` +
		`{"name":"bulk","topics":["devices/+/bulk"],"quota":{"windows":[{"bytes":1000,"window":"1h"}],"policy":"disconnect"}}]}`
	m := wantStatus(t, e.do("PUT", devPath("meter-1", "/quota"), body, nil), 200)
	classes, _ := m["classes"].([]any)
	if len(classes) != 2 || classes[0].(map[string]any)["name"] != "alarms" || classes[1].(map[string]any)["quota"].(map[string]any)["policy"] != "disconnect" {
		t.Fatalf("put answered %v", m)
	}
	want := []devicelimit.DeviceOverride{{Device: "meter-1", Override: devicelimit.Override{
		Quota: devicelimit.Quota{Limit: 10, Window: time.Minute},
		Classes: []devicelimit.Class{
			{Name: "alarms", Topics: []string{"devices/+/alarm/#"}, Quota: devicelimit.Quota{Limit: 2, Window: time.Minute}},
			{Name: "bulk", Topics: []string{"devices/+/bulk"}, Quota: devicelimit.WithWindows(devicelimit.PolicyDisconnect,
				devicelimit.Limit{Unit: devicelimit.Bytes, N: 1000, Window: time.Hour})},
		}}}}
	if s := e.state(); !reflect.DeepEqual(s.live, want) || !reflect.DeepEqual(s.stored, want) {
		t.Fatalf("state %+v, want %+v in force and stored", s, want)
	}
	// The class counts apart: two alarms use the class's window.
	now := e.clock.Now()
	for range 2 {
		if d := e.table.AllowClassAt("meter-1", "alarms", want[0].Override.Classes[0].Quota, 1, now); !d.Allowed {
			t.Fatalf("alarm refused: %+v", d)
		}
	}
	m = wantStatus(t, e.do("GET", devPath("meter-1", ""), "", nil), 200)
	cs, _ := m["classes"].([]any)
	if len(cs) != 2 {
		t.Fatalf("status lacks the override's classes: %v", m)
	}
	if q := cs[0].(map[string]any)["quota"].(map[string]any); q["used"] != 2.0 || q["remaining"] != 0.0 {
		t.Fatalf("alarms class state %v, want 2 used", q)
	}
	m = wantStatus(t, e.do("GET", "/api/v1/quotas", "", nil), 200)
	if l := m["overrides"].([]any); len(l) != 1 || len(l[0].(map[string]any)["classes"].([]any)) != 2 {
		t.Fatalf("list %v", m)
	}
	before := e.state()
	for _, c := range []struct{ classes, want string }{
		{`[{"name":"a","topics":[],"quota":{"limit":1,"window":"1s"}}]`, "invalid quota: classes[0].topics must list at least one topic filter"},
		{`[{"name":"a","topics":["a/#/b"],"quota":{"limit":1,"window":"1s"}}]`, "invalid quota: classes[0].topics[0] is not a valid topic filter"},
		{`[{"name":"a","topics":["a"],"quota":{"limit":1,"window":"1s"}},{"name":"a","topics":["b"],"quota":{"limit":1,"window":"1s"}}]`, `invalid quota: classes[1].name "a" is also the name of classes[0]`},
		{`[{"name":"a","topics":["a"],"quota":{"windows":[{"messages":1,"bytes":10,"window":"1s"}]}}]`, "classes[0].quota.windows[0]: give messages or bytes, one of them"},
		{`[{"name":"a","topics":["a"],"quota":{"windows":[{"bytes":0,"window":"1s"}]}}]`, "classes[0].quota.windows[0].bytes: must be an integer between 1 and 4294967295 (got 0)"},
		{`[{"name":"a","topics":["a"]}]`, "classes[0].quota: required"},
		{`[{"topics":["a"],"quota":{"limit":1,"window":"1s"}}]`, "classes[0].name: required"},
		{`[{"name":"","topics":["a"],"quota":{"limit":1,"window":"1s"}}]`, "invalid quota: classes[0].name must be 1 to 64 bytes"},
		{`[{"name":"a","topics":["a"],"quota":{"limit":1,"window":"1s","policy":"queue"}}]`, "classes[0].quota.policy: invalid policy: must be drop, defer or disconnect"},
		{`[{"name":"a","topics":["a"],"quota":{"limit":1,"window":"1s"},"burst":3}]`, `unknown field "burst"`},
	} {
		m := wantStatus(t, e.do("PUT", devPath("meter-1", "/quota"), `{"limit":10,"window":"1m","classes":`+c.classes+`}`, nil), 400)
		if msg, _ := m["error"].(string); !strings.Contains(msg, c.want) {
			t.Errorf("classes %s: error %q, want %q", c.classes, msg, c.want)
		}
	}
	if s := e.state(); !reflect.DeepEqual(s, before) {
		t.Fatalf("bad classes changed the state: %+v", s)
	}
}
