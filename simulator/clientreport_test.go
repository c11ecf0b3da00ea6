package simulator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestRunClientMix: a fleet half on paho.golang, half on the lean
// client, against a real gateway: the report sums each part apart, and
// counts the bytes each put on the wire and read from it.
func TestRunClientMix(t *testing.T) {
	q := devicelimit.Quota{Limit: 5, Window: time.Second, Policy: devicelimit.PolicyDrop}
	addr := startGateway(t, q)
	rep, summary := runMix(t, Config{
		Addr: addr, Devices: 4, Rate: 10, QoS: 1, PayloadSize: 100, Client: "50%:paho,50%:lean",
		Duration: 2 * time.Second, Drain: time.Second, Quota: q, Tolerance: 150 * time.Millisecond,
	})
	if len(rep.Clients) != 2 || rep.Clients[0].Client != ClientPaho || rep.Clients[1].Client != ClientLean {
		t.Fatalf("clients: %+v", rep.Clients)
	}
	if !strings.Contains(summary, "per client:") {
		t.Fatal("the summary lacks the per-client table")
	}
	sent := 0
	for _, c := range rep.Clients {
		sent += c.Sent
		if c.Devices != 2 || c.Admitted+c.Refused != c.Sent || c.Wanted != int64(c.Sent) || c.Violations != 0 {
			t.Fatalf("%s: %+v", c.Client, c)
		}
		// Every message went out with its 100-byte payload; every one
		// was acknowledged (4 bytes at least).
		if c.BytesOut < int64(100*c.Sent) || c.BytesIn < int64(4*c.Sent) {
			t.Fatalf("%s: %d bytes out, %d in for %d messages", c.Client, c.BytesOut, c.BytesIn, c.Sent)
		}
		// 10/s against 5/s: about half admitted, refused the rest.
		if c.QuotaRate != 5 || c.GoodputShare < 0.6 || c.GoodputShare > 1.5 || c.RefusedShare < 0.2 || c.RefusedShare > 0.7 {
			t.Fatalf("%s: quota %v/s, goodput %.0f%% of it, refused %.0f%%", c.Client, c.QuotaRate, 100*c.GoodputShare, 100*c.RefusedShare)
		}
	}
	if sent != rep.Result.Totals.Sent {
		t.Fatalf("clients sent %d, totals %d", sent, rep.Result.Totals.Sent)
	}
}

// runMix runs cfg and logs its summary, which it returns with the report.
func runMix(t *testing.T, cfg Config) (*Report, string) {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", b.String())
	return rep, b.String()
}

// TestQuotaRate: the tightest window per path, a byte window's in
// messages of the path's mean size, summed over the paths.
func TestQuotaRate(t *testing.T) {
	l := DeviceLog{
		Quota: devicelimit.WithWindows(devicelimit.PolicyDrop,
			devicelimit.Limit{N: 60, Window: time.Minute},
			devicelimit.Limit{N: 3000, Window: time.Minute, Unit: devicelimit.Bytes}),
		Classes: map[string]devicelimit.Quota{"alarms": drop(2, 10*time.Second)},
		Sent:    []Sent{{Size: 100}, {Size: 100}, {Size: 10, Class: "alarms"}},
	}
	// own: min(1/s, 50 bytes/s of 100-byte messages) = 0.5; alarms 0.2.
	if got := quotaRate(l); got < 0.7-1e-9 || got > 0.7+1e-9 {
		t.Fatalf("got %v, want 0.7", got)
	}
}
