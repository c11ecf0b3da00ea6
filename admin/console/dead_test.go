package console_test

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"
	bolt "go.etcd.io/bbolt"

	"github.com/devicegate/devicegate/internal/gatewaytest"
	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
	"github.com/devicegate/devicegate/persist"
)

// deadHeld returns how many dead letters the API says cloud holds.
func deadHeld(t *testing.T, base string) int {
	t.Helper()
	var f struct {
		Upstreams []struct {
			Name        string `json:"name"`
			DeadLetters int    `json:"dead_letters"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(apiGet(t, base, "/api/v1/forward")), &f); err != nil || len(f.Upstreams) != 1 {
		t.Fatalf("forward: %+v %v", f, err)
	}
	return f.Upstreams[0].DeadLetters
}

// damageFirstDead overwrites the version byte of the first dead letter
// of log in the data file in dir (the gateway stopped), as
// cmd/gateway's forward_deadlog_process_test.go does: the entry then
// lists as damaged.
func damageFirstDead(t *testing.T, dir, log string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, persist.FileName), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("forward-dead")).Bucket([]byte(log))
		k, v := b.Cursor().First()
		return b.Put(k, append([]byte{0xff}, v[1:]...))
	}); err != nil {
		t.Fatal(err)
	}
}

// deadRow is the JavaScript expression of the dead-letter row whose
// topic is topic ("" for the damaged entry).
func deadRow(topic string) string {
	return `[...document.querySelectorAll("#dead-list .dead-row")].find(r => r.cells[1].textContent === ` + js(topic) + `)`
}

// TestConsoleDeadLetters: an upstream (Mosquitto) refuses some topics
// for good (its ACL: PUBACK 0x87); their messages show as dead letters
// on the overview and on Forwarding, counted by reason, and on the
// destination's page, listed, beside one damaged in the data file
// (marked, its error shown, its Replay disabled). After the ACL lets
// them in, one entry's Replay (confirmed) sends that one to the
// upstream, where a subscriber gets it, counted "1 of 1"; Replay all
// sends the rest once and leaves the damaged one. 55 more of one device
// and 3 of another are paged by 50; dropping the first device's
// collects its 55 beyond the page and drops them in one call, counted;
// the damaged one is dropped by its row, the rest by Drop all; none
// dropped reaches the upstream. No uncaught error or failed request in
// the browser.
func TestConsoleDeadLetters(t *testing.T) {
	const deny, allow = "topic readwrite #\ntopic deny fwd/bad/#\n", "topic readwrite #\n"
	up := mosquittotest.StartWith(t, mosquittotest.Options{ACL: deny, MaxQueued: 100000})
	prober := mqtttest.Dial5(t, up.Addr, "prober")
	// setACL changes the upstream's ACL and waits until Mosquitto, which
	// reads it in the background, answers a publish of fwd/bad/ by it.
	setACL := func(acl string, want byte) {
		up.SetACL(acl)
		poll.Until(t, 20*time.Second, "the upstream's ACL in force", func() bool {
			code, err := prober.Publish("fwd/bad/probe", "p")
			return err == nil && code == want
		})
	}
	var mu sync.Mutex
	got := map[string]int{}
	mqtttest.Subscribe5(t, up.Addr, "watcher", paho.SubscribeOptions{Topic: "fwd/#", QoS: 1}, func(p *paho.Publish) {
		mu.Lock()
		got[p.Topic]++
		mu.Unlock()
	})
	received := func(topic string) int {
		mu.Lock()
		defer mu.Unlock()
		return got[topic]
	}
	// A first run leaves a dead letter, damaged in the data file before
	// the gateway the test uses starts on it.
	dir := t.TempDir()
	g0, stop0 := gatewaytest.StartStoppable(t, statesConfig(dir, up.Addr))
	mqtttest.Dial5(t, g0.Addr().String(), "cls-dmg").MustPublish(t, "fwd/bad/dmg", "m", mqtttest.CodeSuccess)
	poll.Until(t, 20*time.Second, "the dead letter to damage", func() bool { return deadHeld(t, "http://"+g0.AdminAddr().String()) == 1 })
	stop0()
	damageFirstDead(t, dir, "cloud/0")
	g, _ := gatewaytest.StartStoppable(t, statesConfig(dir, up.Addr))
	base := "http://" + g.AdminAddr().String()

	dev := mqtttest.Dial5(t, g.Addr().String(), "cls-dl")
	for i := range 3 {
		dev.MustPublish(t, "fwd/bad/"+strconv.Itoa(i), "m", mqtttest.CodeSuccess)
	}
	dev.MustPublish(t, "fwd/ok/1", "m", mqtttest.CodeSuccess)
	poll.Until(t, 20*time.Second, "4 dead letters", func() bool { return deadHeld(t, base) == 4 })
	poll.Until(t, 10*time.Second, "fwd/ok/1 delivered", func() bool { return received("fwd/ok/1") == 1 })

	b := startBrowser(t)
	logIn(t, b, base)
	b.waitFor("the dead letters on the overview", `document.querySelector("#card-dead .value").textContent === "4" &&
		document.querySelector("#overview-forward td.dead").textContent === "4 held; since start: 3 not_authorized"`)
	visit(b, base, "#/forwarding", `document.querySelector("#forward td.dead") !== null`)
	if got := eval[string](b, `document.querySelector("#forward td.dead").textContent`); got != "4 held; since start: 3 not_authorized" {
		t.Errorf("Forwarding's dead letters: %q", got)
	}
	b.click("open them", "#forward td.dead a")
	b.waitFor("the list", `document.querySelectorAll("#dead-list .dead-row").length === 4`)
	row := eval[[]string](b, `[...`+deadRow("fwd/bad/0")+`.cells].map(c => c.textContent)`)
	if row[0] != "cls-dl" || row[2] != "1 B" || row[3] != "not_authorized" || !strings.Contains(row[4], "0x87") {
		t.Errorf("a dead letter's row: %q", row)
	}
	// The damaged one: marked, its error, Replay disabled, Drop not.
	damaged := eval[[]string](b, `(r => [r.className, r.cells[0].textContent, r.cells[4].textContent,
		String(r.querySelector(".dead-one-replay").disabled), String(r.querySelector(".dead-one-drop").disabled)])(`+deadRow("")+`)`)
	if damaged[0] != "dead-row damaged" || damaged[1] != "damaged entry" || !strings.Contains(damaged[2], "not a dead letter") || damaged[3] != "true" || damaged[4] != "false" {
		t.Errorf("the damaged entry's row (class, device, error, replay disabled, drop disabled): %q", damaged)
	}
	checkControls(b, "#/dead/cloud")
	b.shot("dead-letters")

	// Let them in; replay one: the upstream gets that one.
	setACL(allow, 0)
	one := eval[string](b, `document.querySelector("#dead-list .dead-row:nth-child(3)").cells[1].textContent`)
	b.click("replay one", "#dead-list .dead-row:nth-child(3) .dead-one-replay")
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("one replayed, counted", `document.getElementById("dead-notice").textContent === "Replayed 1 of 1 dead letter(s) of cloud." &&
		document.querySelectorAll("#dead-list .dead-row").length === 3 && !`+deadRow(one))
	poll.Until(t, 20*time.Second, one+" upstream", func() bool { return received(one) == 1 })
	b.do("replay", chromedp.Click(chromedp.ID("dead-replay")))
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("the count replayed", `document.getElementById("dead-notice").textContent === "Replayed 2 dead letter(s) of cloud."`)
	poll.Until(t, 20*time.Second, "the replayed messages upstream", func() bool {
		return received("fwd/bad/0") == 1 && received("fwd/bad/1") == 1 && received("fwd/bad/2") == 1
	})
	b.waitFor("the damaged one left", `document.querySelectorAll("#dead-list .dead-row").length === 1 && `+deadRow("")+` !== undefined`)

	// 55 more of cls-dl and 3 of cls-dl2, refused again: paged by 50;
	// cls-dl's dropped from the device's selection.
	setACL(deny, 0x87)
	for i := range 55 {
		dev.MustPublish(t, "fwd/bad/x"+strconv.Itoa(i), "m", mqtttest.CodeSuccess)
	}
	other := mqtttest.Dial5(t, g.Addr().String(), "cls-dl2")
	for i := range 3 {
		other.MustPublish(t, "fwd/bad/y"+strconv.Itoa(i), "m", mqtttest.CodeSuccess)
	}
	poll.Until(t, 30*time.Second, "59 dead letters", func() bool { return deadHeld(t, base) == 59 })
	b.waitFor("the first page", `document.getElementById("dead-count") && document.getElementById("dead-count").textContent === "1–50 of 59"`)
	b.click("next page", "#dead-next")
	b.waitFor("the second page", `document.getElementById("dead-count") && document.getElementById("dead-count").textContent === "51–59 of 59" && document.querySelectorAll("#dead-list .dead-row").length === 9`)
	b.do("focus the device's choice", chromedp.Focus(chromedp.ID("dead-device")))
	eval[bool](b, `(s => { s.value = "cls-dl"; s.dispatchEvent(new Event("change")); return true; })(document.getElementById("dead-device"))`)
	b.click("drop the device's", "#dead-device-drop")
	if got := eval[string](b, `document.querySelector(".confirm").textContent`); !strings.HasPrefix(got, "Delete the 55 dead letter(s) of cls-dl for good?") {
		t.Errorf("the device's drop asks %q", got)
	}
	b.shot("dead-letters-device")
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("the device's count dropped", `document.getElementById("dead-notice").textContent === "Dropped 55 of 55 dead letter(s) of cloud (device cls-dl)."`)
	if n := deadHeld(t, base); n != 4 {
		t.Errorf("%d dead letters after dropping cls-dl's, want 4 (cls-dl2's 3 and the damaged one)", n)
	}
	visit(b, base, "#/dead/cloud", `document.getElementById("dead-count") && document.getElementById("dead-count").textContent === "1–4 of 4"`)
	b.click("drop the damaged one", "#dead-list .damaged .dead-one-drop")
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("the damaged one dropped", `document.getElementById("dead-notice").textContent === "Dropped 1 of 1 dead letter(s) of cloud." &&
		document.querySelectorAll("#dead-list .dead-row").length === 3 && document.querySelectorAll("#dead-list .damaged").length === 0`)
	b.do("drop", chromedp.Click(chromedp.ID("dead-drop")))
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("the count dropped", `document.getElementById("dead-notice").textContent === "Dropped 3 dead letter(s) of cloud."`)
	if n := deadHeld(t, base); n != 0 {
		t.Errorf("%d dead letters after Drop all, want 0", n)
	}
	setACL(allow, 0)
	dev.MustPublish(t, "fwd/ok/2", "m", mqtttest.CodeSuccess)
	poll.Until(t, 20*time.Second, "a later message delivered", func() bool { return received("fwd/ok/2") == 1 })
	for i := range 55 {
		if n := received("fwd/bad/x" + strconv.Itoa(i)); n != 0 {
			t.Fatalf("dropped fwd/bad/x%d reached the upstream %d times", i, n)
		}
	}
	for _, topic := range []string{"fwd/bad/y0", "fwd/bad/y1", "fwd/bad/y2", "fwd/bad/dmg"} {
		if n := received(topic); n != 0 {
			t.Errorf("dropped %s reached the upstream %d times", topic, n)
		}
	}
	if p := b.takeProblems(); len(p) != 0 {
		t.Errorf("the browser saw errors or failed requests: %q", p)
	}
}
