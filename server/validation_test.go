package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/cluster/redistest"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
)

// TestOverrideVerdicts runs bad overrides through every place that
// accepts one: devicelimit's own check, the data file (a gateway's
// admin path without Redis), the Redis overrides (a gateway's admin path
// in cluster mode), the admin API over HTTP, and, for the quota part, a
// configuration rule. Each must refuse with the same field named, and
// change nothing. The Redis path used to accept an expiry before 1970.
func TestOverrideVerdicts(t *testing.T) {
	const buckets = 20
	srv := redistest.Start(t)
	base := testConfig(t.TempDir(), 100, time.Hour)
	base.Admin.Token = "test-token"
	local := mustStart(t, base, Deps{})
	clustered := base
	clustered.DataDir = t.TempDir()
	clustered.Cluster.Redis.Addrs = []string{srv.Addr}
	if err := clustered.Validate(); err != nil {
		t.Fatal(err)
	}
	shared := mustStart(t, clustered, Deps{})

	q := func(limit int, window time.Duration, p devicelimit.Policy) devicelimit.Quota {
		return devicelimit.Quota{Limit: limit, Window: window, Policy: p}
	}
	cases := []struct {
		name   string
		device string
		o      devicelimit.Override
		field  string
		// body is the admin API's request for the same override, ""
		// where JSON cannot say it (a policy number, a tick before 1970).
		body string
	}{
		{"limit 0", "d", devicelimit.Override{Quota: q(0, time.Minute, 0)}, "limit", `{"limit":0,"window":"1m"}`},
		{"limit too large", "d", devicelimit.Override{Quota: q(devicelimit.MaxLimit+1, time.Minute, 0)}, "limit",
			fmt.Sprintf(`{"limit":%d,"window":"1m"}`, devicelimit.MaxLimit+1)},
		{"window 0", "d", devicelimit.Override{Quota: q(5, 0, 0)}, "window", `{"limit":5,"window":"0s"}`},
		{"window too short for the buckets", "d", devicelimit.Override{Quota: q(5, 10*time.Millisecond, 0)}, "window", `{"limit":5,"window":"10ms"}`},
		{"window too long", "d", devicelimit.Override{Quota: q(5, devicelimit.MaxWindow+time.Hour, 0)}, "window",
			fmt.Sprintf(`{"limit":5,"window":%q}`, (devicelimit.MaxWindow + time.Hour).String())},
		{"unknown policy", "d", devicelimit.Override{Quota: q(5, time.Minute, 9)}, "policy", ""},
		{"expiry before 1970", "d", devicelimit.Override{Quota: q(5, time.Minute, 0), ExpiresAt: -1}, "expires_at", ""},
		{"empty device", "", devicelimit.Override{Quota: q(5, time.Minute, 0)}, "device", ""},
	}
	fieldOf := func(err error) string {
		var fe *devicelimit.FieldError
		if errors.As(err, &fe) {
			return fe.Field
		}
		return fmt.Sprintf("no field (%v)", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := fieldOf(c.o.Validate(c.device, buckets)); got != c.field {
				t.Fatalf("Override.Validate: field %s, want %s", got, c.field)
			}
			for _, g := range []struct {
				name string
				gw   *Gateway
			}{{"data file", local}, {"redis", shared}} {
				if got := fieldOf(g.gw.SetOverride(c.device, c.o)); got != c.field {
					t.Errorf("%s: field %s, want %s", g.name, got, c.field)
				}
				if _, ok := g.gw.resolver.Override(c.device, g.gw.clock.Now()); ok {
					t.Errorf("%s: the refused override is in force", g.name)
				}
			}
			if c.body != "" {
				url := "http://" + local.AdminAddr().String() + "/api/v1/devices/d/quota"
				body := httpDo(t, http.MethodPut, url, base.Admin.Token, c.body, http.StatusBadRequest)
				if !strings.Contains(body, ": "+c.field+" ") && !strings.Contains(body, "\""+c.field+": ") {
					t.Errorf("admin API: %s; want the field %s named", body, c.field)
				}
			}
			if c.field == "limit" || c.field == "window" || c.field == "policy" {
				cfg := config.Default()
				cfg.Limits.Rules = []config.Rule{{Match: config.Match{ClientID: "x*"},
					Quota: config.Quota{Limit: c.o.Quota.Limit, Window: config.Duration(c.o.Quota.Window), Policy: c.o.Quota.Policy}}}
				err := cfg.Validate()
				if want := "limits.rules[0].quota." + c.field + ":"; err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("config: %v; want %s", err, want)
				}
			}
		})
	}
}
