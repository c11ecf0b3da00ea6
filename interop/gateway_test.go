package interop

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
	"github.com/devicegate/devicegate/config"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/gatewaytest"
)

const token = "interop-token"

// quotaYAML gives every device 4 messages and 1 KiB of payload an hour,
// and the "bulk-*" devices' messages on devices/+/bulk a topic class
// named "x,y;z" (a name a naive parser of the RateLimit fields splits)
// of 10 messages in 20 minutes and 1000 bytes in 90: long windows, so
// that nothing expires while a test compares what a client read with
// the admin API.
const quotaYAML = `
limits:
  default:
    policy: drop
    windows:
      - {messages: 4, window: 1h}
      - {bytes: 1KiB, window: 1h}
  rules:
    - name: bulk
      match: {client_id: "bulk-*"}
      quota: {policy: drop, windows: [{messages: 4, window: 1h}]}
      classes:
        - name: "x,y;z"
          topics: ["devices/+/bulk"]
          quota: {policy: drop, windows: [{messages: 10, window: 20m}, {bytes: 1000, window: 90m}]}
`

// gateway is a gateway running in the test process.
type gateway struct {
	mqtt, admin string
}

// startGateway starts a gateway on loopback with quotaYAML, closed with
// the test.
func startGateway(t *testing.T) gateway {
	t.Helper()
	cfg, err := config.Parse(strings.NewReader(quotaYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MQTT.TCP = "127.0.0.1:0"
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.Admin.Token = token
	cfg.DataDir = t.TempDir()
	g := gatewaytest.Start(t, cfg)
	return gateway{mqtt: g.Addr().String(), admin: g.AdminAddr().String()}
}

// device returns the admin API's status of device.
func (g gateway) device(t *testing.T, device string) admin.DeviceJSON {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+g.admin+"/api/v1/devices/"+device, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET device %s: %s %s", device, resp.Status, body)
	}
	var d admin.DeviceJSON
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("device %s: %v in %s", device, err, body)
	}
	return d
}

// adminWindow is a window of the admin API's device status by the
// name the RateLimit fields give it.
type adminWindow struct {
	limit, remaining int
	window           time.Duration
	retryAfter       time.Duration
}

// windows returns the device's own windows by policy name ("1h",
// "1h-bytes").
func windows(t *testing.T, d admin.DeviceJSON) map[string]adminWindow {
	t.Helper()
	out := map[string]adminWindow{}
	for _, w := range d.Quota.Windows {
		length, err := time.ParseDuration(w.Window)
		if err != nil || w.Remaining == nil {
			t.Fatalf("admin window %+v: %v", w, err)
		}
		var retry time.Duration
		if w.RetryAfter != "" {
			if retry, err = time.ParseDuration(w.RetryAfter); err != nil {
				t.Fatalf("admin window %+v: %v", w, err)
			}
		}
		name, limit := string(devicelimit.AppendShortDuration(nil, length)), w.Messages
		if w.Bytes > 0 {
			name, limit = name+"-bytes", w.Bytes
		}
		out[name] = adminWindow{limit: limit, remaining: *w.Remaining, window: length, retryAfter: retry}
	}
	return out
}
