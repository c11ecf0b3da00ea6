package broker

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/topk"
)

// Every refusal is recorded in Options.Throttled by device at its
// decision instant: drops, policy disconnects and overflowed deferrals;
// admitted and deferred publishes are not.
func TestThrottledRecordsRefusals(t *testing.T) {
	t.Parallel()
	tk := topk.New(8, 10*time.Second)
	f := start(t, fixtureOpts{
		rules: []devicelimit.Rule{
			rule("drop-*", 1, devicelimit.PolicyDrop),
			rule("disc-*", 1, devicelimit.PolicyDisconnect),
			deferRule("defer-*", 1, time.Second),
		},
		store:     openStore(t, t.TempDir()),
		limits:    DeferLimits{MaxMessagesPerDevice: 1},
		throttled: tk,
	})

	ok := f.connect(t, 5, "ok-1", "")
	for _, m := range payloads("ok", 3) {
		if a, err := ok.publish(t, "t/ok-1", m, 1); err != nil || a.code != 0 {
			t.Fatalf("publish %s: 0x%02x %v", m, a.code, err)
		}
	}
	drop := f.connect(t, 5, "drop-1", "")
	for i, m := range payloads("d", 4) { // 1 admitted, 3 dropped
		want := byte(0x97)
		if i == 0 {
			want = 0
		}
		if a, err := drop.publish(t, "t/drop-1", m, 1); err != nil || a.code != want {
			t.Fatalf("publish %s: 0x%02x %v, want 0x%02x", m, a.code, err, want)
		}
	}
	def := f.connect(t, 5, "defer-1", "")
	for i, m := range payloads("q", 4) { // 1 admitted, 1 deferred, 2 overflowed
		want := byte(0x97)
		if i < 2 {
			want = 0
		}
		if a, err := def.publish(t, "t/defer-1", m, 1); err != nil || a.code != want {
			t.Fatalf("publish %s: 0x%02x %v, want 0x%02x", m, a.code, err, want)
		}
	}
	disc := f.connect(t, 5, "disc-1", "")
	if a, err := disc.publish(t, "t/disc-1", "x", 1); err != nil || a.code != 0 {
		t.Fatalf("publish: 0x%02x %v", a.code, err)
	}
	disc.send("t/disc-1", "over", 1) // one only: later ones are refused too
	receive(t, "the connection to end", disc.lost())
	eventually(t, "all refusals decided", func() bool {
		st := f.srv.Stats()
		return st.Dropped == 3 && st.Overflowed == 2 && st.Disconnected == 1
	})

	want := []topk.Entry{{Device: "drop-1", Refused: 3}, {Device: "defer-1", Refused: 2}, {Device: "disc-1", Refused: 1}}
	if got := tk.Top(0, f.clock.Now()); !slices.Equal(got, want) {
		t.Fatalf("top: got %v, want %v", got, want)
	}
	if got := tk.Top(1, f.clock.Now()); !slices.Equal(got, want[:1]) {
		t.Fatalf("top 1: got %v, want %v", got, want[:1])
	}
	// Recorded at the manual clock's time: two periods later they are
	// forgotten.
	if got := tk.Top(0, f.clock.Advance(20*time.Second)); len(got) != 0 {
		t.Fatalf("top after two periods: got %v, want none", got)
	}
}

// DeviceStatus reports the device's live connection, the clock's time of
// its latest publish and its deferred messages; after it disconnects,
// the last-seen time stays until the sweep forgets it.
func TestDeviceStatus(t *testing.T) {
	t.Parallel()
	f := start(t, fixtureOpts{
		rules: []devicelimit.Rule{deferRule("dev-*", 1, time.Second)},
		store: openStore(t, t.TempDir()),
	})
	if got := f.srv.DeviceStatus("dev-1"); got != (DeviceStatus{}) {
		t.Fatalf("unknown device: got %+v, want zero", got)
	}
	since := f.clock.Now()
	p := f.connect(t, 5, "dev-1", "alice")
	live := f.srv.DeviceStatus("dev-1")
	if host, _, err := net.SplitHostPort(live.Remote); err != nil || host != "127.0.0.1" {
		t.Fatalf("connected: remote %q, want 127.0.0.1:port", live.Remote)
	}
	want := DeviceStatus{Connected: true, ClientID: "dev-1", Username: "alice", Remote: live.Remote, Protocol: 5, Since: since}
	if got := f.srv.DeviceStatus("dev-1"); got != want {
		t.Fatalf("connected, no publish: got %+v, want %+v", got, want)
	}
	if n := f.srv.Stats().ConnectedClients; n != 1 {
		t.Fatalf("ConnectedClients %d, want 1", n)
	}

	at := f.clock.Advance(1500 * time.Millisecond)
	for _, m := range payloads("m", 3) { // 1 admitted, 2 deferred
		if a, err := p.publish(t, "t/dev-1", m, 1); err != nil || a.code != 0 {
			t.Fatalf("publish %s: 0x%02x %v", m, a.code, err)
		}
	}
	f.clock.Advance(time.Second) // no publish since: LastSeen stays at
	want = DeviceStatus{Connected: true, ClientID: "dev-1", Username: "alice", LastSeen: at, Deferred: 2, Remote: live.Remote, Protocol: 5, Since: since}
	if got := f.srv.DeviceStatus("dev-1"); got != want {
		t.Fatalf("after publishing: got %+v, want %+v", got, want)
	}

	p.close()
	want = DeviceStatus{LastSeen: at, Deferred: 2}
	eventually(t, "the disconnect", func() bool { return f.srv.DeviceStatus("dev-1") == want })
	if n := f.srv.Stats().ConnectedClients; n != 0 {
		t.Fatalf("ConnectedClients %d after disconnect, want 0", n)
	}

	f.srv.tick(at.Add(lastSeenRetention)) // not yet older than the retention
	if got := f.srv.DeviceStatus("dev-1"); got != want {
		t.Fatalf("after a sweep within the retention: got %+v, want %+v", got, want)
	}
	f.srv.tick(at.Add(lastSeenRetention + time.Second))
	want = DeviceStatus{Deferred: 2} // still queued: no release round ran
	if got := f.srv.DeviceStatus("dev-1"); got != want {
		t.Fatalf("after the retention: got %+v, want %+v", got, want)
	}
}

