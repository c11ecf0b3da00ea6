package broker

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestTopicAliasMaximum: the MQTT 5 CONNACK announces the topic alias
// maximum (Limits.TopicAliasMaximum, 10 by default; none when
// negative), an alias up to it is used, and one above it ends the
// connection with DISCONNECT 0x94 topic alias invalid, counted as a
// protocol error (MQTT 5, 3.2.2.3.8, 3.3.2.3.4). mochi v2.7.9 announced
// nothing and accepted every alias up to 65535.
func TestTopicAliasMaximum(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int  // Limits.TopicAliasMaximum
		max   byte // announced: 0 for none
	}{
		{"default", 0, 10},
		{"none", -1, 0},
		{"three", 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Feedback off: a RateLimit-Policy's quotes are 0x22 bytes too.
			quiet := generous
			quiet.Feedback.Mode = devicelimit.FeedbackOff
			f := start(t, fixtureOpts{def: quiet, options: func(o *Options) { o.Limits.TopicAliasMaximum = tc.limit }})
			conn := dialTCP(t, f.addr)
			defer conn.Close()
			r := bufio.NewReader(conn)
			if _, err := conn.Write(rawConnectV(5, "alias-"+tc.name, props(), nil)); err != nil {
				t.Fatal(err)
			}
			ack := readPacket(t, r)
			if ack.typ>>4 != 2 || reasonOf(ack) != 0 {
				t.Fatalf("CONNACK % x", ack.body)
			}
			announced := bytes.Contains(ack.body[2:], []byte{0x22, 0, tc.max})
			if tc.max == 0 {
				announced = !bytes.Contains(ack.body[2:], []byte{0x22})
			}
			if !announced {
				t.Fatalf("CONNACK properties % x; want topic alias maximum %d", ack.body[2:], tc.max)
			}
			if tc.max > 0 {
				if _, err := conn.Write(rawPublish5("dev/a", 1, props(prop(propTopicAlias, u16(int(tc.max))...)))); err != nil {
					t.Fatal(err)
				}
				if p := readPacket(t, r); p.typ>>4 != 4 || reasonOf(p) != 0 {
					t.Fatalf("publish with alias %d: % x % x; want PUBACK 0x00", tc.max, p.typ, p.body)
				}
			}
			before := f.srv.AuthStats().ProtocolErrors
			pks, closed := exchange(t, conn, rawPublish5("dev/a", 2, props(prop(propTopicAlias, u16(int(tc.max)+1)...))))
			if got, want := kinds(pks), []byte{14, 0x94}; !closed || !bytes.Equal(got, want) {
				t.Fatalf("publish with alias %d: sent % x, closed %v; want DISCONNECT 0x94 and the end", tc.max+1, got, closed)
			}
			if got := f.srv.AuthStats().ProtocolErrors; got != before+1 {
				t.Fatalf("protocol errors %d; want %d", got, before+1)
			}
		})
	}
}
