package simulator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/broker"
	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/mosquittotest"
)

// TestLeanClientAgainstGateway: the lean client's devices through a real
// broker with the gateway's throttle, at QoS 1 and 2: a clean verdict,
// every refusal a PUBACK (PUBREC) 0x97, the checker's buckets the same
// shape as paho's (some refused, none lost or leaked), and a blocked
// device reported blocked.
func TestLeanClientAgainstGateway(t *testing.T) {
	q := devicelimit.Quota{Limit: 5, Window: time.Second}
	srv := startServerClasses(t, q, nil)
	for _, qos := range []byte{1, 2} {
		cfg := Config{
			Addr: srv.Addr().String(), Devices: 10, Rate: 10, QoS: qos, Duration: 1500 * time.Millisecond,
			Quota: q, Client: ClientLean, Seed: 1, Tolerance: 150 * time.Millisecond, IDPattern: fmt.Sprintf("lean%d-%%02d", qos),
		}
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		tt := rep.Result.Totals
		if !rep.Verdict.OK || tt.Refused == 0 || tt.Accepted == 0 || tt.Lost != 0 || tt.Leaked != 0 || tt.Unacked != 0 || rep.ConnectFailures != 0 {
			t.Fatalf("qos %d: verdict %+v, totals %+v, errors %v", qos, rep.Verdict, tt, rep.Errors)
		}
		if c := rep.Connect; c.LatencyP50 <= 0 || c.LatencyP50 > c.LatencyP99 || c.LatencyP99 > c.LatencyMax {
			t.Fatalf("qos %d: connect latency %+v, want 0 < p50 <= p99 <= max for 10 devices", qos, c)
		}
		if a := rep.PubackConnected; rep.AllConnected <= 0 || a.LatencyMax <= 0 || a.LatencyMax > rep.Puback.LatencyMax {
			t.Fatalf("qos %d: all connected after %v, PUBACK then %+v, want a part of every PUBACK's %+v", qos, rep.AllConnected, a, rep.Puback)
		}
	}
	bq := devicelimit.Quota{Limit: 2, Window: time.Second, Block: devicelimit.Block{After: 3, Within: time.Second, For: time.Hour}}
	blocking := startServerClasses(t, bq, nil)
	rep, err := Run(context.Background(), Config{Addr: blocking.Addr().String(), Devices: 2, Rate: 20, QoS: 1, Duration: time.Second,
		Quota: bq, Client: ClientLean, Seed: 1, Tolerance: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Blocked) != 2 || !rep.Verdict.OK {
		t.Fatalf("blocked %v, verdict %+v, errors %v; want both flooding devices blocked", rep.Blocked, rep.Verdict, rep.Errors)
	}
}

// TestLeanClientAgainstMosquitto: the lean client speaks MQTT 5 to a
// broker that is not mochi: every message accepted and delivered.
func TestLeanClientAgainstMosquitto(t *testing.T) {
	m := mosquittotest.Start(t)
	cfg := Config{
		Addr: m.Addr, Devices: 5, Rate: 20, QoS: 1, Duration: time.Second,
		Quota: devicelimit.Quota{Limit: 1000, Window: time.Second}, Client: ClientLean, Tolerance: 150 * time.Millisecond,
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tt := rep.Result.Totals
	if !rep.Verdict.OK || tt.Sent == 0 || tt.Accepted != tt.Sent {
		t.Fatalf("verdict %+v, totals %+v, errors %v", rep.Verdict, tt, rep.Errors)
	}
	cfg.Protocol = 4
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "lean client speaks MQTT 5 only") {
		t.Fatalf("lean with MQTT 3.1.1: %v", err)
	}
}

// TestLeanClientPingsUnderKeepalive: under a broker that imposes a
// keepalive of 2 s (the gateway's mqtt.keepalive.max; mochi closes a
// connection silent for 3 s), lean devices that publish every 4 s stay
// connected: they send PINGREQs in between.
func TestLeanClientPingsUnderKeepalive(t *testing.T) {
	q := devicelimit.Quota{Limit: 100, Window: time.Second}
	resolver, err := devicelimit.NewResolver(q, nil, devicelimit.DefaultBuckets)
	if err != nil {
		t.Fatal(err)
	}
	srv := startBroker(t, resolver, broker.Limits{KeepaliveMax: 2 * time.Second})
	rep, err := Run(context.Background(), Config{Addr: srv.Addr().String(), Devices: 3, Rate: 0.25, QoS: 1, Duration: 8500 * time.Millisecond,
		Quota: q, Client: ClientLean, Tolerance: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tt := rep.Result.Totals
	if !rep.Verdict.OK || rep.Disconnects != 0 || rep.ConnectFailures != 0 || tt.Sent != 9 || tt.Accepted != 9 {
		t.Fatalf("verdict %+v, disconnects %d, connect failures %d, totals %+v, errors %q", rep.Verdict, rep.Disconnects, rep.ConnectFailures, tt, rep.Errors)
	}
}
