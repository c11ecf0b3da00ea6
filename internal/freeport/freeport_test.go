package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestAddrBelowEphemeral: every pick is a loopback port below the
// ephemeral range, bindable, and never handed out twice.
func TestAddrBelowEphemeral(t *testing.T) {
	high := ephemeralLow()
	seen := map[string]bool{}
	for range 200 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		if host != "127.0.0.1" || p < lowest || p >= high {
			t.Fatalf("got %s, want 127.0.0.1 and a port in [%d, %d)", addr, lowest, high)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("bind %s: %v", addr, err)
		}
		l.Close()
	}
}
