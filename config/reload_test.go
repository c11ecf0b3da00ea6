package config

import (
	"os"
	"path/filepath"
	"regexp"
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
	for _, want := range []string{`mqtt.tcp: cannot change without a restart (running ":1883", file ":1884")`, `admin.token: cannot change without a restart (running "(secret)", file "(secret)")`, `forward[0]: cannot change without a restart (running "", file "(present)")`} {
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
