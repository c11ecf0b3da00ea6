package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/internal/mqtttest"
)

// An operator switching a rule's enforce at runtime (PUT
// /api/v1/rules/{name}/enforce) while another reloads the configuration
// (SIGHUP or POST /api/v1/reload). What holds once both answered, as
// docs/admin-api.md and docs/deployment.md say:
//
//  1. the switch took effect either before the reload, which ended it
//     (the file's enforce applies), or after it, on the rules the reload
//     put in force; the state GET /api/v1/rules shows is one of those
//     two, and the one the times allow (a switch answered before the
//     reload was asked for came before it, one asked for after the
//     reload answered came after);
//  2. a switch of a rule that is in force neither before nor after the
//     reload in that order is 404 naming the rule, and changes nothing;
//     a 200 names the rule it switched with that rule's own topic
//     classes, as they were where it took effect;
//  3. a connected MQTT 5 device of each rule is admitted or refused
//     exactly as GET /api/v1/rules says.

// enforceFile is a configuration whose rule kept (devices k-*) has a
// quota of 1 an hour and a topic class c of 1 an hour; withGone puts
// before it the rule gone (devices g-*), the same with a class gc. A
// device of gone falls to the default, 100,000 an hour, when gone is
// not in force. Both rules are enforced.
func enforceFile(dir string, withGone bool) string {
	gone := ""
	if withGone {
		gone = `    - name: gone
      match: {client_id: "g-*"}
      quota: {limit: 1, window: 1h, policy: drop}
      classes:
        - {name: gc, topics: ["devices/+/c/#"], quota: {limit: 1, window: 1h}}
`
	}
	return gatewayFile(dir, `  default: {limit: 100000, window: 1h, policy: drop}
  rules:
`+gone+`    - name: kept
      match: {client_id: "k-*"}
      quota: {limit: 1, window: 1h, policy: drop}
      classes:
        - {name: c, topics: ["devices/+/c/#"], quota: {limit: 1, window: 1h}}
`)
}

// startEnforce starts a gateway of enforceFile with gone; writeFile
// rewrites its file, with gone or without, for the next reload.
func startEnforce(t *testing.T) (g *Gateway, writeFile func(withGone bool)) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	data := filepath.Join(dir, "data")
	writeWhole(t, path, enforceFile(data, true))
	cfg, err := loadFile(path)()
	if err != nil {
		t.Fatal(err)
	}
	g = mustStart(t, cfg, Deps{Load: loadFile(path)})
	return g, func(withGone bool) { writeWhole(t, path, enforceFile(data, withGone)) }
}

// enforceClass is a rule's class in the configuration files above.
var enforceClass = map[string]string{"kept": "c", "gone": "gc"}

// switchAnswer is an answer of PUT /api/v1/rules/{name}/enforce, with
// when it was sent and answered.
type switchAnswer struct {
	start, end time.Time
	code       int
	body       []byte
}

