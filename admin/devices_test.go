package admin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// listing asks GET /api/v1/devices?query and returns the IDs listed and
// the total.
func (e *env) listing(query string) ([]string, int) {
	e.t.Helper()
	r := e.do("GET", "/api/v1/devices?"+query, "", nil)
	if r.status != 200 {
		e.t.Fatalf("GET /api/v1/devices?%s: %d %s", query, r.status, r.body)
	}
	var out DeviceListJSON
	if err := json.Unmarshal(r.body, &out); err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for _, d := range out.Devices {
		ids = append(ids, d.Device)
	}
	return ids, out.Total
}

// The listing searches by prefix, filters (each filter must hold),
// sorts and pages; devices known only by their block or their override
// are listed too.
func TestListDevices(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	now := e.clock.Now()
	e.devices.m = map[string]DeviceStatus{
		"sensor-1": {Connected: true, ClientID: "sensor-1", LastSeen: now.Add(-time.Minute), Deferred: 4},
		"sensor-2": {LastSeen: now.Add(-time.Hour)},
		"meter-1":  {Connected: true, ClientID: "meter-1", LastSeen: now.Add(-time.Second)},
		"meter-2":  {},
	}
	e.devices.refused = map[string]DeviceSummary{
		"sensor-2": {Refusals: 50, LastRefused: now.Add(-time.Hour)}, // not lately
		"meter-1":  {Refusals: 7, LastRefused: now.Add(-time.Minute)},
		"sensor-1": {Recent: 9, Use: 40},
		"meter-2":  {Recent: 2, Use: 90},
	}
	if r := e.do("PUT", "/api/v1/devices/only-override/quota", `{"limit": 5, "window": "10s", "enforce": false}`, nil); r.status != 200 {
		t.Fatalf("set override: %d %s", r.status, r.body)
	}
	for _, c := range []struct {
		query string
		want  string // IDs listed, comma-separated
		total int
	}{
		{"", "meter-1,meter-2,only-override,sensor-1,sensor-2", 5},
		{"prefix=sensor-", "sensor-1,sensor-2", 2},
		{"prefix=meter-1", "meter-1", 1},
		{"filter=throttled", "meter-1", 1},
		{"filter=deferring", "sensor-1", 1},
		{"filter=override", "only-override", 1},
		{"filter=shadow", "only-override", 1},
		{"filter=throttled&filter=deferring", "", 0},
		{"sort=refusals", "sensor-2,meter-1,meter-2,only-override,sensor-1", 5},
		{"sort=deferred&limit=1", "sensor-1", 5},
		{"sort=last_seen&limit=2", "meter-1,sensor-1", 5},
		{"offset=3&limit=1", "sensor-1", 5},
		{"offset=9", "", 5},
		{"sort=rate", "sensor-1,meter-2,meter-1,only-override,sensor-2", 5},
		{"sort=use&limit=2", "meter-2,sensor-1", 5},
		{"filter=connected", "meter-1,sensor-1", 2},
		{"rule=default", "meter-1,meter-2,only-override", 3}, // overridden or not
		{"rule=sensors", "sensor-1,sensor-2", 2},
		{"rule=nosuch", "", 0},
	} {
		ids, total := e.listing(c.query)
		if got := strings.Join(ids, ","); got != c.want || total != c.total {
			t.Errorf("?%s: got %q of %d, want %q of %d", c.query, got, total, c.want, c.total)
		}
	}
	for _, c := range []struct{ query, want string }{
		{"filter=loud", `filter must be one of throttled, blocked, deferring, shadow, override, connected (got "loud")`},
		{"sort=size", `sort must be one of device, refusals, deferred, last_seen, rate, use (got "size")`},
		{"limit=0", `limit must be an integer between 1 and 500 (got "0")`},
		{"offset=-1", `offset must be an integer of 0 or more (got "-1")`},
		{"prefix=a&prefix=b", `prefix given more than once`},
		{"colour=red", `unknown parameter "colour"`},
	} {
		r := e.do("GET", "/api/v1/devices?"+c.query, "", nil)
		if r.status != 400 || !strings.Contains(string(r.body), strings.ReplaceAll(c.want, `"`, `\"`)) {
			t.Errorf("?%s: %d %s, want 400 with %s", c.query, r.status, r.body, c.want)
		}
	}
}

// A device's status carries its connection and its recent refusals.
func TestDeviceConnectionAndRefusals(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	now := e.clock.Now()
	e.devices.m["dev-1"] = DeviceStatus{Connected: true, ClientID: "dev-1", Remote: "device-7.example:50123", Protocol: 5, Since: now.Add(-time.Minute)}
	e.devices.recent = map[string][]Refusal{"dev-1": {{At: now, Topic: "devices/dev-1/t", Reason: "quota exceeded"}}}
	var d DeviceJSON
	r := e.do("GET", "/api/v1/devices/dev-1", "", nil)
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatal(err)
	}
	want := RefusalJSON{At: formatTick(now), Topic: "devices/dev-1/t", Reason: "quota exceeded"}
	if d.ClientID != "dev-1" || d.Remote != "device-7.example:50123" || d.Protocol != 5 || d.ConnectedSince != formatTick(now.Add(-time.Minute)) ||
		len(d.Refusals) != 1 || d.Refusals[0] != want {
		t.Fatalf("got %s", r.body)
	}
}

// The rate ring turns counters sampled at fixed instants into rates per
// second, keeps RateSpan of them, and never reports a negative rate.
func TestRateRing(t *testing.T) {
	var r rateRing
	r.tick(t0, rateCounters{admitted: 100})
	if got := r.list(); len(got) != 0 {
		t.Fatalf("after one tick: %v, want no sample", got)
	}
	r.tick(t0.Add(5*time.Second), rateCounters{admitted: 150, refused: 10, deferred: 5, wouldRefuse: 1})
	got := r.list()
	want := RateJSON{At: formatTick(t0.Add(5 * time.Second)), Admitted: 10, Refused: 2, Deferred: 1, WouldRefuse: 0.2}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("got %v, want [%v]", got, want)
	}
	at := t0.Add(5 * time.Second)
	for i := range 200 {
		at = at.Add(RateInterval)
		r.tick(at, rateCounters{admitted: uint64(200 + i)})
	}
	got = r.list()
	if n := int(RateSpan / RateInterval); len(got) != n || got[n-1].At != formatTick(at) || got[n-1].Admitted != 0.2 {
		t.Fatalf("after 200 more: %d samples, last %v; want %d, the last at %s admitting 0.2/s", len(got), got[len(got)-1], n, formatTick(at))
	}
	if got[0].Refused != 0 { // the refused counter went back to 0 (a restart of the source)
		t.Fatalf("refused %v, want 0", got[0].Refused)
	}
}
