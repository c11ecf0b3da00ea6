package broker

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	mqtt "github.com/mochi-mqtt/server/v2"
	mochipk "github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// statusJSON is the status message as a device decodes it.
type statusJSON struct {
	Policies []struct {
		Name string `json:"name"`
		Q    int    `json:"q"`
		W    int    `json:"w"`
		Unit string `json:"unit"`
	} `json:"policies"`
	Remaining []struct {
		Name string `json:"name"`
		R    int    `json:"r"`
		T    int    `json:"t"`
	} `json:"remaining"`
	Shadow       bool   `json:"shadow"`
	Blocked      bool   `json:"blocked"`
	BlockedUntil string `json:"blocked_until"`
}

// watchStatus connects an MQTT 3.1.1 device (paho.mqtt.golang) that
// subscribes to its status topic at QoS 0; statuses come on the channel.
func watchStatus(t *testing.T, f *fixture, id string) (mqtt3.Client, <-chan statusJSON) {
	t.Helper()
	c, err := f.dial3(t, id, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan statusJSON, 16)
	tok := c.Subscribe(StatusPrefix+id, 0, func(_ mqtt3.Client, m mqtt3.Message) {
		var st statusJSON
		if err := json.Unmarshal(m.Payload(), &st); err != nil {
			t.Errorf("status %q: %v", m.Payload(), err)
		}
		if m.Qos() != 0 || m.Retained() || m.Topic() != StatusPrefix+id {
			t.Errorf("status on %q, QoS %d, retained %v", m.Topic(), m.Qos(), m.Retained())
		}
		got <- st
	})
	if !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	if code := tok.(*mqtt3.SubscribeToken).Result()[StatusPrefix+id]; code != 0 {
		t.Fatalf("own status topic: SUBACK 0x%02x, want 0", code)
	}
	return c, got
}

// noStatus checks that no status came: an UNSUBSCRIBE round trip
// first, whose UNSUBACK comes after whatever the device's earlier
// packets caused.
func noStatus(t *testing.T, c mqtt3.Client, got <-chan statusJSON, what string) {
	t.Helper()
	if tok := c.Unsubscribe("devices/none"); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("unsubscribe: %v", tok.Error())
	}
	select {
	case st := <-got:
		t.Fatalf("%s: unexpected status %+v", what, st)
	default:
	}
}

// matchesTable checks that a status's remaining are the table's standing
// of the device's windows under q now, tightest first, t in whole
// seconds rounded up.
func matchesTable(t *testing.T, f *fixture, device string, q devicelimit.Quota, st statusJSON) {
	t.Helper()
	var s devicelimit.Standing
	f.table.StandingAt(device, "", q, "", devicelimit.Quota{}, 0, false, f.clock.Now(), &s)
	var want []string
	for _, w := range s.Windows[:s.N] {
		want = append(want, fmt.Sprintf("%s r=%d t=%d", devicelimit.AppendPolicyName(nil, w.Class, w.Group, w.Limit), w.Remaining, ceilSeconds(w.Reset)))
	}
	var got []string
	for _, r := range st.Remaining {
		got = append(got, fmt.Sprintf("%s r=%d t=%d", r.Name, r.R, r.T))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("status remaining %v, table %v", got, want)
	}
}

