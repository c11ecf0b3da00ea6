package console_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/internal/mosquittotest"
	"github.com/devicegate/devicegate/internal/mqtttest"
	"github.com/devicegate/devicegate/internal/poll"
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

// TestConsoleDeadLetters: an upstream (Mosquitto) refuses some topics
// for good (its ACL: PUBACK 0x87); their messages show as dead letters
// on the overview and on Forwarding, counted by reason, and on the
// destination's page, listed; after the ACL lets them in, Replay all
// (confirmed) sends them to the upstream, where a subscriber gets them,
// and the count replayed is said; 55 more are paged by 50 and Drop all
// deletes them (counted), none reaching the upstream. No uncaught error
// or failed request in the browser.
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
	g, base := startStatesGateway(t, up.Addr)
	dev := mqtttest.Dial5(t, g.Addr().String(), "cls-dl")
	for i := range 3 {
		dev.MustPublish(t, "fwd/bad/"+strconv.Itoa(i), "m", mqtttest.CodeSuccess)
	}
	dev.MustPublish(t, "fwd/ok/1", "m", mqtttest.CodeSuccess)
	poll.Until(t, 20*time.Second, "3 dead letters", func() bool { return deadHeld(t, base) == 3 })
	poll.Until(t, 10*time.Second, "fwd/ok/1 delivered", func() bool { return received("fwd/ok/1") == 1 })

	b := startBrowser(t)
	logIn(t, b, base)
	b.waitFor("the dead letters on the overview", `document.querySelector("#card-dead .value").textContent === "3" &&
		document.querySelector("#overview-forward td.dead").textContent === "3 held; since start: 3 not_authorized"`)
	visit(b, base, "#/forwarding", `document.querySelector("#forward td.dead") !== null`)
	if got := eval[string](b, `document.querySelector("#forward td.dead").textContent`); got != "3 held; since start: 3 not_authorized" {
		t.Errorf("Forwarding's dead letters: %q", got)
	}
	b.do("open them", chromedp.Click(chromedp.CSS(`#forward td.dead a`)))
	b.waitFor("the list", `document.querySelectorAll("#dead-list .dead-row").length === 3`)
	row := eval[[]string](b, `[...document.querySelector("#dead-list .dead-row").cells].map(c => c.textContent)`)
	if row[0] != "cls-dl" || !strings.HasPrefix(row[1], "fwd/bad/") || row[2] != "1 B" || row[3] != "not_authorized" || !strings.Contains(row[4], "0x87") {
		t.Errorf("a dead letter's row: %q", row)
	}
	b.shot("dead-letters")

	// Let them in, replay them: the upstream gets them.
	setACL(allow, 0)
	b.do("replay", chromedp.Click(chromedp.ID("dead-replay")))
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("the count replayed", `document.getElementById("dead-notice").textContent === "Replayed 3 dead letter(s) of cloud."`)
	poll.Until(t, 20*time.Second, "the replayed messages upstream", func() bool {
		return received("fwd/bad/0") == 1 && received("fwd/bad/1") == 1 && received("fwd/bad/2") == 1
	})
	b.waitFor("none left", `document.getElementById("dead-list") && document.getElementById("dead-list").textContent === "No dead letters."`)

	// 55 more, refused again: paged by 50, then dropped.
	setACL(deny, 0x87)
	for i := range 55 {
		dev.MustPublish(t, "fwd/bad/x"+strconv.Itoa(i), "m", mqtttest.CodeSuccess)
	}
	poll.Until(t, 30*time.Second, "55 dead letters", func() bool { return deadHeld(t, base) == 55 })
	b.waitFor("the first page", `document.getElementById("dead-count") && document.getElementById("dead-count").textContent === "1–50 of 55"`)
	b.do("next page", chromedp.Click(chromedp.ID("dead-next")))
	b.waitFor("the second page", `document.getElementById("dead-count") && document.getElementById("dead-count").textContent === "51–55 of 55" && document.querySelectorAll("#dead-list .dead-row").length === 5`)
	b.do("drop", chromedp.Click(chromedp.ID("dead-drop")))
	b.do("confirm", chromedp.Click(chromedp.CSS(".confirm-yes")))
	b.waitFor("the count dropped", `document.getElementById("dead-notice").textContent === "Dropped 55 dead letter(s) of cloud."`)
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
	if p := b.takeProblems(); len(p) != 0 {
		t.Errorf("the browser saw errors or failed requests: %q", p)
	}
}
