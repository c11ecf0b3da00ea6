package broker

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/logtest"
)

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer = logtest.Buffer

// rawSession connects with a raw MQTT 3.1.1 CONNECT of keepalive ka and
// reads the CONNACK.
func rawSession(t *testing.T, addr, id string, ka byte) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	body := append(mqttString("MQTT"), 4, 0x02, 0, ka)
	if _, err := c.Write(packet(0x10, append(body, mqttString(id)...))); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil || ack[0] != 0x20 || ack[3] != 0 {
		t.Fatalf("connack % x, %v", ack, err)
	}
	return c
}

// TestMochiLogLines: what mochi logs for clients is one short line per
// event, without packet contents, and at most one line per kind of event
// per interval however many clients trigger it. Before, a keepalive-0
// client made mochi warn with client="" at every connect (the gateway
// raises keepalive 0 to its bound anyway), and "error processing packet"
// dumped the whole packet, payload and password included, once per
// client.
func TestMochiLogLines(t *testing.T) {
	var buf lockedBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := start(t, fixtureOpts{logger: logger})

	const secret = "hunter2-do-not-log-me"
	for i := range 20 {
		c := rawSession(t, f.addr, "ka0-"+string(rune('a'+i)), 0)
		// A second CONNECT is a protocol error: mochi ends the
		// connection and logs the packet it could not process.
		body := append(mqttString("MQTT"), 4, 0xC2, 0, 60)
		body = append(body, mqttString("again")...)
		body = append(body, mqttString("user")...)
		body = append(body, mqttString(secret)...)
		_, _ = c.Write(packet(0x10, body))
		_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
		_, _ = io.ReadAll(c)
		c.Close()
	}
	eventually(t, "the error line", func() bool { return strings.Contains(strings.Join(buf.Lines(), "\n"), "error processing packet") })

	var processing int
	for _, l := range buf.Lines() {
		if strings.Contains(l, "client=\"\"") || strings.Contains(l, "client= ") {
			t.Errorf("a line without the client: %s", l)
		}
		if strings.Contains(l, "keepalive is below minimum") {
			t.Errorf("a keepalive warning for a client the gateway gives its bound: %s", l)
		}
		if strings.Contains(l, secret) || strings.Contains(l, "FixedHeader") {
			t.Errorf("a line with a packet's contents: %s", l)
		}
		if len(l) > 400 {
			t.Errorf("a line of %d bytes: %s", len(l), l)
		}
		if strings.Contains(l, "error processing packet") {
			processing++
			for _, want := range []string{"level=WARN", "client=ka0-a", "packet=connect", "listener=tcp"} {
				if !strings.Contains(l, want) {
					t.Errorf("error line lacks %s: %s", want, l)
				}
			}
		}
	}
	if processing != 1 {
		t.Errorf("%d error lines for 20 clients making the same error within one interval, want 1", processing)
	}
	if t.Failed() {
		t.Logf("log:\n%s", strings.Join(buf.Lines(), "\n"))
	}
}