// With identity username, several connections are one device: the
// status shows the latest live one, and the one before when it ends.
func TestDeviceStatusSeveralConnections(t *testing.T) {
	t.Parallel()
	f := start(t, fixtureOpts{identity: devicelimit.IdentityUsername})
	a := f.connect(t, 5, "client-a", "fleet-1")
	b := f.connect(t, 3, "client-b", "fleet-1")
	since := f.clock.Now()
	want := DeviceStatus{Connected: true, ClientID: "client-b", Username: "fleet-1", Protocol: 4, Since: since}
	if got := noRemote(f.srv.DeviceStatus("fleet-1")); got != want {
		t.Fatalf("two connections: got %+v, want %+v", got, want)
	}
	if n := f.srv.Stats().ConnectedClients; n != 2 {
		t.Fatalf("ConnectedClients %d, want 2", n)
	}
	at := f.clock.Advance(time.Second)
	if ack, err := a.publish(t, "t/fleet-1", "x", 1); err != nil || ack.code != 0 {
		t.Fatalf("publish: 0x%02x %v", ack.code, err)
	}
	b.close()
	want = DeviceStatus{Connected: true, ClientID: "client-a", Username: "fleet-1", LastSeen: at, Protocol: 5, Since: since}
	eventually(t, "client-b gone", func() bool { return noRemote(f.srv.DeviceStatus("fleet-1")) == want })
	if n := f.srv.Stats().ConnectedClients; n != 1 {
		t.Fatalf("ConnectedClients %d, want 1", n)
	}
}

// A session takeover (same client ID) leaves one connected client, and
// a device that disconnects without publishing is forgotten at once.
func TestConnectedClientsTakeover(t *testing.T) {
	t.Parallel()
	f := start(t, fixtureOpts{})
	first := f.connect(t, 5, "dev-1", "")
	f.connect(t, 5, "dev-1", "")
	receive(t, "the first connection to be taken over", first.lost())
	eventually(t, "one connected client", func() bool { return f.srv.Stats().ConnectedClients == 1 })
	want := DeviceStatus{Connected: true, ClientID: "dev-1", Protocol: 5, Since: f.clock.Now()}
	if got := noRemote(f.srv.DeviceStatus("dev-1")); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range 3 {
		p := f.connect(t, 3, fmt.Sprintf("quiet-%d", i), "")
		p.close()
	}
	eventually(t, "quiet devices gone", func() bool { return f.srv.Stats().ConnectedClients == 1 })
	f.srv.hook.devMu.Lock()
	n := len(f.srv.hook.devices)
	f.srv.hook.devMu.Unlock()
	if n != 1 {
		t.Fatalf("%d devices remembered, want 1 (quiet devices have nothing to remember)", n)
	}
}

// Recording a refusal of a device already in Options.Throttled, as
// every refusal path does, allocates nothing. (The whole refused publish
// is not measured: its reason string allocates, and fmt's sync.Pool
// makes the count vary under -race.)
func TestThrottledRecordAllocatesNothing(t *testing.T) {
	q := devicelimit.Quota{Limit: 1, Window: time.Hour, Policy: devicelimit.PolicyDrop}
	s, cl, pk := newHookServer(t, q, nil)
	tk := topk.New(4, time.Minute)
	s.hook.throttled = tk
	for range 2 { // admitted, then refused: the device is tracked
		_, _ = s.hook.OnPublish(cl, pk)
	}
	c := s.hook.conns.info(cl)
	if n := testing.AllocsPerRun(1000, func() { s.hook.refused(c, pk.TopicName, "", refusalWindow, t0) }); n != 0 {
		t.Fatalf("%v allocs per recorded refusal, want 0", n)
	}
	// AllocsPerRun runs once more to warm up.
	if got := tk.Top(0, t0); len(got) != 1 || got[0].Device != "dev-1" || got[0].Refused != 1+1+1000 {
		t.Fatalf("top: got %v, want dev-1 refused 1002 times", got)
	}
	if got := s.Devices(); len(got) != 1 || got[0].Refusals != 1+1+1000 || got[0].LastRefused != t0 {
		t.Fatalf("devices: got %+v, want dev-1 refused 1002 times, last at t0", got)
	}
	if got := s.Refusals("dev-1"); len(got) != recentRefusals || got[0].Topic != pk.TopicName || got[0].Reason != refusalWindow {
		t.Fatalf("recent refusals: got %+v, want %d of %s", got, recentRefusals, pk.TopicName)
	}
}

// noRemote is st without its remote address (a random port).
func noRemote(st DeviceStatus) DeviceStatus {
	st.Remote = ""
	return st
}
