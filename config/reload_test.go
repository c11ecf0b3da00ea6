package config

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReloadChanges: changes to reloadable keys are listed; a change to
// any other key refuses the reload naming each with both values; a
// secret's value is never shown.
func TestReloadChanges(t *testing.T) {
	a := Default()
	b := Default()
	b.Limits.Default.Limit = 5
	b.Limits.Rules = []Rule{{Name: "r", Match: Match{ClientID: "x-*"}, Quota: Quota{Limit: 1, Window: a.Limits.Default.Window}}}
	changes, err := ReloadChanges(a, b)
	if err != nil || len(changes) == 0 || changes[0].Key != "limits.default.limit" || changes[0].Old != "100" || changes[0].New != "5" {
		t.Fatalf("changes %v, %v", changes, err)
	}
	b.MQTT.TCP = ":1884"
	b.Admin.Token = "new-secret-token-0123456789"
	b.Forward = []Forward{{Name: "up", To: "mqtt://upstream.example:1883", Topics: []string{"#"}}}
	_, err = ReloadChanges(a, b)
	fe := FieldErrors(err)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, want := range []string{`mqtt.tcp: cannot change without a restart (running ":1883", file ":1884")`, `admin.token: cannot change without a restart (running "(secret)", file "(secret)")`, `forward[0]: cannot change without a restart (running "(none)", file "(item name=up)")`} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "new-secret") || strings.Contains(msg, "limits.default") || len(fe) != 3 {
		t.Errorf("refusal (%d keys):\n%s", len(fe), msg)
	}
	if changes, err := ReloadChanges(a, Default()); err != nil || len(changes) != 0 {
		t.Fatalf("no change: %v, %v", changes, err)
	}
}

// TestReloadForwardKeys: a forward entry's rate, max_age, max_bytes
// and credentials reload, its name and address do not, nor an entry
// added; "[]" in Reloadable stands for any index, in keys of the
// reference too; the password stays secret.
func TestReloadForwardKeys(t *testing.T) {
	a := Default()
	a.Forward = []Forward{{Name: "up", To: "mqtt://upstream.example:1883", Topics: []string{"#"}, Username: "gw", Password: "old-secret"}}
	b := a
	b.Forward = []Forward{a.Forward[0]}
	rate := 5.0
	b.Forward[0].Rate, b.Forward[0].MaxBytes, b.Forward[0].Password = &rate, 1<<20, "new-secret"
	b.Auth.ACL.Publish = "devices/{device}/up/#"
	b.MQTT.ConnectRate.Limit = 3
	b.MQTT.Consumers.ClientIDs = []string{"backend-*"}
	changes, err := ReloadChanges(a, b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.String())
	}
	want := `auth.acl.publish: "devices/{device}/#" -> "devices/{device}/up/#"; forward[0].max_bytes: "0B" -> "1MiB"; forward[0].password: "(secret)" -> "(secret)"; forward[0].rate: "(none)" -> "5"; mqtt.connect_rate.limit: "100" -> "3"; mqtt.consumers.client_ids[0]: "(none)" -> "backend-*"`
	if strings.Join(got, "; ") != want {
		t.Fatalf("changes:\n%s\nwant\n%s", strings.Join(got, "; "), want)
	}
	b.Forward[0].Name, b.Forward[0].To = "cloud", "mqtt://other.example:1883"
	b.Forward = append(b.Forward, a.Forward[0])
	_, err = ReloadChanges(a, b)
	if fe := FieldErrors(err); len(fe) != 3 || fe[0].Key != "forward[0].name" || fe[1].Key != "forward[0].to" || fe[2].Key != "forward[1]" {
		t.Fatalf("refusal: %v", err)
	}
	for key, want := range map[string]bool{"forward[].rate": true, "forward[12].tls.cert_file": true, "forward[3].tls.ca_file": false,
		"forward[0]": false, "forward[1].topics[0]": false, "mqtt.connect_rate.exempt[2]": true, "mqtt.max_connections": false} {
		if IsReloadable(key) != want {
			t.Errorf("IsReloadable(%q) = %v, want %v", key, !want, want)
		}
	}
}

// TestReloadColumn: every table with a Key and a Reload column in the
// configuration reference (docs/configuration.md) says of each key what
// IsReloadable says.
func TestReloadColumn(t *testing.T) {
	files := []string{filepath.Join("..", "docs", "configuration.md")}
	rows := 0
	keyRE := regexp.MustCompile("^`([^`]+)`$")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		keyCol, reloadCol := -1, -1
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "|") {
				keyCol, reloadCol = -1, -1
				continue
			}
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			if keyCol < 0 {
				for i, c := range cells {
					switch c {
					case "Key":
						keyCol = i
					case "Reload":
						reloadCol = i
					}
				}
				if reloadCol < 0 {
					keyCol = -2 // a table without a Reload column
				}
				continue
			}
			if keyCol == -2 || strings.HasPrefix(cells[0], "---") || len(cells) <= reloadCol {
				continue
			}
			m := keyRE.FindStringSubmatch(cells[keyCol])
			if m == nil {
				t.Errorf("%s: key cell %q is not a `key`", f, cells[keyCol])
				continue
			}
			want := "no"
			if IsReloadable(m[1]) {
				want = "yes"
			}
			if cells[reloadCol] != want {
				t.Errorf("%s: %s: Reload %q, config.Reloadable says %s", f, m[1], cells[reloadCol], want)
			}
			rows++
		}
	}
	if rows < len(Flatten(Default()))/2 {
		t.Fatalf("only %d rows with a Reload column in %v", rows, files)
	}
}

