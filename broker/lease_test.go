package broker

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// leaseWriter writes every lease the table asks, durable at once, as a
// store's Leaser would, until its stop is called; stop returns the keys
// written, in order.
func leaseWriter(t *testing.T, table *devicelimit.Table) (written func() []string, stop func()) {
	var mu sync.Mutex
	var keys []string
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-table.LeaseWake():
			case <-table.LeaseAsked():
			case <-quit:
				return
			}
			gen, ks := table.TakeLeases(func(key string, _ devicelimit.Lease) {
				mu.Lock()
				keys = append(keys, key)
				mu.Unlock()
			})
			table.LeasesDurable(gen)
			table.ReleaseLeaseKeys(ks)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(quit); <-done }) }
	t.Cleanup(stop)
	return func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(keys) }, stop
}

// With leases, an admitted publish is acknowledged and delivered only
// once its lease is durable: the lease writer here is the test. The
// quota (5 per 10 s) makes a lease of 1: the session's start leases the
// first publish (written by a writer that then stops), the first
// publish asks the lease of the second early, and the second waits for
// that.
func TestPublishWaitsForItsLease(t *testing.T) {
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	table.EnableLeases(devicelimit.DefaultLeasePolicy)
	f := start(t, fixtureOpts{table: table, def: devicelimit.Quota{Limit: 5, Window: 10 * time.Second}})
	_, stop := leaseWriter(t, table)
	sub := f.subscribe(t, "backend", "", "devices/#")
	p := f.connect(t, 5, "meter-1", "")
	stop()
	if _, err := p.publish(t, "devices/meter-1", "first", 1); err != nil {
		t.Fatal(err)
	}
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
	var meter devicelimit.Lease
	gen, keys := table.TakeLeases(func(key string, l devicelimit.Lease) {
		if key == "meter-1" {
			meter = l
		}
	})
	if meter.Cap < 2 {
		t.Errorf("meter-1's lease %+v, want one covering its second publish", meter)
	}
	table.LeasesDurable(gen)
	table.ReleaseLeaseKeys(keys)
	if err := receive(t, "the PUBACK", acked); err != nil {
		t.Fatal(err)
	}
	sub.waitMarker(t, "reading")
	if w := table.LeaseWaits(); w != 1 {
		t.Errorf("LeaseWaits = %d, want 1 (the second publish)", w)
	}
}

// A device's first leases are asked as its session starts, and its
// CONNACK waits for them: its first publish is then acknowledged
// without waiting for a lease write (none comes here: the writer stops
// at the CONNACK, and a publish that waited would be given up
// unacknowledged after 5 s). Consumers take none.
func TestSessionStartLeasesFirstPublish(t *testing.T) {
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	table.EnableLeases(devicelimit.DefaultLeasePolicy)
	f := start(t, fixtureOpts{table: table, options: func(o *Options) { o.Limits.Consumers = []string{"backend"} }})
	written, stop := leaseWriter(t, table)
	sub := f.subscribe(t, "backend", "", "devices/#")
	p := f.connect(t, 5, "meter-1", "")
	stop()
	if keys := written(); !slices.Equal(keys, []string{"meter-1"}) {
		t.Fatalf("leases written by the CONNACK: %q, want meter-1's only (the consumer takes none)", keys)
	}
	if _, err := p.publish(t, "devices/meter-1", "reading", 1); err != nil {
		t.Fatal(err)
	}
	sub.waitMarker(t, "reading")
	if w := table.LeaseWaits(); w != 0 {
		t.Fatalf("LeaseWaits = %d, want 0: the first publish waited for a lease", w)
	}
}

// A data file that records no lease (here: no writer at all) delays a
// CONNACK by leaseWait, not forever; the device's first publish is
// acknowledged once a writer records its lease.
func TestSessionStartLeaseNotRecorded(t *testing.T) {
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	table.EnableLeases(devicelimit.DefaultLeasePolicy)
	f := start(t, fixtureOpts{table: table})
	p := f.connect(t, 5, "meter-1", "") // waits leaseWait, then the CONNACK goes
	if table.LeaseWaits() != 0 {
		t.Fatalf("LeaseWaits = %d before any publish", table.LeaseWaits())
	}
	written, _ := leaseWriter(t, table)
	if _, err := p.publish(t, "devices/meter-1", "reading", 1); err != nil {
		t.Fatal(err)
	}
	// The writer may have recorded the lease before the publish came
	// (the session's ask is still queued) or while it waited.
	if w := table.LeaseWaits(); w > 1 || !slices.Contains(written(), "meter-1") {
		t.Fatalf("LeaseWaits = %d, written %q: want meter-1's lease written, and at most the first publish waiting for it", w, written())
	}
}
