package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// cannedAPI serves fixed answers by path, as a gateway's admin API would
// send them, and refuses a request without the bearer token want.
func cannedAPI(t *testing.T, want string, answers map[string]string) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+want {
			http.Error(w, `{"error":"bad token"}`, http.StatusUnauthorized)
			return
		}
		body, ok := answers[r.Method+" "+r.URL.RequestURI()]
		if !ok {
			http.Error(w, `{"error":"no such path"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	t.Cleanup(ts.Close)
	return strings.TrimPrefix(ts.URL, "http://")
}

// TestClientText decodes each answer `gateway quota` prints through a
// Client from NewClientFor (token read from the data directory's token
// file) and checks its text form, cell by cell.
func TestClientText(t *testing.T) {
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, TokenFile), []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := cannedAPI(t, "tok-1", map[string]string{
		"GET /api/v1/devices/meter-1": `{"device":"meter-1","quota":{"windows":[{"messages":10,"window":"1m0s","used":3,"remaining":7,"retry_after":"0s"},{"bytes":5242880,"window":"24h0m0s"}],"policy":"defer","enforce":false,"block":{"after":3,"within":"1m0s","for":"10m0s"}},
			"classes":[{"name":"alarms","topics":["a/#","b/#"],"quota":{"limit":2,"window":"1m0s","used":1,"remaining":1,"retry_after":"0s"}}],
			"source":"override","override_expires_at":"2030-01-01T00:00:00Z","group":"acme","used":3,"remaining":7,"retry_after":"","deferred":2,
			"blocked_until":"2030-01-01T00:10:00Z","blocked_since":"2030-01-01T00:00:00Z","block_reason":"3 refusals","connected":true,"last_seen":"2030-01-01T00:00:00Z"}`,
		"GET /api/v1/devices/ghost":         `{"device":"ghost","quota":{"limit":5,"window":"10s","policy":"drop"},"source":"default","used":0,"remaining":5,"retry_after":"","deferred":0,"connected":false,"last_seen":null}`,
		"PUT /api/v1/devices/meter-1/quota": `{"device":"meter-1","limit":5,"window":"10s","policy":"drop","enforce":false,"expires_at":"2030-01-01T00:00:00Z","classes":[{"name":"alarms","topics":["a/#"],"quota":{"windows":[{"messages":2,"window":"1m0s"},{"bytes":1024,"window":"1h0m0s"}],"policy":"drop"}}]}`,
		"GET /api/v1/quotas":                `{"overrides":[{"device":"a","limit":5,"window":"10s","policy":"drop"},{"device":"b","windows":[{"messages":1,"window":"1s"}],"policy":"defer","enforce":false,"expires_at":"2030-01-01T00:00:00Z","classes":[{"name":"x","topics":["t"],"quota":{}},{"name":"y","topics":["u"],"quota":{}}]}]}`,
		"GET /api/v1/throttled?limit=2":     `{"devices":[{"device":"a","refused":9},{"device":"","refused":1}]}`,
		"GET /api/v1/blocks":                `{"blocks":[{"device":"a","until":"2030-01-01T00:10:00Z","since":"2030-01-01T00:00:00Z","reason":"flood"},{"device":"b","until":"2030-01-01T00:10:00Z"}]}`,
		"GET /api/v1/rules":                 `{"rules":[{"rule":"meters","enforce":true,"classes":[{"name":"alarms","enforce":false}],"group":{"name":"acme","enforce":true}},{"rule":"other","enforce":false}]}`,
		"PUT /api/v1/rules/meters/enforce":  `{"rule":"meters","enforce":false,"classes":[{"name":"alarms","enforce":false},{"name":"bulk","enforce":false}],"group":{"name":"acme","enforce":true,"shared_with":["other"]}}`,
		"GET /api/v1/groups":                `{"groups":[{"group":"acme","label":"{tenant}","quota":{"limit":100,"window":"10s","enforce":false},"source":"rule","connected":2}]}`,
		"GET /api/v1/groups/acme":           `{"group":"acme","quota":{"windows":[{"messages":100,"window":"10s","used":4,"remaining":96,"retry_after":"0s"}],"enforce":false},"source":"override","override_expires_at":"2030-01-01T00:00:00Z","connected":2}`,
	})
	c, err := NewClientFor(addr, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(name string, write func(*strings.Builder), want string) {
		t.Helper()
		var b strings.Builder
		write(&b)
		if got := b.String(); got != want {
			t.Errorf("%s:\n got: %q\nwant: %q", name, got, want)
		}
	}

	d, _, err := c.Device(ctx, "meter-1")
	if err != nil {
		t.Fatal(err)
	}
	check("device", func(b *strings.Builder) { d.WriteText(b) }, ""+
		"device                           meter-1\n"+
		"window 1                         10 messages per 1m0s: used 3, remaining 7, retry after 0s\n"+
		"window 2                         5242880 bytes per 24h0m0s\n"+
		"policy                           defer\n"+
		"block                            after 3 refusals within 1m0s, for 10m0s\n"+
		"enforce                          false (shadow mode: what it would refuse is let through)\n"+
		"class alarms (a/# b/#) window 1  2 messages per 1m0s: used 1, remaining 1, retry after 0s\n"+
		"source                           override\n"+
		"override expires at              2030-01-01T00:00:00Z\n"+
		"group                            acme (gateway quota group acme)\n"+
		"used                             3\n"+
		"remaining                        7\n"+
		"retry after                      -\n"+
		"deferred                         2\n"+
		"blocked until                    2030-01-01T00:10:00Z (CONNECTs refused; gateway quota unblock meter-1 lifts it)\n"+
		"blocked since                    2030-01-01T00:00:00Z\n"+
		"block reason                     3 refusals\n"+
		"connected                        true\n"+
		"last seen                        2030-01-01T00:00:00Z\n")

	g, _, err := c.Device(ctx, "ghost")
	if err != nil {
		t.Fatal(err)
	}
	check("device never seen", func(b *strings.Builder) { g.WriteText(b) }, ""+
		"device       ghost\n"+
		"limit        5\n"+
		"window       10s\n"+
		"policy       drop\n"+
		"source       default\n"+
		"used         0\n"+
		"remaining    5\n"+
		"retry after  -\n"+
		"deferred     0\n"+
		"connected    false\n"+
		"last seen    never: this gateway knows nothing of the device (no connection in the last 24 hours, window, deferred message or block); the quota above is the one it would get\n")

	o, _, err := c.SetQuota(ctx, "meter-1", SetQuotaJSON{Limit: 5, Window: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	check("set", func(b *strings.Builder) { o.WriteText(b, "meter-1") },
		"device meter-1: 5 messages per 10s, policy drop, shadow mode, until 2030-01-01T00:00:00Z; class alarms (a/#): 2 messages per 1m0s, 1024 bytes per 1h0m0s, policy drop\n")

	l, _, err := c.Quotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("list", func(b *strings.Builder) { l.WriteText(b) }, ""+
		"DEVICE  LIMIT  WINDOW             POLICY  ENFORCE         EXPIRES AT            CLASSES\n"+
		"a       5      10s                drop    true            -                     -\n"+
		"b       -      1 messages per 1s  defer   false (shadow)  2030-01-01T00:00:00Z  x,y\n")

	th, _, err := c.Throttled(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	check("throttled", func(b *strings.Builder) { th.WriteText(b) }, "DEVICE  REFUSED\na       9\n-       1\n")

	bl, _, err := c.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("blocks", func(b *strings.Builder) { bl.WriteText(b) }, ""+
		"DEVICE  BLOCKED UNTIL         SINCE                 REASON\n"+
		"a       2030-01-01T00:10:00Z  2030-01-01T00:00:00Z  flood\n"+
		"b       2030-01-01T00:10:00Z  -                     -\n")

	r, _, err := c.Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("rules", func(b *strings.Builder) { r.WriteText(b) }, ""+
		"RULE    ENFORCE  CLASSES        GROUP\n"+
		"meters  true     alarms: false  acme: true (not switched with the rule)\n"+
		"other   false    -              -\n")

	sw, _, err := c.SetRuleEnforce(ctx, "meters", false)
	if err != nil {
		t.Fatal(err)
	}
	check("enforce", func(b *strings.Builder) { sw.WriteText(b) }, ""+
		"rule meters: in shadow mode (decided and counted, let through) until the gateway stops: its own quota and its topic classes alarms, bulk\n"+
		"group acme: not switched, keeps its own mode (enforcing as configured, shared with rules other; gateway quota set-group NAME ... [--shadow] changes one group)\n")
	check("enforce on, no group", func(b *strings.Builder) { RuleJSON{Rule: "x", Enforce: true}.WriteText(b) },
		"rule x: enforced until the gateway stops: its own quota\n")

	gl, _, err := c.Groups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("groups", func(b *strings.Builder) { gl.WriteText(b) }, ""+
		"GROUP  LABEL     SOURCE  CONNECTED  QUOTA\n"+
		"acme   {tenant}  rule    2          100 messages per 10s, shadow mode\n")

	gr, _, err := c.Group(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	check("group", func(b *strings.Builder) { gr.WriteText(b) }, ""+
		"group                acme\n"+
		"window 1             100 messages per 10s: used 4, remaining 96, retry after 0s\n"+
		"enforce              false (shadow mode: what it would refuse is let through)\n"+
		"source               override\n"+
		"override expires at  2030-01-01T00:00:00Z\n"+
		"connected            2\n")
	check("set-group", func(b *strings.Builder) { gr.WriteOverride(b, "acme") },
		"group acme: 100 messages per 10s, shadow mode, until 2030-01-01T00:00:00Z\n")
}

// TestNewClientFor: the flag wins over the environment, the environment
// over the token file and the default address; no token anywhere is an
// error naming the ways to give one.
func TestNewClientFor(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("GATEWAY_ADMIN_ADDR", "")
	t.Setenv("GATEWAY_ADMIN_TOKEN", "")
	_, err := NewClientFor("", "", dir)
	if err == nil || !strings.Contains(err.Error(), "no token: give --token or GATEWAY_ADMIN_TOKEN, or --data-dir of the gateway") || !os.IsNotExist(errorsUnwrapAll(err)) {
		t.Fatalf("no token anywhere: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, TokenFile), []byte(" file-tok \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewClientFor("", "", dir)
	if err != nil || c.Addr != "127.0.0.1:8080" || c.Token != "file-tok" || c.HTTP.Timeout != ClientTimeout {
		t.Fatalf("from the file: %+v %v", c, err)
	}
	t.Setenv("GATEWAY_ADMIN_ADDR", "127.0.0.1:9")
	t.Setenv("GATEWAY_ADMIN_TOKEN", "env-tok")
	if c, err = NewClientFor("", "", dir); err != nil || c.Addr != "127.0.0.1:9" || c.Token != "env-tok" {
		t.Fatalf("from the environment: %+v %v", c, err)
	}
	if c, err = NewClientFor("127.0.0.1:10", "flag-tok", dir); err != nil || c.Addr != "127.0.0.1:10" || c.Token != "flag-tok" {
		t.Fatalf("from the flags: %+v %v", c, err)
	}
}

func errorsUnwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

// TestParseClasses reads --class values: a class named again adds a
// filter; a single message window is limit and window, anything else a
// list; every malformed value is refused with what is wrong.
func TestParseClasses(t *testing.T) {
	got, err := ParseClasses([]string{"alarms:2/1m:a/#", "bulk:10/1m,1MiB/1h:b/#", "alarms:2/1m:c/#"}, "drop")
	want := []SetClassJSON{
		{Name: "alarms", Topics: []string{"a/#", "c/#"}, Quota: SetQuotaJSON{Limit: 2, Window: "1m0s", Policy: "drop"}},
		{Name: "bulk", Topics: []string{"b/#"}, Quota: SetQuotaJSON{Windows: []WindowJSON{{Messages: 10, Window: "1m0s"}, {Bytes: 1 << 20, Window: "1h0m0s"}}, Policy: "drop"}},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseClasses = %+v, %v\nwant %+v", got, err, want)
	}
	for spec, msg := range map[string]string{
		"alarms":           `"alarms" is not NAME:WINDOWS:FILTER`,
		"alarms:2/1m":      `"alarms:2/1m" is not NAME:WINDOWS:FILTER`,
		":2/1m:a/#":        `":2/1m:a/#" is not NAME:WINDOWS:FILTER`,
		"alarms:2/1m:":     `"alarms:2/1m:" is not NAME:WINDOWS:FILTER`,
		"alarms:two/1m:a":  `class "alarms": `,
		"alarms:3/1m:more": `class "alarms": windows "3/1m", and "2/1m" in an earlier --class`,
	} {
		specs := []string{spec}
		if strings.HasSuffix(spec, ":more") {
			specs = []string{"alarms:2/1m:a/#", spec}
		}
		if _, err := ParseClasses(specs, ""); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseClasses(%q) = %v, want an error containing %q", specs, err, msg)
		}
	}
	if ws, err := ParseWindows("10/1m,5MiB/24h"); err != nil || !reflect.DeepEqual(ws, []WindowJSON{{Messages: 10, Window: "1m0s"}, {Bytes: 5 << 20, Window: "24h0m0s"}}) {
		t.Errorf("ParseWindows = %+v, %v", ws, err)
	}
	if _, err := ParseWindows("10 per minute"); err == nil {
		t.Error("ParseWindows took a malformed value")
	}
}

// The forward status and the dead-letter list in text, as `gateway
// forward status` and `gateway forward dead list` print them: every
// field of the answer lands in its cell or line.
func TestForwardText(t *testing.T) {
	var b strings.Builder
	ForwardListJSON{Upstreams: []UpstreamJSON{{
		Name: "up", Connections: 2, Connected: 1, LastError: "dial refused", RetryInSeconds: 1.5,
		Forwarded: 7, BacklogMessages: 3, BacklogBytes: 90, OldestAgeSeconds: 0.25,
		DroppedOldest: 4, Refused: 5, Expired: 6, LowSpace: 2, DeadLetters: 8,
		DeadLettersByReason: map[string]uint64{"too_large": 1, "not_authorized": 7},
	}}}.WriteText(&b)
	want := []string{
		"UPSTREAM  CONNECTED  FORWARDED  BACKLOG  BACKLOG BYTES  OLDEST  DROPPED OLDEST  REFUSED  EXPIRED  DEAD LETTERS",
		"up        1/2        7          3        90             250ms   4               5        6        8",
		"up: dial refused (next attempt in 1.5s)",
		"up: 2 messages refused or dropped since start: the data file's disk at its free-space floor (persist.min_free_bytes)",
		"up: refused for good since start: not_authorized 7, too_large 1 (gateway forward dead list up)",
	}
	if got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("forward status:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	b.Reset()
	ForwardListJSON{}.WriteText(&b)
	if got := b.String(); got != "no upstreams: the gateway's config has no forward:\n" {
		t.Errorf("no upstreams: %q", got)
	}

	b.Reset()
	DeadListJSON{Upstream: "up", Total: 3, DeadLetters: []DeadLetterJSON{
		{ID: "a1", RefusedAt: "2026-11-28T10:00:00Z", Reason: "too_large", Error: "0x95", Device: "d1", Topic: "t/1", PayloadBytes: 12},
		{ID: "a2", Reason: "", Device: "d2", Topic: "t/2", Damaged: true},
	}}.WriteText(&b)
	want = []string{
		"ID  REFUSED AT            REASON     DEVICE  TOPIC  BYTES  ERROR",
		"a1  2026-11-28T10:00:00Z  too_large  d1      t/1    12     0x95",
		"a2  -                     DAMAGED    d2      t/2    0      ",
		"2 of 3 shown (--limit)",
	}
	if got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("dead list:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	b.Reset()
	DeadListJSON{Upstream: "up"}.WriteText(&b)
	if got := b.String(); got != "up: no dead letters\n" {
		t.Errorf("no dead letters: %q", got)
	}
}