// TestReloadChangesListItems: a rule added or removed is one change
// that says so and names the rule, not `"" -> "(present)"`.
func TestReloadChangesListItems(t *testing.T) {
	a := Default()
	rule := func(name string) Rule {
		return Rule{Name: name, Match: Match{ClientID: name + "-*"}, Quota: Quota{Limit: 1, Window: a.Limits.Default.Window}}
	}
	a.Limits.Rules = []Rule{rule("meters")}
	b := a
	b.Limits.Rules = []Rule{rule("meters"), rule("pumps"), {Match: Match{ClientID: "x"}, Quota: Quota{Limit: 2, Window: a.Limits.Default.Window}}}
	changes, err := ReloadChanges(a, b)
	var got []string
	for _, c := range changes {
		got = append(got, c.String())
	}
	want := []string{`limits.rules[#3]: "(none)" -> "(item name=#3)"`, `limits.rules[pumps]: "(none)" -> "(item name=pumps)"`}
	if err != nil || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("added: %q, %v; want %q", got, err, want)
	}
	changes, _ = ReloadChanges(b, a)
	if len(changes) != 2 || changes[1].String() != `limits.rules[pumps]: "(item name=pumps)" -> "(none)"` {
		t.Fatalf("removed: %v", changes)
	}
}

// TestReloadChangesByName: rules and topic classes are compared by
// name, not by place: a rule removed from the middle of the list is one
// change naming it, not a rename of every rule after it; a rule
// changed is named by its name wherever it now stands; a rule moved
// before another (first match wins) says where it was and is; a rule
// without a name is "#N", as the resolver and the admin API call it.
func TestReloadChangesByName(t *testing.T) {
	a := Default()
	w := a.Limits.Default.Window
	rule := func(name string, limit int) Rule {
		return Rule{Name: name, Match: Match{ClientID: name + "-*"}, Quota: Quota{Limit: limit, Window: w}}
	}
	class := func(name string, limit int) Class {
		return Class{Name: name, Topics: []string{"+/" + name}, Quota: Quota{Limit: limit, Window: w}}
	}
	meters := rule("meters", 1)
	meters.Classes = []Class{class("alarms", 1), class("bulk", 2), class("logs", 3)}
	a.Limits.Rules = []Rule{rule("pumps", 1), meters, rule("valves", 1), rule("doors", 1)}
	a.Limits.Classes = []Class{class("alarms", 1), class("bulk", 2)}
	step := func(what string, change func(*Config), want ...string) {
		t.Helper()
		b := a
		b.Limits.Rules = slices.Clone(a.Limits.Rules)
		b.Limits.Rules[1].Classes = slices.Clone(meters.Classes)
		b.Limits.Classes = slices.Clone(a.Limits.Classes)
		change(&b)
		if err := b.Validate(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		changes, err := ReloadChanges(a, b)
		var got []string
		for _, c := range changes {
			got = append(got, c.String())
		}
		if err != nil || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:\n%s\n%v\nwant\n%s", what, strings.Join(got, "\n"), err, strings.Join(want, "\n"))
		}
	}
	step("rule removed from the middle", func(b *Config) { b.Limits.Rules = slices.Delete(b.Limits.Rules, 1, 2) },
		`limits.rules[meters]: "(item name=meters)" -> "(none)"`)
	step("rule removed, one after it changed", func(b *Config) {
		b.Limits.Rules = slices.Delete(b.Limits.Rules, 0, 1)
		b.Limits.Rules[2].Quota.Limit = 7
	},
		`limits.rules[doors].quota.limit: "1" -> "7"`,
		`limits.rules[pumps]: "(item name=pumps)" -> "(none)"`)
	step("rule added at the front", func(b *Config) { b.Limits.Rules = slices.Insert(b.Limits.Rules, 0, rule("lamps", 2)) },
		`limits.rules[lamps]: "(none)" -> "(item name=lamps)"`)
	step("rule moved to the front", func(b *Config) {
		d := b.Limits.Rules[3]
		b.Limits.Rules = slices.Insert(slices.Delete(b.Limits.Rules, 3, 4), 0, d)
	},
		`limits.rules[doors]: "(item name=doors at [3])" -> "(item name=doors at [0])"`)
	step("class removed from the middle of a rule's", func(b *Config) {
		b.Limits.Rules[1].Classes = slices.Delete(b.Limits.Rules[1].Classes, 1, 2)
		b.Limits.Rules[1].Classes[1].Quota.Limit = 9
	},
		`limits.rules[meters].classes[bulk]: "(item name=bulk)" -> "(none)"`,
		`limits.rules[meters].classes[logs].quota.limit: "3" -> "9"`)
	step("default class removed", func(b *Config) { b.Limits.Classes = b.Limits.Classes[1:] },
		`limits.classes[alarms]: "(item name=alarms)" -> "(none)"`)
	step("rule without a name", func(b *Config) {
		b.Limits.Rules[2].Name = ""
	},
		`limits.rules[#3]: "(none)" -> "(item name=#3)"`,
		`limits.rules[valves]: "(item name=valves)" -> "(none)"`)
	step("a name that reads as a place or as punctuation", func(b *Config) {
		b.Limits.Rules[0].Name, b.Limits.Rules[2].Name = "7", "a].b"
		b.Limits.Rules[2].Quota.Limit = 4
	},
		`limits.rules["7"]: "(none)" -> "(item name=7)"`,
		`limits.rules["a\x5d.b"]: "(none)" -> "(item name=a].b)"`,
		`limits.rules[pumps]: "(item name=pumps)" -> "(none)"`,
		`limits.rules[valves]: "(item name=valves)" -> "(none)"`)
}
