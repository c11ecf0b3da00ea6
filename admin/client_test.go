package admin

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestClient drives the admin API through Client, the way `gateway
// quota` and the simulator do: every call decodes into the API's types,
// a refusal is an *APIError with the status and message, and a gateway
// that is not there is a *TransportError.
func TestClient(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	c := &Client{Addr: strings.TrimPrefix(e.ts.URL, "http://"), Token: testToken, HTTP: &http.Client{Timeout: 5 * time.Second}}
	ctx := context.Background()

	o, raw, err := c.SetQuota(ctx, "meter-1", SetQuotaJSON{Limit: 5, Window: "10s", Policy: "defer"})
	if err != nil || !reflect.DeepEqual(o, OverrideJSON{Device: "meter-1", Limit: 5, Window: "10s", Policy: "defer"}) || !strings.Contains(string(raw), `"limit":5`) {
		t.Fatalf("SetQuota: %+v %s %v", o, raw, err)
	}
	e.table.AllowAt("meter-1", devicelimit.Quota{Limit: 5, Window: 10 * time.Second}, e.clock.Now())
	d, _, err := c.Device(ctx, "meter-1")
	if err != nil || d.Source != "override" || !reflect.DeepEqual(d.Quota, QuotaJSON{Limit: 5, Window: "10s", Policy: "defer"}) || d.Used != 1 || d.Remaining != 4 {
		t.Fatalf("Device: %+v %v", d, err)
	}
	if l, _, err := c.Quotas(ctx); err != nil || len(l.Overrides) != 1 || l.Overrides[0].Device != "meter-1" {
		t.Fatalf("Quotas: %+v %v", l, err)
	}
	if th, _, err := c.Throttled(ctx, 2); err != nil || len(th.Devices) != 2 || th.Devices[0] != (ThrottledJSON{"a", 9}) {
		t.Fatalf("Throttled: %+v %v", th, err)
	}
	if f, raw, err := c.Forward(ctx); err != nil || len(f.Upstreams) != 0 || !strings.Contains(string(raw), `"upstreams":[]`) {
		t.Fatalf("Forward without upstreams: %+v %s %v", f, raw, err)
	}
	if r, _, err := c.Reset(ctx, "meter-1"); err != nil || !r.Reset {
		t.Fatalf("Reset: %+v %v", r, err)
	}
	if del, _, err := c.DeleteQuota(ctx, "meter-1"); err != nil || !del.Deleted {
		t.Fatalf("DeleteQuota: %+v %v", del, err)
	}

	var ae *APIError
	if _, _, err := c.DeleteQuota(ctx, "meter-1"); !errors.As(err, &ae) || ae.Status != http.StatusNotFound || !strings.Contains(ae.Message, "no quota override") {
		t.Fatalf("second DeleteQuota: %v, want a 404 APIError", err)
	}
	if _, _, err := c.SetQuota(ctx, "meter-1", SetQuotaJSON{Limit: 0, Window: "10s"}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "limit") {
		t.Fatalf("bad SetQuota: %v, want a 400 APIError naming limit", err)
	}
	bad := *c
	bad.Token = "wrong"
	if _, _, err := bad.Device(ctx, "meter-1"); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v, want a 401 APIError", err)
	}
	e.ts.Close()
	var te *TransportError
	if _, _, err := c.Device(ctx, "meter-1"); !errors.As(err, &te) {
		t.Fatalf("after the server closed: %v, want a TransportError", err)
	}
}
