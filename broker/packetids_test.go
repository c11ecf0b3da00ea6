package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// rawConnectKept is an MQTT 3.1.1 CONNECT that keeps its session (clean
// session off), with a user name and password.
func rawConnectKept(id, user, password string) []byte {
	body := append(append(mqttString("MQTT"), 4, flagUsername|flagPassword, 0, 60), mqttString(id)...)
	return packet(0x10, append(append(body, mqttString(user)...), mqttString(password)...))
}

func rawPuback(id uint16) []byte { return packet(0x40, u16(int(id))) }
func rawPubrel(id uint16) []byte { return packet(0x62, u16(int(id))) }
func ackID(p rawPacket) uint16   { return uint16(p.body[0])<<8 | uint16(p.body[1]) }
func subscribeKept(r *rawClient) {
	r.send(rawSubscribe(4, 1, "devices/dev-1/cmd/#"))
	r.must(9, "SUBACK")
}

// TestCommandSurvivesPacketIDCollision: a device that keeps its session
// gets a command (QoS 1) and, before it acknowledges it, publishes at
// QoS 1 and then at QoS 2 under the command's packet ID, as MQTT lets it
// (each direction has its own IDs). Its publishes are acknowledged
// under its own ID (PUBACK; PUBREC, PUBREL, PUBCOMP), the command stays
// in flight and in the data file, and when the device reconnects the
// command is sent again under its ID; acknowledged, it leaves the data
// file. Raw MQTT 3.1.1 packets, the IDs chosen by the test. (Before, the
// device's publish deleted the command from mochi's in-flight list and
// the data file: never sent again.)
func TestCommandSurvivesPacketIDCollision(t *testing.T) {
	store := openStore(t, t.TempDir())
	srv := startKept(t, store, "127.0.0.1:0")
	addr := srv.Addr().String()

	r := dialRaw(t, addr)
	r.send(rawConnectKept("dev-1", "dev-1", "dev-1-pw"))
	r.connack()
	subscribeKept(r)
	if err := srv.Publish("devices/dev-1/cmd/a", []byte("reboot"), false, 1); err != nil {
		t.Fatal(err)
	}
	cmd := r.must(3, "the command")
	x, topic := publishID(cmd)
	if topic != "devices/dev-1/cmd/a" || cmd.typ&0x06 != 0x02 {
		t.Fatalf("command %x on %q", cmd.typ, topic)
	}
	if _, n := keptCommands(t, store); n != 1 {
		t.Fatalf("%d commands in the data file, want 1", n)
	}

	// QoS 1 under the command's ID: PUBACK under it.
	r.send(rawPublishQ("devices/dev-1/t", 1, int(x), "q1"))
	if p := r.must(4, "PUBACK of the device's QoS 1 publish"); ackID(p) != x {
		t.Fatalf("PUBACK under %d, want %d", ackID(p), x)
	}
	// QoS 2 under it: PUBREC, PUBREL, PUBCOMP, all under it.
	r.send(rawPublishQ("devices/dev-1/t", 2, int(x), "q2"))
	if p := r.must(5, "PUBREC"); ackID(p) != x {
		t.Fatalf("PUBREC under %d, want %d", ackID(p), x)
	}
	r.send(rawPubrel(x))
	if p := r.must(7, "PUBCOMP"); ackID(p) != x {
		t.Fatalf("PUBCOMP under %d, want %d", ackID(p), x)
	}
	// And QoS 1 under it again, once more through the remap.
	r.send(rawPublishQ("devices/dev-1/t", 1, int(x), "q1 again"))
	if p := r.must(4, "PUBACK of the third publish"); ackID(p) != x {
		t.Fatalf("PUBACK under %d, want %d", ackID(p), x)
	}
	if _, n := keptCommands(t, store); n != 1 {
		t.Fatalf("%d commands in the data file after the device's publishes under its ID, want 1", n)
	}

	// Away and back: the command comes again, under its ID, as a DUP.
	r.send(rawDisconnect)
	r.closedSilently("the device's DISCONNECT")
	r = dialRaw(t, addr)
	r.send(rawConnectKept("dev-1", "dev-1", "dev-1-pw"))
	if p := r.must(2, "CONNACK"); p.body[0] != 1 || p.body[1] != 0 {
		t.Fatalf("CONNACK % x: want the session present", p.body)
	}
	again := r.must(3, "the command sent again")
	if id, _ := publishID(again); id != x || again.typ&0x08 == 0 || string(again.body[len(again.body)-len("reboot"):]) != "reboot" {
		t.Fatalf("sent again: % x, want the command under %d with DUP", again.body, x)
	}
	r.send(rawPuback(x), rawPingreq)
	r.until(13, "PINGRESP")
	eventually(t, "the acknowledged command leaves the data file", func() bool { _, n := keptCommands(t, store); return n == 0 })
}

// TestCommandCollisionFeedback: an MQTT 5 device that keeps its session
// publishes at QoS 1 under the packet ID of a command in flight to it,
// with feedback always: its PUBACK comes under its own ID and carries
// RateLimit (the feedback waits under the ID the publish was moved to),
// and the command is still in flight: the device's PUBACK of it takes
// it out of the data file.
func TestCommandCollisionFeedback(t *testing.T) {
	store := openStore(t, t.TempDir())
	f := start(t, fixtureOpts{def: devicelimit.Quota{Limit: 100000, Window: time.Second, Feedback: fbAlways}, options: func(o *Options) {
		o.Sessions, o.Auth = store, Auth{Credentials: credentials(t), ACL: defaultACL(t)}
	}})
	r := dialRaw(t, f.addr)
	// CONNECT, MQTT 5, user name and password, session expiry 300 s.
	body := append(append(mqttString("MQTT"), 5, flagUsername|flagPassword, 0, 60), props(prop(0x11, u32(300)...))...)
	body = append(append(append(body, mqttString("dev-1")...), mqttString("dev-1")...), mqttString("dev-1-pw")...)
	r.send(packet(0x10, body))
	r.connack()
	r.send(rawSubscribe(5, 1, "devices/dev-1/cmd/#"))
	r.must(9, "SUBACK")
	if err := f.srv.Publish("devices/dev-1/cmd/a", []byte("reboot"), false, 1); err != nil {
		t.Fatal(err)
	}
	x, _ := publishID(r.must(3, "the command"))
	r.send(rawPublish5("devices/dev-1/t", int(x), []byte{0}))
	p := r.must(4, "PUBACK of the device's publish")
	if ackID(p) != x || !strings.Contains(string(p.body), devicelimit.RateLimitProperty) {
		t.Fatalf("PUBACK % x: want it under %d with RateLimit", p.body, x)
	}
	if _, n := keptCommands(t, store); n != 1 {
		t.Fatalf("%d commands in the data file, want the command", n)
	}
	r.send(packet(0x40, u16(int(x))), rawPingreq) // MQTT 5 PUBACK, success, no properties
	r.until(13, "PINGRESP")
	eventually(t, "the acknowledged command leaves the data file", func() bool { _, n := keptCommands(t, store); return n == 0 })
}
