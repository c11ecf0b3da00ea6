package console_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/gatewaytest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/server"
)

const token = "console-test-token"

// xssID is a device ID that would run a script if a page put it in as
// HTML.
const xssID = `<img src=x onerror=alert(1)>`

// startGateway starts a gateway whose devices get 3 messages an hour
// (dropped above); "bad-*" devices 1 an hour, blocked for an hour after
// 2 refusals; "fwd-*" 1000 an hour in group fleet (5000 an hour), their
// fwd/# messages forwarded to upstream; "slow-*" 1 an hour, deferred
// above.
func startGateway(t *testing.T, upstream string, console bool) *server.Gateway {
	t.Helper()
	hour := config.Duration(time.Hour)
	cfg := config.Default()
	cfg.MQTT.TCP = "127.0.0.1:0"
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.Admin.Token = token
	cfg.Admin.Console = console
	cfg.DataDir = t.TempDir()
	cfg.Persist.SnapshotInterval = config.Duration(100 * time.Millisecond)
	cfg.Limits.Default = config.Quota{Limit: 3, Window: hour, Policy: devicelimit.PolicyDrop}
	cfg.Limits.Rules = []config.Rule{
		{Name: "bad", Match: config.Match{ClientID: "bad-*"},
			Quota: config.Quota{Limit: 1, Window: hour, Block: &config.Block{After: 2, Within: config.Duration(time.Minute), For: hour}}},
		{Name: "forwarders", Match: config.Match{ClientID: "fwd-*"}, Quota: config.Quota{Limit: 1000, Window: hour},
			Group: &config.Group{Name: "fleet", Quota: config.Quota{Limit: 5000, Window: hour}}},
		{Name: "slow", Match: config.Match{ClientID: "slow-*"}, Quota: config.Quota{Limit: 1, Window: hour, Policy: devicelimit.PolicyDefer}},
	}
	if upstream != "" {
		cfg.Forward = []config.Forward{{Name: "cloud", To: "mqtt://" + upstream, Topics: []string{"fwd/#"}, MaxQoS: 1}}
	}
	return gatewaytest.Start(t, cfg)
}

// apiGet GETs an admin API path with the token.
func apiGet(t *testing.T, base, path string) string {
	t.Helper()
	_, body := request(t, "GET", base+path, token)
	return body
}