// TestReloadEnforceSwitch: round after round, one operator reloads a
// file that removes the rule gone (or puts it back), alternately as
// SIGHUP's handler does (ReloadFromSource) and through POST
// /api/v1/reload, while another switches both rules to shadow mode at
// the same moment; after each round the answers, GET /api/v1/rules and
// two live MQTT 5 devices agree with one order of the requests.
func TestReloadEnforceSwitch(t *testing.T) {
	g, writeFile := startEnforce(t)
	op := newOpsClient(t, g)
	base := "http://" + g.AdminAddr().String()

	// Each device fills its windows: its next message is over every
	// quota it has while its rule is enforced.
	devs := map[string]*mqtttest.Client5{"kept": mqtttest.Dial5(t, g.Addr().String(), "k-1"), "gone": mqtttest.Dial5(t, g.Addr().String(), "g-1")}
	topics := func(rule string) []string {
		id := map[string]string{"kept": "k-1", "gone": "g-1"}[rule]
		return []string{"devices/" + id + "/t", "devices/" + id + "/c/x"}
	}
	for rule, d := range devs {
		for _, topic := range topics(rule) {
			d.MustPublish(t, topic, "fill", 0)
		}
	}

	const rounds = 200
	overlaps := 0
	outcomes := map[string]int{} // "rule, removed or added, answer, order": how often
	for round := range rounds {
		nextGone := round%2 == 1 // even rounds remove gone, odd ones put it back
		viaAPI := round/2%2 == 1
		writeFile(nextGone)

		start := make(chan struct{})
		var wg sync.WaitGroup
		var reloadStart, reloadEnd time.Time
		var changes []config.Change
		var reloadErr error
		wg.Add(3)
		go func() { // operator A: reload
			defer wg.Done()
			<-start
			reloadStart = time.Now()
			if viaAPI {
				var a reloadAnswer
				a, reloadErr = postReload(base)
				if reloadErr == nil && !a.ok {
					reloadErr = fmt.Errorf("POST /api/v1/reload: %s", a.text)
				}
				changes = a.changes
			} else {
				changes, reloadErr = g.ReloadFromSource()
			}
			reloadEnd = time.Now()
		}()
		answers := map[string]*switchAnswer{"kept": {}, "gone": {}}
		for rule, ans := range answers { // operator B: both switches at once
			go func() {
				defer wg.Done()
				<-start
				var err error
				ans.start, ans.end, ans.code, ans.body, err = op.call("PUT", "/api/v1/rules/"+rule+"/enforce", `{"enforce":false}`)
				if err != nil {
					ans.code, ans.body = 0, []byte(err.Error())
				}
			}()
		}
		close(start)
		wg.Wait()

		if reloadErr != nil {
			t.Fatalf("round %d: reload: %v", round, reloadErr)
		}
		wantChange := `limits.rules[gone]: "(item name=gone)" -> "(none)"`
		if nextGone {
			wantChange = `limits.rules[gone]: "(none)" -> "(item name=gone)"`
		}
		if len(changes) != 1 || changes[0].String() != wantChange {
			t.Fatalf("round %d: the reload answered changes %v, want %s", round, changes, wantChange)
		}

		var shown admin.RulesJSON
		if err := json.Unmarshal([]byte(httpGet(t, base+"/api/v1/rules", "test-token")), &shown); err != nil {
			t.Fatal(err)
		}
		state := map[string]admin.RuleJSON{}
		var names []string
		for _, r := range shown.Rules {
			state[r.Rule] = r
			names = append(names, r.Rule)
			for _, c := range r.Classes {
				if c.Enforce != r.Enforce {
					t.Fatalf("round %d: GET /api/v1/rules shows rule %s enforce %v with class %s enforce %v: a switch and a reload covered one and not the other", round, r.Rule, r.Enforce, c.Name, c.Enforce)
				}
			}
		}
		if want := map[bool]string{true: "gone kept", false: "kept"}[nextGone]; strings.Join(names, " ") != want {
			t.Fatalf("round %d: GET /api/v1/rules lists %v, want %s", round, names, want)
		}

		for rule, ans := range answers {
			before := rule == "kept" || !nextGone // in force before the reload
			after := rule == "kept" || nextGone   // and after it
			st, present := state[rule]
			what := fmt.Sprintf("round %d, reload %v..%v (via API %v), switch of %s %v..%v: %d %s; GET shows %+v",
				round, 0, reloadEnd.Sub(reloadStart), viaAPI, rule, ans.start.Sub(reloadStart), ans.end.Sub(reloadStart), ans.code, ans.body, st)
			if ans.start.Before(reloadEnd) && reloadStart.Before(ans.end) {
				overlaps++
			}
			// The orders the times allow.
			mayBefore := !ans.start.After(reloadEnd) // the switch was sent before the reload answered
			mayAfter := !ans.end.Before(reloadStart) // it answered after the reload was asked for
			order := "switch first"
			if present && !st.Enforce || ans.code == 404 && !nextGone {
				order = "reload first"
			}
			outcomes[fmt.Sprintf("%s %s: %d, %s", rule, map[bool]string{true: "added", false: "removed"}[nextGone], ans.code, order)]++
			switch ans.code {
			case 200:
				var got admin.RuleJSON
				if err := decode(ans.body, &got); err != nil {
					t.Fatal(err)
				}
				c := enforceClass[rule]
				want := admin.RuleJSON{Rule: rule, Enforce: false, Classes: []admin.RuleClassJSON{{Name: c, Enforce: false}}, Switched: []string{"quota", "class " + c}}
				if got.Rule != want.Rule || got.Enforce || !slices.Equal(got.Classes, want.Classes) || !slices.Equal(got.Switched, want.Switched) {
					t.Fatalf("%s: the answer does not name what the switch switched, %+v", what, want)
				}
				switch {
				case present && !st.Enforce: // after the reload
					if !after || !mayAfter {
						t.Fatalf("%s: shadow mode shown, but the switch cannot have come after the reload", what)
					}
				default: // before it: the reload ended it
					if !before || !mayBefore {
						t.Fatalf("%s: the switch's 200 cannot have come before the reload, and nothing shows it after", what)
					}
				}
			case 404:
				var e struct{ Error string }
				if err := decode(ans.body, &e); err != nil || e.Error != unknownRuleError(rule) {
					t.Fatalf("%s: a 404 that does not say %q", what, unknownRuleError(rule))
				}
				if present && !st.Enforce {
					t.Fatalf("%s: 404, yet the rule is in shadow mode", what)
				}
				if !(!before && mayBefore || !after && mayAfter) {
					t.Fatalf("%s: 404 for a rule in force whichever order the times allow", what)
				}
			default:
				t.Fatalf("%s: want 200 or 404", what)
			}

			// The live device is judged as GET shows.
			want := byte(0)
			if present && st.Enforce {
				want = 0x97
			}
			for _, topic := range topics(rule) {
				code, err := devs[rule].Publish(topic, fmt.Sprint(round))
				if err != nil {
					t.Fatalf("%s: publish to %s: %v", what, topic, err)
				}
				if code != want {
					t.Fatalf("%s: publish to %s: PUBACK 0x%02x, want 0x%02x", what, topic, code, want)
				}
			}
		}
	}
	t.Logf("%d rounds, %d of %d switches overlapping their round's reload; outcomes %v", rounds, overlaps, 2*rounds, outcomes)
	if overlaps < rounds/4 {
		t.Fatalf("only %d of %d switches overlapped a reload: the test did not race them", overlaps, 2*rounds)
	}
}

