package simulator

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestRunAdaptive: half the fleet naive (lean), half adaptive, each
// device wanting twice its quota, against a real gateway that gives
// feedback (its default, below a quarter left): the naive devices are
// refused, the adaptive ones pace themselves by RateLimit and are not,
// and nobody exceeds the quota.
func TestRunAdaptive(t *testing.T) {
	q := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 10, Window: 10 * time.Second},
		devicelimit.Limit{N: 2000, Window: 10 * time.Second, Unit: devicelimit.Bytes})
	addr := startGateway(t, q)
	rep, _ := runMix(t, Config{
		Addr: addr, Devices: 4, Rate: 2, QoS: 1, PayloadSize: 100, Client: "50%:lean,50%:adaptive",
		Duration: 6 * time.Second, Drain: time.Second, Quota: q, Tolerance: 150 * time.Millisecond,
	})
	if len(rep.Clients) != 2 || rep.Result.Totals.Violations != 0 || len(rep.Errors) != 0 {
		t.Fatalf("clients %+v, totals %+v, errors %v", rep.Clients, rep.Result.Totals, rep.Errors)
	}
	naive, adaptive := rep.Clients[0], rep.Clients[1]
	if naive.Refused == 0 {
		t.Fatalf("naive devices at twice their quota were never refused: %+v", naive)
	}
	// 6 s of a 10-per-10 s window paced evenly: about 6 each.
	if adaptive.Refused != 0 || adaptive.Admitted < 2*4 || adaptive.Wanted <= int64(adaptive.Sent) {
		t.Fatalf("adaptive devices: %+v", adaptive)
	}
}
