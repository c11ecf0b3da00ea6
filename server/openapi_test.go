package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/freeport"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/openapicheck"
	"github.com/devicegate/devicegate/internal/poll"
)

// TestAdminAnswersMatchOpenAPI: every answer of a real gateway's admin
// API, successes and errors, has a status the served OpenAPI document
// lists for the operation and the shape it documents, no field more
// (internal/openapicheck). The gateway holds something of everything the
// answers show: rules with topic classes, a group, several windows of
// messages and bytes, shadow mode and blocking; devices throttled,
// deferred and blocked; device and group overrides; an upstream that is
// down.
func TestAdminAnswersMatchOpenAPI(t *testing.T) {
	dead, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	hour, minute := config.Duration(time.Hour), config.Duration(time.Minute)
	shadow := false
	cfg := testConfig(t.TempDir(), 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	cfg.Limits.Rules = []config.Rule{
		{Name: "tenants", Match: config.Match{ClientID: "t-{tenant}-*"},
			Quota:   config.Quota{Limit: 2, Window: hour, Block: &config.Block{After: 2, Within: minute, For: hour}},
			Classes: []config.Class{{Name: "alarms", Topics: []string{"alarms/#"}, Quota: config.Quota{Limit: 5, Window: hour}}},
			Group:   &config.Group{Name: "{tenant}", Quota: config.Quota{Limit: 10, Window: hour}}},
		{Name: "sensors", Match: config.Match{ClientID: "sensor-*"}, Quota: config.Quota{Policy: devicelimit.PolicyDefer,
			Windows: []config.QuotaWindow{{Messages: 2, Window: minute}, {Bytes: 1 << 20, Window: hour}}}},
		{Name: "trial", Match: config.Match{ClientID: "trial-*"}, Quota: config.Quota{Limit: 1, Window: hour, Enforce: &shadow}},
	}
	cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + dead, Topics: []string{"devices/#"}, MaxQoS: 1}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{})
	base := "http://" + g.AdminAddr().String()
	doc, err := openapicheck.Parse([]byte(httpGet(t, base+"/api/v1/openapi.json", "")))
	if err != nil {
		t.Fatal(err)
	}

	// Traffic: a tenant's device refused twice and blocked; a sensor
	// deferred; a trial device over its shadow quota; one to the
	// upstream, which waits.
	addr := g.Addr().String()
	tenant := mqtttest.Dial5(t, addr, "t-acme-1")
	tenant.MustPublish(t, "alarms/fire", "a", mqtttest.CodeSuccess)
	for range 2 {
		tenant.MustPublish(t, "devices/t-acme-1/t", "m", mqtttest.CodeSuccess)
	}
	tenant.MustPublish(t, "devices/t-acme-1/t", "m", mqtttest.CodeQuotaExceeded)
	_, _, _ = tenant.PublishReason("devices/t-acme-1/t", "m") // the second refusal: blocked
	sensor := mqtttest.Dial5(t, addr, "sensor-1")
	for range 3 {
		sensor.MustPublish(t, "devices/sensor-1/t", "m", mqtttest.CodeSuccess) // the third deferred
	}
	trial := mqtttest.Dial5(t, addr, "trial-1")
	for range 2 {
		trial.MustPublish(t, "devices/trial-1/t", "m", mqtttest.CodeSuccess)
	}
	poll.Until(t, 10*time.Second, "t-acme-1 blocked", func() bool {
		return strings.Contains(httpGet(t, base+"/api/v1/blocks", "test-token"), "t-acme-1")
	})
	poll.Until(t, 10*time.Second, "the upstream's next attempt", func() bool { return g.forward.Stats()[0].RetryIn > 0 })

	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	type call struct {
		method, path, template, body string
		want                         int
	}
	calls := []call{
		{"GET", "/healthz", "", "", 200},
		{"GET", "/metrics", "", "", 200},
		{"PUT", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", `{"limit": 5, "window": "10s", "policy": "drop", "expires_at": "` + future + `"}`, 200},
		{"PUT", "/api/v1/devices/dev-8/quota", "/api/v1/devices/{id}/quota", `{"windows": [{"messages": 5, "window": "10s"}, {"bytes": 1000, "window": "1h"}], "enforce": false}`, 200},
		{"PUT", "/api/v1/devices/dev-7/quota", "/api/v1/devices/{id}/quota", `{"limit": 5, "window": "10s", "classes": [{"name": "bulk", "topics": ["bulk/#"], "quota": {"limit": 1, "window": "1s"}}]}`, 200},
		{"PUT", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", `{"limit": 0, "window": "10s"}`, 400},
		{"PUT", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", `{"limit": 5}`, 400},
		{"PUT", "/api/v1/groups/acme/quota", "/api/v1/groups/{name}/quota", `{"limit": 20, "window": "1h"}`, 200},
		{"PUT", "/api/v1/groups/acme/quota", "/api/v1/groups/{name}/quota", `{"limit": 20, "window": "1h", "policy": "drop"}`, 400},
		{"PUT", "/api/v1/groups/not-a-tenant/quota", "/api/v1/groups/{name}/quota", `{"limit": 20, "window": "1h"}`, 200}, // {tenant} can be anything

		{"PUT", "/api/v1/rules/trial/enforce", "/api/v1/rules/{name}/enforce", `{"enforce": false}`, 200},
		{"PUT", "/api/v1/rules/tenants/enforce", "/api/v1/rules/{name}/enforce", `{"enforce": true}`, 200}, // classes and a group
		{"PUT", "/api/v1/rules/nosuch/enforce", "/api/v1/rules/{name}/enforce", `{"enforce": true}`, 404},
		{"GET", "/api/v1/devices/t-acme-1", "/api/v1/devices/{id}", "", 200},
		{"GET", "/api/v1/devices/sensor-1", "/api/v1/devices/{id}", "", 200},
		{"GET", "/api/v1/devices/sensor-1/deferred", "/api/v1/devices/{id}/deferred", "", 200},
		{"GET", "/api/v1/devices/t-acme-1/deferred?limit=5", "/api/v1/devices/{id}/deferred", "", 200},
		{"GET", "/api/v1/devices/sensor-1/deferred?limit=0", "/api/v1/devices/{id}/deferred", "", 400},
		{"GET", "/api/v1/devices/trial-1", "/api/v1/devices/{id}", "", 200},
		{"GET", "/api/v1/devices/dev-7", "/api/v1/devices/{id}", "", 200},
		{"GET", "/api/v1/devices/dev-8", "/api/v1/devices/{id}", "", 200},
		{"GET", "/api/v1/devices/never-seen", "/api/v1/devices/{id}", "", 200},
		{"GET", "/api/v1/quotas", "", "", 200},
		{"GET", "/api/v1/devices", "", "", 200},
		{"GET", "/api/v1/devices?filter=throttled&filter=blocked&sort=refusals&limit=2", "/api/v1/devices", "", 200},
		{"GET", "/api/v1/devices?prefix=t-&group=acme&filter=override", "/api/v1/devices", "", 200},
		{"GET", "/api/v1/devices?filter=shadow&sort=last_seen&offset=1", "/api/v1/devices", "", 200},
		{"GET", "/api/v1/devices?sort=colour", "/api/v1/devices", "", 400},
		{"GET", "/api/v1/devices?sort=rate&filter=connected&rule=tenants", "/api/v1/devices", "", 200},
		{"GET", "/api/v1/devices?sort=use&rule=default", "/api/v1/devices", "", 200},
		{"GET", "/api/v1/devices/sensor-1/history", "/api/v1/devices/{id}/history", "", 200},
		{"GET", "/api/v1/devices/never-seen/history", "/api/v1/devices/{id}/history", "", 200},
		{"GET", "/api/v1/forward/history", "", "", 200},
		{"GET", "/api/v1/rates", "", "", 200},
		{"GET", "/api/v1/throttled?limit=5", "/api/v1/throttled", "", 200},
		{"GET", "/api/v1/throttled?limit=x", "/api/v1/throttled", "", 400},
		{"GET", "/api/v1/forward", "", "", 200},
		{"GET", "/api/v1/forward/cloud/dead?limit=5", "/api/v1/forward/{name}/dead", "", 200},
		{"GET", "/api/v1/forward/cloud/dead?limit=0", "/api/v1/forward/{name}/dead", "", 400},
		{"GET", "/api/v1/forward/nosuch/dead", "/api/v1/forward/{name}/dead", "", 404},
		{"POST", "/api/v1/forward/cloud/dead/replay", "/api/v1/forward/{name}/dead/replay", "", 200},
		{"POST", "/api/v1/forward/nosuch/dead/replay", "/api/v1/forward/{name}/dead/replay", "", 404},
		{"DELETE", "/api/v1/forward/cloud/dead", "/api/v1/forward/{name}/dead", "", 200},
		{"GET", "/api/v1/backup", "", "", 200},
		{"POST", "/api/v1/reload", "", "", 400}, // no configuration source here
		{"GET", "/api/v1/rules", "", "", 200},
		{"GET", "/api/v1/blocks", "", "", 200},
		{"GET", "/api/v1/groups", "", "", 200},
		{"GET", "/api/v1/groups/acme", "/api/v1/groups/{name}", "", 200},
		{"GET", "/api/v1/groups/nosuch", "/api/v1/groups/{name}", "", 404},
		{"POST", "/api/v1/devices/sensor-1/reset", "/api/v1/devices/{id}/reset", "", 200},
		{"DELETE", "/api/v1/devices/t-acme-1/block", "/api/v1/devices/{id}/block", "", 200},
		{"DELETE", "/api/v1/devices/t-acme-1/block", "/api/v1/devices/{id}/block", "", 404},
		{"DELETE", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", "", 200},
		{"DELETE", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", "", 404},
		{"DELETE", "/api/v1/groups/acme/quota", "/api/v1/groups/{name}/quota", "", 200},
		{"PATCH", "/api/v1/quotas", "", "", 405},
		{"GET", "/api/v1/quotas", "", "", 401}, // without the token
		{"PUT", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", `{"limit": 5, "window": "10s", "colour": "red"}`, 400},
		{"PUT", "/api/v1/devices/dev-9/quota", "/api/v1/devices/{id}/quota", strings.Repeat(" ", 1<<20) + `{}`, 413},
		// Empty and malformed segments: 400 naming them, never the
		// mux's redirect to a cleaned path.
		{"PUT", "/api/v1/devices//quota", "/api/v1/devices/{id}/quota", `{"limit": 5, "window": "10s"}`, 400},
		{"GET", "/api/v1/devices//quota", "/api/v1/devices/{id}/quota", "", 405},
		{"DELETE", "/api/v1/devices//quota", "/api/v1/devices/{id}/quota", "", 400},
		{"GET", "/api/v1/devices/", "/api/v1/devices/{id}", "", 400},
		{"POST", "/api/v1/devices/../reset", "/api/v1/devices/{id}/reset", "", 400},
		{"DELETE", "/api/v1/devices/./block", "/api/v1/devices/{id}/block", "", 400},
		{"DELETE", "/api/v1/groups//quota", "/api/v1/groups/{name}/quota", "", 400},
		{"PUT", "/api/v1/rules//enforce", "/api/v1/rules/{name}/enforce", `{"enforce": true}`, 400},
	}
	// A redirect is an answer of its own here.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range calls {
		if c.template == "" {
			c.template = c.path
		}
		req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if !(c.want == 401) {
			req.Header.Set("Authorization", "Bearer test-token")
		}
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.StatusCode, body, c.want)
			continue
		}
		method := c.method
		if c.want == 405 {
			method = map[string]string{"/api/v1/quotas": "GET"}[c.template] // a 405 is documented on the operations of its path
			if method == "" {
				method = "PUT"
			}
		}
		if err := doc.Check(method, c.template, resp.StatusCode, resp.Header.Get("Content-Type"), body); err != nil {
			t.Errorf("%v\n  body: %s", err, body)
		}
	}
}
