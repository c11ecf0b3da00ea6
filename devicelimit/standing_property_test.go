package devicelimit_test

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/devicelimit/standingtest"
)

// TestStandingPromise: r never promises what the next publishes would
// not get, for every window kind, and the check fails when r is one too
// high (standingtest.Run).
func TestStandingPromise(t *testing.T) {
	t0 := devicelimit.TickOf(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	report, err := standingtest.Run(34, 400, t0, func(buckets int) standingtest.Backend {
		tab, err := devicelimit.NewTable(buckets)
		if err != nil {
			t.Fatal(err)
		}
		return standingtest.TableBackend{Table: tab}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(report)
}
