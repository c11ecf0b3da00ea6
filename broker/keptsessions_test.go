package broker

import (
	"context"
	"sync"
	"testing"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// keptCommands counts the kept sessions and the commands queued in them
// that store holds.
func keptCommands(t *testing.T, store SessionStore) (sessions, commands int) {
	t.Helper()
	if err := store.LoadSessions(func(string, []byte) error { sessions++; return nil },
		func(string, uint16, []byte) error { commands++; return nil }); err != nil {
		t.Fatal(err)
	}
	return sessions, commands
}

// startKept starts a broker with password authentication over store, at
// addr ("127.0.0.1:0" for any port).
func startKept(t *testing.T, store SessionStore, addr string) *Server {
	t.Helper()
	return start(t, fixtureOpts{options: func(o *Options) {
		o.TCPAddr, o.Sessions, o.Auth = addr, store, Auth{Credentials: credentials(t), ACL: defaultACL(t)}
	}}).srv
}

func closeKept(t *testing.T, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestKeptSessionCommands: a device that keeps its session (MQTT 3.1.1,
// clean session off) and is away gets the commands published for it
// while it was away, after the broker restarted in between: its session
// (subscription, authorization, queued commands) is in the data file.
// A command is held there from Publish until the device acknowledges
// it, and no longer. (Before, the session lived in mochi's memory only:
// after a restart the device found none, and the commands were gone.)
func TestKeptSessionCommands(t *testing.T) {
	store := openStore(t, t.TempDir())
	srv := startKept(t, store, "127.0.0.1:0")
	addr := srv.Addr().String()

	var mu sync.Mutex
	var got []string
	received := make(chan string, 10)
	dev := func() mqtt3.Client {
		c := mqtt3.NewClient(mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("dev-1").
			SetUsername("dev-1").SetPassword("dev-1-pw").SetCleanSession(false).SetAutoReconnect(false).
			SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) {
				mu.Lock()
				got = append(got, string(m.Payload()))
				mu.Unlock()
				received <- string(m.Payload())
			}))
		if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		return c
	}
	c := dev()
	if tok := c.Subscribe("devices/dev-1/cmd/#", 1, nil); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	// Connected: held until acknowledged, then removed.
	if err := srv.Publish("devices/dev-1/cmd/a", []byte("c0"), false, 1); err != nil {
		t.Fatal(err)
	}
	receive(t, "c0", received)
	eventually(t, "c0 acknowledged and removed", func() bool { _, n := keptCommands(t, store); return n == 0 })
	c.Disconnect(100)

	// Away: queued, in the data file.
	for _, p := range []string{"c1", "c2", "c3"} {
		if err := srv.Publish("devices/dev-1/cmd/a", []byte(p), false, 1); err != nil {
			t.Fatal(err)
		}
	}
	if s, n := keptCommands(t, store); s != 1 || n != 3 {
		t.Fatalf("stored: %d sessions, %d commands; want 1, 3", s, n)
	}
	closeKept(t, srv)

	srv = startKept(t, store, addr)
	// One more while the device is still away, after the restart: the
	// restored session is authorized as the device was.
	if err := srv.Publish("devices/dev-1/cmd/a", []byte("c4"), false, 1); err != nil {
		t.Fatal(err)
	}
	c = dev()
	defer c.Disconnect(0)
	for range 4 {
		receive(t, "a queued command", received)
	}
	eventually(t, "the commands acknowledged and removed", func() bool { _, n := keptCommands(t, store); return n == 0 })
	mu.Lock()
	seen := map[string]bool{}
	for _, p := range got {
		seen[p] = true
	}
	mu.Unlock()
	for _, p := range []string{"c0", "c1", "c2", "c3", "c4"} {
		if !seen[p] {
			t.Fatalf("%s not received: %v", p, got)
		}
	}

	// A clean start ends the kept session, in the data file too.
	c.Disconnect(100)
	if _, err := (&fixture{addr: addr}).dial3(t, "dev-1", "dev-1", "dev-1-pw"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the kept session removed", func() bool { s, _ := keptCommands(t, store); return s == 0 })
}

// TestKeptSessionHookAllocatesNothing: the session hook's calls on
// every QoS 1 and 2 flow (a device's publish, a delivery that is no
// command) allocate nothing, with commands queued for other clients.
func TestKeptSessionHookAllocatesNothing(t *testing.T) {
	h := newSessionHook(nil, nil, nil, discardLogger)
	h.cmds[commandKey{"other", 7}] = &cmdEntry{queued: true}
	h.nq.Store(1)
	cl := &mqtt.Client{ID: "dev-1"}
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback, Remaining: 2}, PacketID: 7} // the client's
	pub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 7, Origin: "dev-2"}
	if n := testing.AllocsPerRun(1000, func() {
		h.OnQosPublish(cl, pub, 0, 0)
		h.OnQosComplete(cl, ack)
	}); n != 0 {
		t.Fatalf("%v allocations per flow, want 0", n)
	}
}
