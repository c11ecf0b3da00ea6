package broker

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// gatedStore is a real store whose command writes wait at a gate the
// test opens: entered says one is waiting.
type gatedStore struct {
	SessionStore
	gate    chan struct{}
	entered chan string
	puts    atomic.Int64
}

func newGatedStore(t *testing.T) *gatedStore {
	return &gatedStore{SessionStore: openStore(t, t.TempDir()), gate: make(chan struct{}), entered: make(chan string, 4)}
}

func (g *gatedStore) PutCommand(id string, pid uint16, rec []byte) error {
	g.puts.Add(1)
	g.entered <- "put"
	<-g.gate
	return g.SessionStore.PutCommand(id, pid, rec)
}

func (g *gatedStore) DeleteCommand(id string, pid uint16) error {
	g.entered <- "delete"
	<-g.gate
	return g.SessionStore.DeleteCommand(id, pid)
}

// within fails the test unless fn returns within waitTimeout.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatalf("%s: still waiting after %s (on the data file's write?)", what, waitTimeout)
	}
}

// commandPacket is a command as mochi hands it to OnQosPublish.
func commandPacket(id uint16) packets.Packet {
	return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: id, Origin: commandOrigin,
		TopicName: "devices/dev-1/cmd/a", Payload: []byte("c")}
}

// receivedAck is a device's PUBACK of id, as mochi decoded it.
func receivedAck(id uint16) packets.Packet {
	return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback, Remaining: 2}, PacketID: id}
}

// TestKeptSessionWritesOutsideLock: while a command's write to the data
// file is under way, the hook's maps are free: another client's QoS
// flow and an away session's ACL check do not wait for it; the same
// command sent again (a reconnect) is not written twice; and a put and
// a delete of one key leave the data file as the last change left the
// key, whichever write runs first. (Before, the write ran under the
// maps' lock: the QoS flow and the ACL check waited for it.)
func TestKeptSessionWritesOutsideLock(t *testing.T) {
	g := newGatedStore(t)
	h := newSessionHook(nil, g, nil, discardLogger)
	h.kept["dev-1"] = &keptEntry{auth: &session{device: "dev-1"}}
	dev := &mqtt.Client{ID: "dev-1"}
	other := &mqtt.Client{ID: "dev-2"}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h.OnQosPublish(dev, commandPacket(5), 0, 0) }()
	if op := <-g.entered; op != "put" {
		t.Fatalf("first write %s, want put", op)
	}
	within(t, "another client's QoS flow during the write", func() { h.OnQosComplete(other, receivedAck(9)) })
	within(t, "an away session's ACL check during the write", func() {
		if s := h.authOf("dev-1"); s == nil || s.device != "dev-1" {
			t.Errorf("authOf: %+v", s)
		}
	})
	within(t, "the command sent again during its write", func() { h.OnQosPublish(dev, commandPacket(5), 0, 0) })
	if n := g.puts.Load(); n != 1 {
		t.Fatalf("%d puts of one command, want 1", n)
	}
	// The device acknowledges it while its put still waits: the delete
	// comes after, and wins.
	wg.Add(1)
	go func() { defer wg.Done(); h.OnQosComplete(dev, receivedAck(5)) }()
	eventually(t, "the acknowledgement marked", func() bool { return h.nq.Load() == 0 })
	close(g.gate)
	wg.Wait()
	if _, n := keptCommands(t, g.SessionStore); n != 0 {
		t.Fatalf("%d commands in the data file after the acknowledgement, want 0", n)
	}
	h.mu.RLock()
	left := len(h.cmds)
	h.mu.RUnlock()
	if left != 0 {
		t.Fatalf("%d command entries left, want 0", left)
	}

	// A new command under the same packet ID while the old one's delete
	// waits: the data file ends holding the new one.
	g2 := newGatedStore(t)
	h2 := newSessionHook(nil, g2, nil, discardLogger)
	h2.kept["dev-1"] = &keptEntry{}
	close(g2.gate)
	h2.OnQosPublish(dev, commandPacket(7), 0, 0)
	<-g2.entered
	g2.gate = make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); h2.OnQosComplete(dev, receivedAck(7)) }()
	if op := <-g2.entered; op != "delete" {
		t.Fatalf("write %s, want the delete", op)
	}
	go func() { defer wg.Done(); h2.OnQosPublish(dev, commandPacket(7), 0, 0) }()
	eventually(t, "the new command marked queued", func() bool { return h2.nq.Load() == 1 })
	close(g2.gate)
	wg.Wait()
	for len(g2.entered) > 0 {
		<-g2.entered
	}
	if _, n := keptCommands(t, g2.SessionStore); n != 1 {
		t.Fatalf("%d commands in the data file, want the new one", n)
	}
}
