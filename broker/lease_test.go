package broker

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// With leases, an admitted publish is acknowledged and delivered only
// once its lease is durable: the lease writer here is the test.
func TestPublishWaitsForItsLease(t *testing.T) {
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	table.EnableLeases(devicelimit.DefaultLeasePolicy)
	f := start(t, fixtureOpts{table: table})
	sub := f.subscribe(t, "backend", "", "devices/#")
	p := f.connect(t, 5, "meter-1", "")
	acked := make(chan error, 1)
	go func() {
		_, err := p.publish(t, "devices/meter-1", "reading", 1)
		acked <- err
	}()
	receive(t, "the lease asked", table.LeaseWake())
	// Not acknowledged nor delivered while the lease is not durable.
	select {
	case err := <-acked:
		t.Fatalf("acknowledged before its lease was durable (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	if sub.has("reading") {
		t.Fatal("delivered before its lease was durable")
	}
	gen, keys := table.TakeLeases(func(key string, l devicelimit.Lease) {
		if key != "meter-1" || l.Cap < 1 {
			t.Errorf("lease %q %+v, want meter-1's covering 1", key, l)
		}
	})
	table.LeasesDurable(gen)
	table.ReleaseLeaseKeys(keys)
	if err := receive(t, "the PUBACK", acked); err != nil {
		t.Fatal(err)
	}
	sub.waitMarker(t, "reading")
}