func publish3(t *testing.T, c mqtt3.Client, topic string, n int) {
	t.Helper()
	for i := range n {
		tok := c.Publish(topic, 1, false, fmt.Sprintf("m%d", i))
		if !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
}

// TestStatusTopic: an MQTT 3.1.1 device reads its status when it
// subscribes, when a window falls below the default feedback threshold
// (a quarter left), and at its first refusal; at most one a second;
// its values are the table's.
func TestStatusTopic(t *testing.T) {
	q := devicelimit.WithWindows(devicelimit.PolicyDrop,
		devicelimit.Limit{N: 8, Window: time.Hour},
		devicelimit.Limit{N: 1000, Window: 10 * time.Minute, Unit: devicelimit.Bytes})
	f := start(t, fixtureOpts{def: q})
	c, got := watchStatus(t, f, "meter-1")
	st := receive(t, "status at subscribe", got)
	want := `{[{1h 8 3600 messages} {10m-bytes 1000 600 bytes}] [{1h 8 0} {10m-bytes 1000 0}] false false }`
	if s := fmt.Sprint(st); s != want {
		t.Fatalf("status at subscribe:\n got %s\nwant %s", s, want)
	}
	// 5 messages of 2 bytes: 3 of 8 left (37 %), not below a quarter.
	publish3(t, c, "devices/meter-1", 5)
	noStatus(t, c, got, "above the threshold")
	// The 7th leaves 1 of 8 (12 %): below; but within a second of the
	// last status, so it waits for the next publish a second later.
	publish3(t, c, "devices/meter-1", 2)
	noStatus(t, c, got, "within a second")
	f.clock.Advance(time.Second)
	publish3(t, c, "devices/meter-1", 1) // the 8th: 0 left
	st = receive(t, "status below the threshold", got)
	matchesTable(t, f, "meter-1", q, st)
	if st.Remaining[0].Name != "1h" || st.Remaining[0].R != 0 || st.Remaining[1].R != 1000-16 {
		t.Fatalf("status below the threshold: %+v", st.Remaining)
	}
	// The 9th is refused (3.1.1: dropped in silence): a status, a second on.
	f.clock.Advance(time.Second)
	publish3(t, c, "devices/meter-1", 1)
	st = receive(t, "status at the first refusal", got)
	matchesTable(t, f, "meter-1", q, st)
	if st.Remaining[0].R != 0 || st.Remaining[0].T == 0 {
		t.Fatalf("status at the refusal: %+v", st.Remaining)
	}
	// Refused again: no status until an admission and a refusal again.
	f.clock.Advance(time.Second)
	publish3(t, c, "devices/meter-1", 3)
	noStatus(t, c, got, "refused again")
}

// TestStatusTopicACL: nobody but the device subscribes to its status
// topic (SUBACK 0x80 for MQTT 3.1.1, 0x87 for MQTT 5; wildcards and
// shared subscriptions under $devicegate/ too), and nobody publishes
// there, not even the device: MQTT 5 PUBACK 0x87.
func TestStatusTopicACL(t *testing.T) {
	f := start(t, fixtureOpts{})
	c1, got := watchStatus(t, f, "meter-1")
	receive(t, "status at subscribe", got)

	other, err := f.dial3(t, "meter-2", "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, filter := range []string{StatusPrefix + "meter-1", "$devicegate/#", "$devicegate/status/+", StatusPrefix + "meter-2/x"} {
		tok := other.Subscribe(filter, 0, func(mqtt3.Client, mqtt3.Message) {})
		if !tok.WaitTimeout(waitTimeout) {
			t.Fatal("subscribe timed out")
		}
		if code := tok.(*mqtt3.SubscribeToken).Result()[filter]; code != 0x80 {
			t.Errorf("3.1.1 meter-2 subscribes %q: SUBACK 0x%02x, want 0x80", filter, code)
		}
	}
	p5 := &pub5{lostCh: make(chan struct{})}
	p5.c = f.dial5(t, "meter-3", "", nil)
	for _, filter := range []string{StatusPrefix + "meter-1", "$share/g/" + StatusPrefix + "meter-3", "$devicegate/status/#"} {
		if code := p5.subscribe(t, filter); code != 0x87 {
			t.Errorf("MQTT 5 meter-3 subscribes %q: SUBACK 0x%02x, want 0x87", filter, code)
		}
	}
	if code := p5.subscribe(t, StatusPrefix+"meter-3"); code >= 0x80 {
		t.Errorf("MQTT 5 meter-3 subscribes its own status: SUBACK 0x%02x", code)
	}
	for _, topic := range []string{StatusPrefix + "meter-1", StatusPrefix + "meter-3", "$devicegate/x"} {
		a, err := p5.publish(t, topic, `{"blocked":true}`, 1)
		if err != nil || a.code != 0x87 {
			t.Errorf("publish to %q: PUBACK 0x%02x (%v), want 0x87", topic, a.code, err)
		}
	}
	// meter-1 saw no forged status.
	noStatus(t, c1, got, "after the forged publishes")
}

// TestStatusTopicWildcardClientID: a client ID that is not one topic
// level (with '#', '+' or '/') has no status topic: its SUBSCRIBE to
// StatusPrefix + its ID, a wildcard over other clients' status topics,
// is refused (3.1.1 0x80, MQTT 5 0x87), with the client ID as the device
// identity and with the username as it. Before, client ID "#" was
// granted $devicegate/status/#.
func TestStatusTopicWildcardClientID(t *testing.T) {
	for _, identity := range []devicelimit.Identity{devicelimit.IdentityClientID, devicelimit.IdentityUsername} {
		f := start(t, fixtureOpts{identity: identity})
		for _, id := range []string{"#", "+", "x/+", "x/#", "a/b"} {
			r := dialRaw(t, f.addr)
			r.send(rawConnect3(id, "meter-1", "pw"))
			r.connack()
			r.send(rawSubscribe(4, 1, StatusPrefix+id))
			if code := reasonOf(r.must(9, "SUBACK")); code != 0x80 {
				t.Errorf("identity %v, 3.1.1 client ID %q subscribes %q: SUBACK 0x%02x, want 0x80", identity, id, StatusPrefix+id, code)
			}
			r5 := dialRaw(t, f.addr)
			r5.send(rawConnectFlags("MQTT", 5, 0x02|flagUsername|flagPassword, id))
			if p := r5.must(2, "CONNACK"); p.body[1] != 0 {
				t.Fatalf("MQTT 5 client ID %q: CONNACK 0x%02x", id, p.body[1])
			}
			r5.send(rawSubscribe(5, 1, StatusPrefix+id))
			if code := reasonOf(r5.must(9, "SUBACK")); code != 0x87 {
				t.Errorf("identity %v, MQTT 5 client ID %q subscribes %q: SUBACK 0x%02x, want 0x87", identity, id, StatusPrefix+id, code)
			}
		}
	}
}

// rawUnsubscribe is an UNSUBSCRIBE of filter, MQTT 5 (with empty
// properties) or 3.1.1.
func rawUnsubscribe(level byte, pid int, filter string) []byte {
	body := u16(pid)
	if level == 5 {
		body = append(body, 0)
	}
	return packet(0xa2, append(body, mqttString(filter)...))
}

// TestStatusTopicSubscribeLimited: a SUBSCRIBE to one's status topic
// gets a status only within the limits of every status: the first of
// the connection at once, any later one only when the device published
// since the last status and a second has passed, else with its next
// publish that they allow. Raw MQTT 3.1.1 and MQTT 5 clients: 100
// SUBSCRIBEs get one status (before: 100), an UNSUBSCRIBE between them
// changes nothing.
func TestStatusTopicSubscribeLimited(t *testing.T) {
	f := start(t, fixtureOpts{})
	for _, level := range []byte{4, 5} {
		id := fmt.Sprintf("meter-v%d", level)
		topic := StatusPrefix + id
		r := dialRaw(t, f.addr)
		if level == 4 {
			r.send(rawConnect3(id, "", ""))
		} else {
			r.send(rawConnectV(5, id, []byte{0}, nil))
		}
		r.connack()
		pid := 0
		// statuses sends data, then a PINGREQ, and counts the statuses
		// and SUBACKs before the PINGRESP.
		statuses := func(what string, data ...[]byte) (n, subacks int) {
			t.Helper()
			r.send(append(data, rawPingreq)...)
			for _, p := range r.until(13, what) {
				switch p.typ >> 4 {
				case 3:
					if tp := publishTopic(p); tp != topic {
						t.Fatalf("%s: publish on %q", what, tp)
					}
					n++
				case 9:
					if code := reasonOf(p); code >= 0x80 {
						t.Fatalf("%s: SUBACK 0x%02x", what, code)
					}
					subacks++
				}
			}
			return n, subacks
		}
		subscribes := func(k int, unsubscribe bool) [][]byte {
			var out [][]byte
			for range k {
				if unsubscribe {
					pid++
					out = append(out, rawUnsubscribe(level, pid, topic))
				}
				pid++
				out = append(out, rawSubscribe(level, pid, topic))
			}
			return out
		}
		if n, subacks := statuses("100 SUBSCRIBEs", subscribes(100, false)...); n != 1 || subacks != 100 {
			t.Fatalf("MQTT level %d, 100 SUBSCRIBEs: %d statuses (%d SUBACKs), want 1", level, n, subacks)
		}
		f.clock.Advance(2 * statusEvery)
		if n, _ := statuses("SUBSCRIBEs a while on, no publish", subscribes(20, true)...); n != 0 {
			t.Fatalf("MQTT level %d: %d statuses without a publish since the last, want 0", level, n)
		}
		// The held status goes with the next publish.
		pub := rawPublish("devices/"+id, []byte("1"))
		if level == 5 {
			pub = packet(0x30, append(append(mqttString("devices/"+id), 0), '1'))
		}
		if n, _ := statuses("a publish", pub); n != 1 {
			t.Fatalf("MQTT level %d: %d statuses with the publish after the held one, want 1", level, n)
		}
		if n, _ := statuses("SUBSCRIBEs within the second", subscribes(50, false)...); n != 0 {
			t.Fatalf("MQTT level %d: %d statuses within a second of the last, want 0", level, n)
		}
	}
}

// TestStatusWatcherAllocatesNothing: with the device watching its status
// (feedback always, so every publish reads its windows against the
// threshold), a publish and the encode of its PUBACK allocate nothing
// once the buffers have grown and the status at the crossing went: the
// watch is the connection's own, and the status is computed only when
// one is due. (Before, every publish of a watching device looked itself
// up in a map under a lock and computed its whole status: 8
// allocations a publish.)
func TestStatusWatcherAllocatesNothing(t *testing.T) {
	s, cl, pk := newHookClient(t, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second, Feedback: fbAlways})
	sh := newStatusHook(s.hook)
	sub := mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Subscribe}, PacketID: 9,
		Filters: mochipk.Subscriptions{{Filter: StatusPrefix + cl.ID}}}
	sh.OnSubscribed(cl, sub, []byte{0})
	sh.OnPacketSent(cl, mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Suback}, PacketID: 9}, nil)
	w := s.hook.conns.info(cl).status.Load()
	if w == nil || !w.on.Load() || !w.sent {
		t.Fatalf("no watch, or no status at the SUBACK: %+v", w)
	}
	ack := mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Puback}, PacketID: pk.PacketID, ReasonCode: mochipk.CodeGrantedQos1.Code}
	step := func() {
		if _, err := s.hook.OnPublish(cl, pk); err != nil {
			t.Fatal(err)
		}
		if out := s.hook.OnPacketEncode(cl, ack); len(out.Properties.User) == 0 {
			t.Fatalf("PUBACK %+v", out)
		}
	}
	step()
	if !w.below || !w.published {
		t.Fatalf("watch after a publish under feedback always: below %v, published %v", w.below, w.published)
	}
	if n := testing.AllocsPerRun(1000, step); n != 0 {
		t.Fatalf("%v allocations per publish with a status watcher, want 0", n)
	}
}