// unknownRuleError is the error of a switch of a rule not in force.
func unknownRuleError(rule string) string {
	return fmt.Sprintf("no rule named %q in limits.rules", rule)
}

// TestReloadEnforceSwitchBodyAfterReload: a switch whose request
// arrived while its rule was in force, and whose body arrived after a
// reload removed the rule, is the same 404 as a switch of a rule never
// configured (in the round test above, 1 switch in 800 answered
// `no such rule: "gone"` instead). The request asks "Expect:
// 100-continue": the gateway's "100 Continue" says the handler has
// read the headers and waits for the body.
func TestReloadEnforceSwitchBodyAfterReload(t *testing.T) {
	g, writeFile := startEnforce(t)
	conn, err := net.Dial("tcp", g.AdminAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"enforce":false}`
	fmt.Fprintf(conn, "PUT /api/v1/rules/gone/enforce HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer test-token\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", len(body))
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("waiting for 100 Continue: %q, %v", line, err)
	}
	if _, err := rd.ReadString('\n'); err != nil { // the empty line after it
		t.Fatal(err)
	}
	writeFile(false)
	if _, err := g.ReloadFromSource(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ Error string }
	b, _ := io.ReadAll(resp.Body)
	if err := decode(b, &e); err != nil || resp.StatusCode != http.StatusNotFound || e.Error != unknownRuleError("gone") {
		t.Fatalf("switch of a rule removed before its body came: %d %s, want 404 %q", resp.StatusCode, b, unknownRuleError("gone"))
	}
	if rules := httpGet(t, "http://"+g.AdminAddr().String()+"/api/v1/rules", "test-token"); strings.Contains(rules, `"gone"`) || !strings.Contains(rules, `"rule":"kept","enforce":true`) {
		t.Fatalf("GET /api/v1/rules after: %s", rules)
	}
}
