package broker

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
)

// rawPersistentConnect is an MQTT 3.1.1 CONNECT without clean session:
// the broker keeps the session after the connection ends (3.1.1 has no
// session expiry).
func rawPersistentConnect(id string) []byte {
	body := append(mqttString("MQTT"), 4, 0x00, 0, 60) // level 4, clean session off, keepalive 60s
	return packet(0x10, append(body, mqttString(id)...))
}

// TestMaxConnectionsBoundsHeldSessions: a client that asks for a
// persistent session and leaves keeps a session in the broker (mochi
// holds it for MaximumSessionExpiryInterval: by default 136 years), with
// its outbound queue. Limits.MaxConnections bounds the connected clients
// only, so connecting with ever new client IDs and leaving grew the heap
// without bound. It must bound the sessions held, connected or not; a
// held session's own client ID still gets back in.
func TestMaxConnectionsBoundsHeldSessions(t *testing.T) {
	const maxConns, tries = 20, 200
	f := start(t, fixtureOpts{options: func(o *Options) { o.Limits = Limits{MaxConnections: maxConns} }})
	// connack connects id, returns the CONNACK's return code and leaves
	// with DISCONNECT.
	connack := func(id string) byte {
		t.Helper()
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(rawPersistentConnect(id)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("%s: read CONNACK: %v", id, err)
		}
		_, _ = c.Write(rawDisconnect)
		_, _ = io.ReadAll(c) // until the broker closes: the session is then stored
		return b[3]
	}
	own := f.srv.mqtt.Clients.Len() // mochi's inline client
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	refused := 0
	for i := range tries {
		if code := connack(fmt.Sprintf("ghost-%d", i)); code != 0 {
			if code != 3 {
				t.Fatalf("ghost-%d: CONNACK return code %d, want 0 or 3 (server unavailable)", i, code)
			}
			refused++
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := f.srv.mqtt.Clients.Len() - own
	t.Logf("%d persistent sessions tried, %d held, %d refused; heap %+d KiB", tries, held, refused,
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))>>10)
	if held > maxConns {
		t.Fatalf("broker holds %d sessions, more than MaxConnections %d", held, maxConns)
	}
	if code := connack("ghost-0"); code != 0 {
		t.Errorf("a held session's client ID coming back: return code %d, want 0", code)
	}
}
