package console_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/gatewaytest"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// liveConfig is a gateway's configuration for TestConsoleLive: admin
// API on adminAddr with tok, its data in dir.
func liveConfig(dir, adminAddr, tok string) config.Config {
	cfg := config.Default()
	cfg.MQTT.TCP = "127.0.0.1:0"
	cfg.Admin.Addr = adminAddr
	cfg.Admin.Token = tok
	cfg.Admin.Console = true
	cfg.DataDir = dir
	cfg.Limits.Default = config.Quota{Limit: 100, Window: config.Duration(time.Hour), Policy: devicelimit.PolicyDrop}
	return cfg
}

// TestConsoleLive: pages refresh by themselves while the operator works
// on them: a half-typed override keeps its text and its focus, a
// selection on Devices stays selected, the scroll stays where it was;
// the gateway restarting shows as unreachable and the page comes back
// by itself when it is up again; a gateway that no longer takes the
// tab's token sends the tab to the login form at its next refresh.
func TestConsoleLive(t *testing.T) {
	dir := t.TempDir()
	g, stop := gatewaytest.StartStoppable(t, liveConfig(dir, "127.0.0.1:0", token))
	admin := g.AdminAddr().String()
	base := "http://" + admin
	dev := mqtttest.Dial5(t, g.Addr().String(), "live-1")
	dev.MustPublish(t, "devices/live-1/t", "m", mqtttest.CodeSuccess)
	for i := range 80 { // enough rows to scroll
		id := "row-" + strconv.Itoa(100+i)
		c := mqtttest.Dial5(t, g.Addr().String(), id)
		c.MustPublish(t, "devices/"+id+"/t", "m", mqtttest.CodeSuccess)
		c.Close() // still tracked: seen
	}

	b := startBrowser(t)
	logIn(t, b, base)

	// A half-typed limit survives the refreshes that show new counts.
	visit(b, base, "#/device/live-1", `document.querySelector("#device-windows .used") !== null`)
	b.do("type a limit", chromedp.SetValue(chromedp.ID("ov-limit"), ""), chromedp.Focus(chromedp.ID("ov-limit")), chromedp.SendKeys(chromedp.ID("ov-limit"), "123"))
	dev.MustPublish(t, "devices/live-1/t", "m", mqtttest.CodeSuccess)
	b.waitFor("the new count shown", `document.querySelector("#device-windows .used").textContent === "2 / 100"`)
	if got := eval[string](b, `document.getElementById("ov-limit").value + " " + document.activeElement.id`); got != "123 ov-limit" {
		t.Errorf("after a refresh the limit field holds and focus is %q, want 123 ov-limit", got)
	}

	// A selection and the scroll survive the refreshes of Devices.
	visit(b, base, "#/devices?sort=rate", `document.querySelectorAll("#devices .device-row").length === 50`)
	b.do("select one", chromedp.Click(chromedp.CSS(`.device-select[value="live-1"]`)))
	eval[bool](b, `window.scrollTo(0, 600), true`)
	y := eval[float64](b, `window.scrollY`)
	dev.MustPublish(t, "devices/live-1/t", "m", mqtttest.CodeSuccess)
	b.waitFor("a refresh with the new rate", `[...document.querySelectorAll("#devices .device-row")].some(r => r.cells[1].textContent === "live-1" && r.cells[5].textContent === "3")`)
	if !eval[bool](b, `document.querySelector('.device-select[value="live-1"]').checked && document.getElementById("selected-count").textContent === "1 selected"`) {
		t.Error("the selection was lost at a refresh")
	}
	if got := eval[float64](b, `window.scrollY`); got != y || y == 0 {
		t.Errorf("scroll %v after a refresh, want %v (not 0)", got, y)
	}

	// The gateway restarts: unreachable, then back by itself.
	visit(b, base, "#/overview", `document.getElementById("card-connected") !== null`)
	dev.Close()
	stop()
	b.waitFor("unreachable said", `!document.getElementById("offline").hidden && document.getElementById("offline").textContent.includes("does not answer")`)
	b.shot("offline")
	g2, stop2 := gatewaytest.StartStoppable(t, liveConfig(dir, admin, token)) // the same address: the tab's origin
	mqtttest.Dial5(t, g2.Addr().String(), "back-1")
	b.waitFor("back by itself", `document.getElementById("offline").hidden && document.getElementById("card-connected").querySelector(".value").textContent === "1"`)

	// Restarted with another token: the next refresh logs the tab out.
	stop2()
	gatewaytest.StartStoppable(t, liveConfig(dir, admin, "another-token"))
	b.waitFor("the login form", `!document.getElementById("login").hidden && document.getElementById("login-error").textContent.includes("refused")`)
	if got := eval[string](b, `sessionStorage.getItem("devicegate.token") || ""`); got != "" {
		t.Errorf("the refused token was kept: %q", got)
	}
}
