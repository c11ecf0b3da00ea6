package simulator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/devicelimit"
)

// acked returns a message seq sent at ms(at) and success-acked 1 ms
// later.
func acked(seq uint64, at int) Sent {
	s := sent(seq, at, AckSuccess)
	s.AckAt = ms(at + 1)
	return s
}

// TestCheckJudgesGroupWindows: two devices each within their own quota
// of 3 per second together put 6 in a second into a group of 4: the
// group is judged violated, though no device is; with a group of 6 the
// same logs are clean.
func TestCheckJudgesGroupWindows(t *testing.T) {
	dev := func(id string) DeviceLog {
		l := DeviceLog{Device: id, Quota: drop(3, time.Second), Group: "acme"}
		for i := range 3 {
			l.Sent = append(l.Sent, acked(uint64(i), 100*i))
			l.Arrivals = append(l.Arrivals, arr(uint64(i), 100*i+5))
		}
		return l
	}
	logs := []DeviceLog{dev("a"), dev("b"), {Device: "outsider", Quota: drop(3, time.Second), Sent: []Sent{acked(0, 0)}, Arrivals: []Arrival{arr(0, 5)}}}
	res := Check(logs, CheckOptions{Groups: map[string]devicelimit.Quota{"acme": drop(4, time.Second)}})
	if res.Totals.Violations != 0 || len(res.Groups) != 1 {
		t.Fatalf("devices %+v, groups %+v", res.Totals, res.Groups)
	}
	g := res.Groups[0]
	if g.Group != "acme" || g.Devices != 2 || !g.Violated || g.Windows[0].MaxInWindow != 6 || g.Windows[0].Excess != 2 || res.Totals.GroupViolations != 1 {
		t.Fatalf("group %+v", g)
	}
	if Decide(res, 10).OK {
		t.Fatal("a violated group's verdict is OK")
	}
	res = Check(logs, CheckOptions{Groups: map[string]devicelimit.Quota{"acme": drop(6, time.Second)}})
	if res.Groups[0].Violated || !Decide(res, 10).OK {
		t.Fatalf("a group of 6 holding 6: %+v", res.Groups[0])
	}
}

// TestRunFloodingDeviceOfTenant: a tenant of 8 devices behind a real
// broker, one of them flooding: the flooding device is refused by its
// own quota, blocked, and reported blocked; the other 7 are served in
// full; the checker judges the tenant's group window and finds it held.
func TestRunFloodingDeviceOfTenant(t *testing.T) {
	own := devicelimit.Quota{Limit: 5, Window: time.Second,
		Block: devicelimit.Block{After: 5, Within: time.Second, For: time.Hour}}
	// The calm 7 send 2 a second: 3 in a closed second (at 0, 0.5, 1 s)
	// and 5 the flooding device gets in before its quota refuses it:
	// 26 in any second, within the group's 30.
	group := devicelimit.Quota{Limit: 30, Window: time.Second}
	resolver, err := devicelimit.NewResolver(devicelimit.Quota{Limit: 1, Window: time.Second}, []devicelimit.Rule{{
		Name: "tenants", ClientID: "tenant-{tenant}-*", Quota: own,
		Group: &devicelimit.Group{Name: "{tenant}", Quota: group},
	}}, devicelimit.DefaultBuckets)
	if err != nil {
		t.Fatal(err)
	}
	srv := startBroker(t, resolver, broker.Limits{})
	cfg := Config{
		Addr: srv.Addr().String(), Devices: 8, IDPattern: "tenant-acme-%02d", Rate: 2, QoS: 1, Duration: 2 * time.Second,
		Quota: own, Group: &Group{Name: "acme", Quota: group}, Flood: 1, FloodRate: 50, Seed: 1, Tolerance: 150 * time.Millisecond,
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rep.Blocked) != "[tenant-acme-00]" || !rep.Verdict.OK {
		t.Fatalf("blocked %v, verdict %+v, errors %v; want the flooding device blocked, a clean verdict", rep.Blocked, rep.Verdict, rep.Errors)
	}
	for _, d := range rep.Result.Devices {
		if d.Device != "tenant-acme-00" && (d.Refused != 0 || d.Accepted != d.Sent) {
			t.Errorf("%s of the tenant: %+v; want every message accepted", d.Device, d.Counts)

		}
	}
	if len(rep.Result.Groups) != 1 || rep.Result.Groups[0].Violated || rep.Result.Groups[0].Devices != 8 {
		t.Fatalf("groups %+v", rep.Result.Groups)
	}
	var b strings.Builder
	if err := rep.WriteSummary(&b); err != nil || !strings.Contains(b.String(), "group acme (8 devices): 30 messages per 1s: at most ") ||
		!strings.Contains(b.String(), "1 device was blocked by the gateway") {
		t.Fatalf("summary: %v\n%s", err, b.String())
	}
}