// request sends a request without a body, with tok as the bearer token
// unless "", and does not follow redirects.
func request(t *testing.T, method, url, tok string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestConsoleInBrowser drives the console in headless Chromium against a
// real gateway with real MQTT devices and a real upstream: log in (a
// wrong token refused), find a flooding device among the throttled, see
// its full window and retry-after, set an override through the form (a
// bad one first, its field marked) and see the device judged by it,
// see a block's reason on Blocks and on the device's page, lift it from
// Blocks and see the device connect again, see a device's deferred
// messages listed on its page, see the
// forwarding backlog grow and the error while the upstream is down,
// switch a rule to shadow mode and see its would-refuse count;
// a device ID made of HTML shows as text. Every page is screenshot;
// the overview weighs under 200 KB and no request leaves the origin.
func TestConsoleInBrowser(t *testing.T) {
	up := mosquittotest.Start(t)
	g := startGateway(t, up.Addr, true)
	addr := g.Addr().String()
	base := "http://" + g.AdminAddr().String()
	b := startBrowser(t)

	// Devices: a quiet one, a flooding one, the XSS one, a forwarder.
	quiet := mqtttest.Dial5(t, addr, "quiet-1")
	quiet.MustPublish(t, "devices/quiet-1/t", "m", mqtttest.CodeSuccess)
	flood := mqtttest.Dial5(t, addr, "flood-1")
	for range 3 {
		flood.MustPublish(t, "devices/flood-1/t", "m", mqtttest.CodeSuccess)
	}
	for range 2 {
		flood.MustPublish(t, "devices/flood-1/t", "m", mqtttest.CodeQuotaExceeded)
	}
	xss := mqtttest.Dial5(t, addr, xssID)
	for range 3 {
		xss.MustPublish(t, "devices/x/t", "m", mqtttest.CodeSuccess)
	}
	xss.MustPublish(t, "devices/x/t", "m", mqtttest.CodeQuotaExceeded)
	fwd := mqtttest.Dial5(t, addr, "fwd-1")
	fwd.MustPublish(t, "fwd/1", "m", mqtttest.CodeSuccess)

	// A wrong token is refused; the right one opens the overview.
	b.do("open the console", chromedp.Navigate(base+"/ui/"))
	b.waitFor("the login form", `!document.getElementById("login").hidden`)
	b.do("log in wrongly", chromedp.SetValue(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.CSS(`#login-form button`)))
	b.waitFor("the refusal", `document.getElementById("login-error").textContent.includes("Token refused")`)
	if got := eval[string](b, `sessionStorage.getItem("devicegate.token")`+` || ""`); got != "" {
		t.Fatalf("a refused token was kept: %q", got)
	}
	b.do("log in", chromedp.SetValue(chromedp.ID("token"), token), chromedp.Click(chromedp.CSS(`#login-form button`)))
	b.waitFor("the overview", `document.getElementById("card-connected") !== null`)
	if got := eval[string](b, `document.getElementById("card-connected").querySelector(".value").textContent`); got != "4" {
		t.Fatalf("overview: %s connected, want 4", got)
	}
	if loc := eval[string](b, `location.href`); strings.Contains(loc, token) {
		t.Fatalf("the token is in the URL: %s", loc)
	}
	b.shot("overview")

	// The flooding device among the throttled, then its page.
	b.do("devices", chromedp.Navigate(base+"/ui/#/devices"))
	b.waitFor("the device list", `document.querySelectorAll("#devices .device-row").length === 4`)
	b.do("filter throttled", chromedp.Click(chromedp.ID("filter-throttled")), chromedp.Click(chromedp.ID("apply")))
	b.waitFor("the throttled devices", `location.hash.includes("filter=throttled") && document.querySelectorAll("#devices .device-row").length === 2`)
	got := eval[[]string](b, `[...document.querySelectorAll("#devices .device-link")].map(a => a.textContent)`)
	if len(got) != 2 || got[0] != xssID || got[1] != "flood-1" {
		t.Fatalf("throttled devices: %q, want the XSS device and flood-1", got)
	}
	if n := eval[int](b, `document.querySelectorAll("img").length`); n != 0 {
		t.Fatalf("%d img elements in the page: a device ID was taken as HTML", n)
	}
	b.shot("devices")
	b.do("open flood-1", chromedp.Click(chromedp.CSS(`a.device-link[href="#/device/flood-1"]`)))
	b.waitFor("flood-1's page", `document.getElementById("device-id") && document.getElementById("device-id").textContent === "flood-1"`)
	if got := eval[string](b, `document.getElementById("client-id").textContent + " " + document.getElementById("connection").textContent`); got != "flood-1 connected" {
		t.Fatalf("flood-1's connection: %q", got)
	}
	if got := eval[string](b, `document.querySelector("#device-windows tr.window").className + " " + document.querySelector("#device-windows .used").textContent`); got != "window full 3 / 3" {
		t.Fatalf("flood-1's window: %q, want full, 3 / 3", got)
	}
	retry := eval[string](b, `document.getElementById("retry-after").textContent`)
	// The oldest count leaves the window with its bucket (an hour / 20).
	if d, err := time.ParseDuration(strings.TrimPrefix(retry, "refused, retry after ")); err != nil || d < 57*time.Minute || d > 63*time.Minute {
		t.Fatalf("retry after: %q, want refused, retry after an hour, give or take a bucket of 3m", retry)
	}
	if n := eval[int](b, `document.querySelectorAll("#refusals tr").length`); n != 3 { // a header and two refusals
		t.Fatalf("recent refusals: %d rows, want a header and 2", n)
	}
	b.shot("device")

	// A bad override: the field is named and marked; nothing changes.
	b.do("a bad override", chromedp.SetValue(chromedp.ID("ov-limit"), "10"), chromedp.SetValue(chromedp.ID("ov-window"), "soon"),
		chromedp.Click(chromedp.ID("ov-submit")))
	b.waitFor("the field error", `document.getElementById("ov-error").textContent.startsWith("window:")`)
	if !eval[bool](b, `document.getElementById("ov-window").classList.contains("invalid")`) {
		t.Fatal("the window field is not marked invalid")
	}
	b.shot("device-override-error")
	flood.MustPublish(t, "devices/flood-1/t", "m", mqtttest.CodeQuotaExceeded)
	// A good one: the device's next publishes are judged by it (3 of
	// its 10 used already).
	b.do("an override", chromedp.SetValue(chromedp.ID("ov-window"), "1h"), chromedp.Click(chromedp.ID("ov-submit")))
	b.waitFor("the override in force", `document.getElementById("source") && document.getElementById("source").textContent === "override"`)
	for range 7 {
		flood.MustPublish(t, "devices/flood-1/t", "m", mqtttest.CodeSuccess)
	}
	flood.MustPublish(t, "devices/flood-1/t", "m", mqtttest.CodeQuotaExceeded)

	// The XSS device's page shows its ID as text.
	b.do("the XSS device", chromedp.Navigate(base+"/ui/#/device/"+url.PathEscape(xssID)))
	b.waitFor("its page", `document.getElementById("device-id") && document.getElementById("device-id").textContent === `+js(xssID))
	if n := eval[int](b, `document.querySelectorAll("img").length`); n != 0 {
		t.Fatalf("%d img elements on the XSS device's page", n)
	}
	b.shot("device-xss")

	// A blocked device is lifted from Blocks and connects again.
	bad := mqtttest.Dial5(t, addr, "bad-1")
	bad.MustPublish(t, "devices/bad-1/t", "m", mqtttest.CodeSuccess)
	for range 2 {
		_, _, _ = bad.PublishReason("devices/bad-1/t", "m")
	}
	poll.Until(t, 10*time.Second, "bad-1 blocked", func() bool { return strings.Contains(apiGet(t, base, "/api/v1/blocks"), "bad-1") })
	if code, _ := mqtttest.ConnectCode(t, addr, "bad-1"); code == 0 {
		t.Fatal("blocked bad-1 connected")
	}
	b.do("blocks", chromedp.Navigate(base+"/ui/#/blocks"))
	b.waitFor("bad-1 listed", `[...document.querySelectorAll(".block-select")].some(x => x.value === "bad-1")`)
	b.shot("blocks")
	// The block says why, on Blocks and on the device's page.
	const why = "2 refusals over quota within 1m0s (quota: 1 messages per 1h0m0s)"
	if got := eval[string](b, `document.querySelector("#blocks .block-row .block-reason").textContent`); got != why {
		t.Fatalf("the block's reason on Blocks: %q, want %q", got, why)
	}
	b.do("bad-1's page", chromedp.Navigate(base+"/ui/#/device/bad-1"))
	b.waitFor("its block's reason", `document.getElementById("block-reason") !== null`)
	if got := eval[string](b, `document.getElementById("block-reason").textContent`); got != "why: "+why {
		t.Fatalf("the block's reason on bad-1's page: %q, want why: %q", got, why)
	}
	b.shot("device-blocked")
	b.do("blocks again", chromedp.Navigate(base+"/ui/#/blocks"))
	b.waitFor("bad-1 listed", `[...document.querySelectorAll(".block-select")].some(x => x.value === "bad-1")`)
	b.do("lift bad-1", chromedp.Click(chromedp.CSS(`.block-select[value="bad-1"]`)), chromedp.Click(chromedp.CSS(`#page button.danger`)))
	b.waitFor("the confirmation", `document.querySelector(".confirm-yes") !== null`)
	b.do("confirm", chromedp.Click(chromedp.CSS(`.confirm-yes`)))
	b.waitFor("the block lifted", `document.querySelector("#page .notice") && document.querySelector("#page .notice").textContent.startsWith("Lifted 1 block")`)
	if code, reason := mqtttest.ConnectCode(t, addr, "bad-1"); code != 0 {
		t.Fatalf("bad-1 after the lift: CONNACK 0x%02x %s, want accepted", code, reason)
	}

	// A deferring device's page lists its queue, oldest first.
	slow := mqtttest.Dial5(t, addr, "slow-1")
	slow.MustPublish(t, "devices/slow-1/t", "admitted", mqtttest.CodeSuccess)
	for i := range 3 {
		slow.MustPublish(t, "devices/slow-1/q"+strconv.Itoa(i), strings.Repeat("x", 10+i), mqtttest.CodeSuccess) // deferred
	}
	b.do("slow-1's page", chromedp.Navigate(base+"/ui/#/device/slow-1"))
	b.waitFor("its deferred messages", `document.querySelectorAll("#deferred-list .deferred-row").length === 3`)
	if got := eval[string](b, `[...document.querySelector("#deferred-list .deferred-row").cells].slice(0, 3).map(c => c.textContent).join(" ")`); got != "devices/slow-1/q0  10 B" {
		t.Fatalf("slow-1's first deferred message: %q, want its topic, no class, 10 B", got)
	}
	if got := eval[string](b, `document.getElementById("deferred-count").textContent`); got != "3, oldest first" {
		t.Fatalf("slow-1's deferred count: %q", got)
	}
	b.shot("device-deferred")

	// The upstream stops: the backlog grows and the error shows.
	poll.Until(t, 10*time.Second, "fwd/1 forwarded", func() bool { return strings.Contains(apiGet(t, base, "/api/v1/forward"), `"forwarded":1`) })
	up.Stop()
	poll.Until(t, 10*time.Second, "the upstream seen down", func() bool {
		return strings.Contains(apiGet(t, base, "/api/v1/forward"), `"last_error"`)
	})
	for range 3 {
		fwd.MustPublish(t, "fwd/1", "m", mqtttest.CodeSuccess)
	}
	b.do("forwarding", chromedp.Navigate(base+"/ui/#/forwarding"))
	b.waitFor("a backlog and the error", `document.querySelector("#forward .backlog") && Number(document.querySelector("#forward .backlog").textContent) >= 3 && document.querySelector("#forward .last-error").textContent !== "—"`)
	first := eval[int](b, `Number(document.querySelector("#forward .backlog").textContent)`)
	b.shot("forwarding")
	for range 5 {
		fwd.MustPublish(t, "fwd/1", "m", mqtttest.CodeSuccess)
	}
	// The page refreshes itself.
	b.waitFor("the backlog grown", `Number(document.querySelector("#forward .backlog").textContent) >= `+strconv.Itoa(first+5))

	// Groups and rules pages render; a rule switches to shadow mode.
	b.do("rules", chromedp.Navigate(base+"/ui/#/rules"))
	b.waitFor("the rules", `document.querySelectorAll("#rules .rule-switch").length === 3`)
	b.do("switch bad to shadow", chromedp.Click(chromedp.CSS(`#rules .rule-switch`)))
	b.waitFor("bad in shadow mode", `document.querySelector("#rules td.bad") && document.querySelector("#rules td.bad").textContent === "shadow"`)
	var rules struct {
		Rules []struct {
			Rule    string `json:"rule"`
			Enforce bool   `json:"enforce"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(apiGet(t, base, "/api/v1/rules")), &rules); err != nil || len(rules.Rules) == 0 || rules.Rules[0].Enforce {
		t.Fatalf("rules after the switch: %+v %v, want bad in shadow mode", rules, err)
	}
	// bad-1 over its quota, now in shadow mode: let through, counted.
	again := mqtttest.Dial5(t, addr, "bad-1")
	again.MustPublish(t, "devices/bad-1/t", "m", mqtttest.CodeSuccess)
	eval[bool](b, `route(), true`)
	b.waitFor("bad's would-refuse", `document.querySelector("#rules td.num") && document.querySelector("#rules td.num").textContent === "1"`)
	b.shot("rules")
	// fwd-1's page shows its group's windows; Groups lists the group.
	b.do("fwd-1", chromedp.Navigate(base+"/ui/#/device/fwd-1"))
	b.waitFor("fwd-1's group windows", `document.querySelector("#group-windows .used") !== null`)
	if got := eval[string](b, `document.querySelector("#group-windows .used").textContent`); !strings.HasSuffix(got, " / 5000") {
		t.Fatalf("fleet's window on fwd-1's page: %q, want n / 5000", got)
	}
	b.do("groups", chromedp.Navigate(base+"/ui/#/groups"))
	b.waitFor("fleet's windows", `document.querySelector("#group-fleet .used") !== null`)
	b.shot("groups")

	// The overview, loaded afresh: its weight, and its origin.
	b.do("leave", chromedp.Navigate("about:blank"))
	b.resetRequests()
	b.do("the overview again", chromedp.Navigate(base+"/ui/"))
	b.waitFor("the overview", `document.getElementById("card-connected") !== null && document.querySelector(".chart svg") !== null`)
	urls, bytes := b.requests()
	if bytes == 0 || bytes > 200*1024 {
		t.Fatalf("the overview loaded %.0f bytes over the wire, want some, under 200 KB", bytes)
	}
	t.Logf("overview: %.0f bytes over the wire in %d requests", bytes, len(urls))
	b.shot("overview-final")
	b.text("overview-final")

	for _, u := range b.allRequests() {
		if !strings.HasPrefix(u, base+"/") && u != "about:blank" {
			t.Errorf("a request left the gateway's origin: %s", u)
		}
	}
	if d := b.openDialogs(); len(d) != 0 {
		t.Fatalf("dialogs opened: %q (a device ID ran as script?)", d)
	}

	// A token that stops working (changed, the gateway restarted) sends
	// the console back to the login form, and is dropped.
	eval[bool](b, `sessionStorage.setItem("devicegate.token", "stale"), route(), true`)
	b.waitFor("the login form again", `!document.getElementById("login").hidden && document.getElementById("login-error").textContent.includes("refused")`)
	if got := eval[string](b, `sessionStorage.getItem("devicegate.token")`+` || ""`); got != "" {
		t.Fatalf("a refused token was kept: %q", got)
	}
}
