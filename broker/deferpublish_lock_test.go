package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/devicegate/devicegate/devicelimit"
)

// A publish under policy defer decides outside the shard lock: while
// one device's decision waits on a slow limiter (a Redis round trip up
// to its timeout), a device of the same shard still publishes, and is
// not held up behind it.
func TestDeferPublishDecidesOutsideShardLock(t *testing.T) {
	gate := newGate("slow")
	f := startGated(t, gate, fixtureOpts{rules: []devicelimit.Rule{deferRule("*", 5, time.Second)}})
	other := sameShard(f.srv.def, "slow")
	slow := f.connect(t, 5, "slow", "").(*pub5)
	slowDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_, err := slow.c.Publish(ctx, &paho.Publish{Topic: "t/slow", QoS: 1, Payload: []byte("s")})
		slowDone <- err
	}()
	<-gate.entered // the slow device's decision waits

	p := f.connect(t, 5, other, "").(*pub5)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := p.c.Publish(ctx, &paho.Publish{Topic: "t/other", QoS: 1, Payload: []byte("o")})
		if err == nil && resp.ReasonCode != 0 {
			err = fmt.Errorf("PUBACK 0x%02x", resp.ReasonCode)
		}
		done <- err
	}()
	err := <-done
	close(gate.open)
	if err != nil {
		t.Fatalf("publish of %s while a decision of %q in its shard waited: %v", other, "slow", err)
	}
	if err := <-slowDone; err != nil {
		t.Fatalf("slow publish: %v", err)
	}
	if st := f.srv.Stats(); st.Allowed != 2 {
		t.Fatalf("stats %+v, want both allowed", st)
	}
}

// newGate returns a gate on device, closed.
func newGate(device string) *gateLimiter {
	return &gateLimiter{device: device, entered: make(chan struct{}, 1), open: make(chan struct{})}
}

// startGated starts a broker with a store whose limiter is gate over
// its table.
func startGated(t *testing.T, gate *gateLimiter, fo fixtureOpts) *fixture {
	t.Helper()
	fo.store = openStore(t, t.TempDir())
	fo.options = func(o *Options) {
		gate.Table = o.Table
		o.Limiter = gate
	}
	return start(t, fo)
}

// sameShard returns a device name in device's deferral shard.
func sameShard(d *deferrer, device string) string {
	for i := 0; ; i++ {
		if name := fmt.Sprintf("other-%d", i); d.shard(name) == d.shard(device) {
			return name
		}
	}
}