// BenchmarkOnPublishStatusWatcher: an admitted QoS 1 publish and the
// encode of its PUBACK of a device that watches its status (feedback
// always, so each publish reads its windows against the threshold).
func BenchmarkOnPublishStatusWatcher(b *testing.B) {
	s, cl, pk := newHookClient(b, devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: time.Second, Feedback: fbAlways})
	sh := newStatusHook(s.hook)
	sh.OnSubscribed(cl, mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Subscribe}, PacketID: 9,
		Filters: mochipk.Subscriptions{{Filter: StatusPrefix + cl.ID}}}, []byte{0})
	sh.OnPacketSent(cl, mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Suback}, PacketID: 9}, nil)
	ack := mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Puback}, PacketID: pk.PacketID, ReasonCode: mochipk.CodeGrantedQos1.Code}
	b.ReportAllocs()
	for range b.N {
		if _, err := s.hook.OnPublish(cl, pk); err != nil {
			b.Fatal(err)
		}
		s.hook.OnPacketEncode(cl, ack)
	}
}

// TestStatusSubackForgottenWithItsClient: a client that leaves between
// its SUBSCRIBE to its status topic and the SUBACK takes its awaited
// SUBACK with it, so the status hook stops asking for OnPacketSent
// (mochi's copy of every packet written). Before, the count stayed at 1
// for good.
func TestStatusSubackForgottenWithItsClient(t *testing.T) {
	s, cl, _ := newHookClient(t, devicelimit.Quota{Limit: 10, Window: time.Second})
	sh := newStatusHook(s.hook)
	sub := mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Subscribe}, PacketID: 7,
		Filters: mochipk.Subscriptions{{Filter: StatusPrefix + cl.ID}}}
	sh.OnSubscribed(cl, sub, []byte{0})
	if !sh.Provides(mqtt.OnPacketSent) {
		t.Fatal("a SUBACK awaited, and OnPacketSent not provided")
	}
	s.hook.OnDisconnect(cl, nil, false)
	if n := s.hook.statusSubacks.Load(); n != 0 || sh.Provides(mqtt.OnPacketSent) {
		t.Fatalf("after the client left: %d SUBACKs awaited, OnPacketSent provided %v; want 0, false", n, sh.Provides(mqtt.OnPacketSent))
	}
	// Its SUBACK reported after all (mochi's order) counts nothing.
	sh.OnPacketSent(cl, mochipk.Packet{FixedHeader: mochipk.FixedHeader{Type: mochipk.Suback}, PacketID: 7}, nil)
	if n := s.hook.statusSubacks.Load(); n != 0 {
		t.Fatalf("%d SUBACKs awaited after a late SUBACK of a gone client, want 0", n)
	}
}
