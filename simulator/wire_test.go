package simulator

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/packets"
)

// TestCountedConnKeepsPacketsWhole: paho.golang writes a packet as
// several buffers and, on a conn that is not a *net.TCPConn, in one
// Write each unless the conn is a sync.Locker; two goroutines writing
// packets through a countedConn must never interleave them (a device's
// publish and its acknowledgements did, and the gateway closed the
// connection for a malformed packet).
func TestCountedConnKeepsPacketsWhole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	var w wireCount
	conn := w.wrap(raw)
	const writers, each = 4, 2000
	var wg sync.WaitGroup
	var writeErr error
	var once sync.Once
	t.Cleanup(func() { raw.Close(); wg.Wait() })
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				pb := packets.NewControlPacket(packets.PUBLISH)
				p := pb.Content.(*packets.Publish)
				p.Topic, p.QoS, p.PacketID = "devices/d/t", 1, uint16(g*each+i+1)
				p.Payload = bytes.Repeat([]byte{byte('a' + g)}, 64)
				if _, err := pb.WriteTo(conn); err != nil {
					once.Do(func() { writeErr = err })
					return
				}
			}
		})
	}
	for n := range writers * each {
		cp, err := packets.ReadPacket(server)
		if err != nil {
			t.Fatalf("packet %d: %v", n, err)
		}
		p, ok := cp.Content.(*packets.Publish)
		if !ok || p.Topic != "devices/d/t" || len(p.Payload) != 64 || bytes.Count(p.Payload, p.Payload[:1]) != 64 {
			t.Fatalf("packet %d mangled: %+v", n, cp.Content)
		}
	}
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if got := w.out.Load(); got <= 0 {
		t.Fatalf("counted %d bytes out", got)
	}
}
