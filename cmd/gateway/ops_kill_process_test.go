package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/admin"
)

// opsShown is what GET /api/v1/devices/{id} shows of a device's quota:
// "default" or the override's "LIMIT/WINDOW".
type opsShown struct {
	Source string
	Limit  int
	Window string
}

func (s opsShown) String() string {
	if s.Source != "override" {
		return s.Source
	}
	return fmt.Sprintf("%d/%s", s.Limit, s.Window)
}

// opsCall sends an admin request from an operator's goroutine and
// returns the status and body.
func opsCall(c *http.Client, g *gw, method, path, body string) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+g.admin+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// shownQuota reads a device's quota through the admin API; the default
// (--limit 3 --window 1h) is its source only.
func shownQuota(t *testing.T, g *gw, id string) opsShown {
	t.Helper()
	code, b := g.raw(t, g.token, http.MethodGet, devicePath(id), "")
	var d admin.DeviceJSON
	if err := json.Unmarshal(b, &d); code != http.StatusOK || err != nil {
		t.Fatalf("GET %s: HTTP %d %s", devicePath(id), code, b)
	}
	w, err := time.ParseDuration(d.Quota.Window)
	if err != nil {
		t.Fatalf("GET %s: window %q: %v", devicePath(id), d.Quota.Window, err)
	}
	if d.Source != "override" {
		if d.Quota.Limit != 3 || w != time.Hour {
			t.Fatalf("GET %s: %s quota %d/%s, want the default 3/1h", devicePath(id), d.Source, d.Quota.Limit, w)
		}
		return opsShown{Source: d.Source}
	}
	return opsShown{Source: d.Source, Limit: d.Quota.Limit, Window: w.String()}
}

// TestConcurrentQuotaKillProcess: two operators set and delete the
// overrides of the same devices at the same moments (operator A sets
// one of its own, B deletes or sets one of its own, in turn, each on
// every device at once); the gateway is killed with SIGKILL right after
// the last answers. After the restart every device shows the quota GET
// showed before the kill, one of the two last writers' (A's last value,
// or B's last: its value or none), and its publishes are judged by it.
func TestConcurrentQuotaKillProcess(t *testing.T) {
	const devices, steps = 6, 8
	dir := t.TempDir()
	args := []string{"--limit", "3", "--window", "1h"}
	g := startGW(t, dir, args...)
	ids := make([]string, devices)
	for d := range ids {
		ids[d] = fmt.Sprintf("meter-%d", d)
	}
	// last[who][d] is what operator who's last answered request made of
	// device d.
	var last [2][devices]opsShown
	var errMu sync.Mutex
	var errs []string
	fail := func(format string, args ...any) {
		errMu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		errMu.Unlock()
	}
	operator := func(who int, bar []sync.WaitGroup, done *sync.WaitGroup) {
		defer done.Done()
		tr := &http.Transport{MaxIdleConnsPerHost: devices}
		defer tr.CloseIdleConnections()
		c := &http.Client{Timeout: 30 * time.Second, Transport: tr}
		for m := range steps {
			bar[m].Done()
			bar[m].Wait() // both operators start step m together
			var wg sync.WaitGroup
			for d, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					path := devicePath(id) + "/quota"
					if who == 1 && (m+d)%2 == 0 {
						code, b, err := opsCall(c, g, http.MethodDelete, path, "")
						if err != nil || code != http.StatusOK && code != http.StatusNotFound {
							fail("operator B DELETE %s: HTTP %d %s %v", path, code, b, err)
						}
						last[who][d] = opsShown{Source: "default"}
						return
					}
					q := opsShown{Source: "override", Limit: 4 + 5*who + m%5, Window: (time.Duration(1+who)*time.Hour + time.Duration(m+1)*time.Second).String()}
					code, b, err := opsCall(c, g, http.MethodPut, path, fmt.Sprintf(`{"limit":%d,"window":%q}`, q.Limit, q.Window))
					var o admin.OverrideJSON
					if err != nil || code != http.StatusOK || json.Unmarshal(b, &o) != nil || o.Limit != q.Limit {
						fail("operator %c PUT %s %s: HTTP %d %s %v", 'A'+who, path, q, code, b, err)
					}
					last[who][d] = q
				}()
			}
			wg.Wait()
		}
	}
	bar := make([]sync.WaitGroup, steps)
	for m := range bar {
		bar[m].Add(2)
	}
	var done sync.WaitGroup
	done.Add(2)
	go operator(0, bar, &done)
	go operator(1, bar, &done)
	done.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d requests failed, the first: %s", len(errs), errs[0])
	}
	before := make([]opsShown, devices)
	overrides := 0
	for d, id := range ids {
		before[d] = shownQuota(t, g, id)
		if before[d] != last[0][d] && before[d] != last[1][d] {
			t.Errorf("%s shows %s after the burst, neither operator A's last %s nor B's last %s", id, before[d], last[0][d], last[1][d])
		}
		if before[d].Source == "override" {
			overrides++
		}
	}
	g.kill()

	g = startGW(t, dir, args...)
	if m := restoredRE.FindStringSubmatch(g.stderr()); m == nil || m[2] != fmt.Sprint(overrides) {
		t.Errorf("restart after kill -9: no line %s with overrides=%d (GET showed that many before the kill); stderr:\n%s", restoredRE, overrides, g.stderr())
	}
	for d, id := range ids {
		after := shownQuota(t, g, id)
		if after != before[d] {
			t.Errorf("%s: GET showed %s before kill -9, %s after the restart", id, before[d], after)
			continue
		}
		limit, window := after.Limit, after.Window
		if after.Source != "override" {
			limit, window = 3, time.Hour.String()
		}
		c := dial5(t, g.mqtt, id)
		for i := range limit {
			c.mustPublish(t, "devices/"+id, fmt.Sprint("within ", i), codeSuccess)
		}
		code, reason := c.publishReason(t, "devices/"+id, "over")
		if want := fmt.Sprintf("quota exceeded: %d messages per %s, ", limit, window); code != codeQuotaExceeded || !strings.HasPrefix(reason, want) {
			t.Errorf("%s: publish over its quota: 0x%02x %q, want 0x97 %q...", id, code, reason, want)
		}
	}
	g.stop()
}
