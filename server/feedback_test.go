package server

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
)

// rateLimitItems parses a RateLimit field into r and t by policy name.
func rateLimitItems(t *testing.T, field string) map[string][2]int {
	t.Helper()
	out := map[string][2]int{}
	for item := range strings.SplitSeq(field, ", ") {
		parts := strings.Split(item, ";")
		name, err := strconv.Unquote(parts[0])
		if err != nil || len(parts) < 3 || !strings.HasPrefix(parts[1], "r=") || !strings.HasPrefix(parts[2], "t=") {
			t.Fatalf("RateLimit item %q of %q", item, field)
		}
		r, _ := strconv.Atoi(parts[1][2:])
		tt, _ := strconv.Atoi(parts[2][2:])
		out[name] = [2]int{r, tt}
	}
	return out
}

// TestFeedbackMatchesAdminAPI: what a real MQTT 5 device reads on its
// PUBACKs is what the admin API says of its windows, and of its group's,
// at that moment: r the window's remaining, and on a refusal t its
// retry-after rounded up to a second.
func TestFeedbackMatchesAdminAPI(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 1000, time.Hour)
	cfg.Admin.Token = "test-token"
	always := &config.Feedback{Feedback: devicelimit.Feedback{Mode: devicelimit.FeedbackAlways}}
	cfg.Limits.Default = config.Quota{Windows: []config.QuotaWindow{
		{Messages: 4, Window: config.Duration(time.Minute)},
		{Bytes: 100, Window: config.Duration(10 * time.Second)},
	}, Feedback: always}
	cfg.Limits.Classes = []config.Class{{Name: "alarms", Topics: []string{"devices/+/alarm/#"},
		Quota: config.Quota{Windows: []config.QuotaWindow{{Messages: 2, Window: config.Duration(time.Minute)}}, Feedback: always}}}
	cfg.Limits.Group = &config.Group{Name: "acme", Quota: config.Quota{Windows: []config.QuotaWindow{{Messages: 5, Window: config.Duration(time.Minute)}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := mustStart(t, cfg, Deps{Time: devicelimit.NewManualTime(time.Now())}) // stands still
	conn, err := net.DialTimeout("tcp", g.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: "meter-1", Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	connack, err := c.Connect(ctx, &paho.Connect{ClientID: "meter-1", CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(&paho.Disconnect{})
	if got, want := connack.Properties.User.Get("RateLimit-Policy"),
		`"1m";q=4;w=60, "10s-bytes";q=100;w=10;qu="content-bytes", "alarms/1m";q=2;w=60, "group/1m";q=5;w=60`; got != want {
		t.Fatalf("CONNACK RateLimit-Policy:\n got %s\nwant %s", got, want)
	}
	admin := "http://" + g.AdminAddr().String() + "/api/v1/"
	type window struct {
		Messages, Bytes, Remaining int
		Window                     string
		RetryAfter                 string `json:"retry_after"`
	}
	var dev struct {
		Quota   struct{ Windows []window }
		Classes []struct {
			Name  string
			Quota struct{ Windows []window }
		}
	}
	var grp struct{ Quota struct{ Windows []window } }
	retries := 0 // refusals whose t was checked
	for i, st := range []struct {
		topic   string
		size    int
		refused bool
	}{
		{"devices/meter-1/t", 40, false},
		{"devices/meter-1/alarm/x", 10, false},
		{"devices/meter-1/t", 50, false},
		{"devices/meter-1/t", 20, true}, // 110 bytes: the byte window refuses
		{"devices/meter-1/alarm/x", 10, false},
		{"devices/meter-1/alarm/x", 10, true}, // the class's window is full
		{"devices/meter-1/t", 0, false},       // the group's fifth
		{"devices/meter-1/t", 0, true},        // the group refuses
	} {
		resp, err := c.Publish(ctx, &paho.Publish{Topic: st.topic, QoS: 1, Payload: []byte(strings.Repeat("x", st.size))})
		if resp == nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if refused := resp.ReasonCode == 0x97; refused != st.refused {
			t.Fatalf("step %d: PUBACK 0x%02x, want refused: %v", i, resp.ReasonCode, st.refused)
		}
		items := rateLimitItems(t, resp.Properties.User.Get("RateLimit"))
		if err := json.Unmarshal([]byte(httpGet(t, admin+"devices/meter-1", cfg.Admin.Token)), &dev); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(httpGet(t, admin+"groups/acme", cfg.Admin.Token)), &grp); err != nil {
			t.Fatal(err)
		}
		status := map[string]window{}
		name := func(prefix string, w window) string {
			d, _ := time.ParseDuration(w.Window)
			l := devicelimit.Limit{N: w.Messages, Window: d}
			if w.Bytes > 0 {
				l = devicelimit.Limit{Unit: devicelimit.Bytes, N: w.Bytes, Window: d}
			}
			return prefix + string(devicelimit.AppendPolicyName(nil, "", false, l))
		}
		alarm := strings.Contains(st.topic, "/alarm/")
		if !alarm {
			for _, w := range dev.Quota.Windows {
				status[name("", w)] = w
			}
		} else {
			for _, w := range dev.Classes[0].Quota.Windows {
				status[name("alarms/", w)] = w
			}
		}
		for _, w := range grp.Quota.Windows {
			status[name("group/", w)] = w
		}
		if len(items) != len(status) {
			t.Fatalf("step %d: RateLimit %v, the admin API's windows %v", i, items, status)
		}
		for n, w := range status {
			it, ok := items[n]
			if !ok || it[0] != w.Remaining {
				t.Fatalf("step %d: %s: RateLimit r=%d, the admin API's remaining %d (%v)", i, n, it[0], w.Remaining, items)
			}
			if !st.refused && w.Remaining < w.Messages+w.Bytes && it[1] == 0 {
				t.Fatalf("step %d: %s: t=0 on a window holding counts", i, n)
			}
			// The admin API's retry-after is for a message of no bytes:
			// a message window's is any message's.
			if d, _ := time.ParseDuration(w.RetryAfter); st.refused && d > 0 && (w.Bytes == 0 || st.size == 0) {
				if it[1] != int(math.Ceil(d.Seconds())) {
					t.Fatalf("step %d: %s: RateLimit t=%d, the admin API's retry-after %s", i, n, it[1], w.RetryAfter)
				}
				retries++
			}
		}
	}
	if retries != 2 {
		t.Fatalf("%d refusals had their t checked, want 2 (the class's and the group's)", retries)
	}
}
