package broker

import (
	"bufio"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// publishTopic returns the topic of a PUBLISH packet.
func publishTopic(p rawPacket) string {
	n := int(p.body[0])<<8 | int(p.body[1])
	return string(p.body[2 : 2+n])
}

// TestSharedWildcardSkipsDollarTopics: a shared subscription whose
// filter starts with a wildcard ("$share/g/#", "$share/g/+/x") receives
// no message whose topic begins with '$' — neither the broker's $SYS
// messages nor a device's "$dev/x" — over MQTT 5 and 3.1.1 (MQTT
// 4.7.2-1; mochi v2.7.9 delivered them). "$share/g/$dev/#" still
// receives "$dev/x", and "$share/g/#" every other topic.
func TestSharedWildcardSkipsDollarTopics(t *testing.T) {
	f := start(t, fixtureOpts{})
	for _, level := range []byte{4, 5} {
		conn := dialTCP(t, f.addr)
		_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
		r := bufio.NewReader(conn)
		id := string([]byte{'s', '0' + level})
		if _, err := conn.Write(rawConnectV(level, id, props(), nil)); err != nil {
			t.Fatal(err)
		}
		if p := readPacket(t, r); p.typ>>4 != 2 || reasonOf(p) != 0 {
			t.Fatalf("level %d: CONNACK % x", level, p.body)
		}
		// Groups of their own: a group delivers to one of its members.
		g := string([]byte{'g', '0' + level})
		for i, filter := range []string{"$share/" + g + "/#", "$share/" + g + "/+/x", "$share/h" + g + "/$dev/#"} {
			if _, err := conn.Write(rawSubscribe(level, i+1, filter)); err != nil {
				t.Fatal(err)
			}
			if p := readPacket(t, r); p.typ>>4 != 9 || reasonOf(p) != 1 {
				t.Fatalf("level %d: SUBACK of %s: % x", level, filter, p.body)
			}
		}
		// Published inline, in order: the marker comes after the rest.
		for _, topic := range []string{"$SYS/broker/test", "$SYS/x", "$dev/x", "dev/x", "marker"} {
			if err := f.srv.mqtt.Publish(topic, []byte("v"), false, 0); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for len(got) == 0 || got[len(got)-1] != "marker" {
			p := readPacket(t, r)
			if p.typ>>4 != packets.Publish {
				t.Fatalf("level %d: packet type %d", level, p.typ>>4)
			}
			got = append(got, publishTopic(p))
		}
		if want := []string{"$dev/x", "dev/x", "marker"}; !equal(got, want) {
			t.Fatalf("level %d: received %q; want %q", level, got, want)
		}
		_ = conn.Close()
	}
}
