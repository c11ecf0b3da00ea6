package broker

import (
	"fmt"
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

// A reload that removes a device's rule between its CONNACK and its
// first publish: the connect leased the rule's window (5 per 10 s, a
// lease of 1), the publishes are decided under the default (8 per
// minute) from the first, each acknowledged once its lease is written,
// and the default holds exactly: 8 admitted, the 9th refused.
func TestSessionLeaseThenRuleRemoved(t *testing.T) {
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	table.EnableLeases(devicelimit.DefaultLeasePolicy)
	def := devicelimit.Quota{Limit: 8, Window: time.Minute}
	f := start(t, fixtureOpts{table: table, def: def, options: func(o *Options) { o.Limits.Consumers = []string{"backend"} },
		rules: []devicelimit.Rule{{Name: "meters", ClientID: "meter-*", Quota: devicelimit.Quota{Limit: 5, Window: 10 * time.Second}}}})
	written, _ := leaseWriter(t, table)
	sub := f.subscribe(t, "backend", "", "devices/#")
	p := f.connect(t, 5, "meter-1", "")
	if keys := written(); !slices.Equal(keys, []string{"meter-1"}) {
		t.Fatalf("leases written by the CONNACK: %q, want meter-1's", keys)
	}
	n, err := devicelimit.NewResolver(def, nil, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.resolver.Reconfigure(n); err != nil {
		t.Fatal(err)
	}
	if got := f.srv.Reconfigure(); got != 2 {
		t.Fatalf("Reconfigure updated %d connections, want 2", got)
	}
	for i := range def.Limit {
		if a, err := p.publish(t, "devices/meter-1", fmt.Sprint("reading-", i), 1); err != nil || a.code != 0 {
			t.Fatalf("publish %d under the default: code 0x%02x, %v; want admitted", i, a.code, err)
		}
	}
	if a, err := p.publish(t, "devices/meter-1", "over", 1); err != nil || a.code != 0x97 {
		t.Fatalf("publish %d: code 0x%02x, %v; want 0x97 (quota exceeded): the default is 8 per minute", def.Limit, a.code, err)
	}
	if got := sub.waitMarker(t, fmt.Sprint("reading-", def.Limit-1)); len(got) != def.Limit-1 {
		t.Fatalf("delivered before the last: %q", got)
	}
	if sub.has("over") {
		t.Fatal("the refused publish was delivered")
	}
}
