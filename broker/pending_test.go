package broker

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// dialFrom opens a TCP connection to addr from the loopback address
// local (127.x.y.z).
func dialFrom(local, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: waitTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return d.Dial("tcp", addr)
}

// connectWithin connects a device from 127.0.0.1 (MQTT 3.1.1 CONNECT,
// CONNACK 0) and returns how long it took, or an error.
func connectWithin(addr, id string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	c, err := dialFrom("127.0.0.1", addr)
	if err != nil {
		return 0, err
	}

	defer c.Close()
	_ = c.SetDeadline(start.Add(limit))
	if _, err := c.Write(rawConnect(id)); err != nil {
		return 0, err
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil {
		return time.Since(start), err
	}
	if ack[0] != 0x20 || ack[3] != 0 {
		return time.Since(start), fmt.Errorf("CONNACK % x", ack)
	}
	_, _ = c.Write(rawDisconnect)
	return time.Since(start), nil
}

// silentFlood opens perHost connections that never send CONNECT from
// each of hosts and returns them; tick, when set, is called after every
// 250 connections of all.
func silentFlood(t *testing.T, addr string, hosts []string, perHost int, tick func()) []net.Conn {
	t.Helper()
	var mu sync.Mutex
	var all []net.Conn
	var wg sync.WaitGroup
	for _, h := range hosts {
		wg.Go(func() {
			for range perHost {
				c, err := dialFrom(h, addr)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, c)
				n := len(all)
				mu.Unlock()
				if tick != nil && n%250 == 0 {
					tick()
				}
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range all {
			c.Close()
		}
	})
	return all
}

// TestSilentConnectionFlood: 5,000 connections that never send CONNECT,
// 1,000 from each of 127.0.0.2 to 127.0.0.6, against the default limits
// (loopback exempt from the connect rate, 1,000 pending connections, 100
// per address). A device from 127.0.0.1 connects (CONNACK 0, not
// closed) in 20 of 20 tries, during the flood and after it; each address holds at most 100
// silent connections, its older ones closed and counted
// (pending_address); the heap stays bounded. Before, the first 1,000
// silent connections filled the table until their 10 s deadline and
// every new device was refused.
func TestSilentConnectionFlood(t *testing.T) {
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Limits.ConnectRate = devicelimit.Quota{Limit: 100, Window: time.Second}
		o.Limits.ConnectRateExempt = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	}})
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"}
	const perHost = 1000

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	// A device tries to connect after every 250 silent connections.
	ticks := make(chan struct{}, 20)
	tries := make(chan time.Duration, 20)
	go func() {
		for i := range 20 {
			<-ticks
			// Refused, a device is closed at once; how long its CONNACK
			// takes is the machine's load, logged, not judged (waitTimeout
			// bounds a broker that never answers).
			took, err := connectWithin(f.addr, fmt.Sprintf("device-%d", i), waitTimeout)
			if err != nil {
				t.Errorf("device try %d: %v after %v", i, err, took)
			}
			tries <- took
		}
	}()
	silentFlood(t, f.addr, hosts, perHost, func() { ticks <- struct{}{} })
	var slowest time.Duration
	for range 20 {
		slowest = max(slowest, <-tries)
	}
	t.Logf("20 devices connected during the flood, the slowest in %v", slowest)

	want := uint64(len(hosts) * (perHost - DefaultMaxPendingPerAddress))
	eventually(t, "the closes to be counted", func() bool {
		return f.srv.AuthStats().ConnectsRefused["pending_address"] == want
	})
	if n := f.srv.auth.pending.len(); n != len(hosts)*DefaultMaxPendingPerAddress {
		t.Fatalf("%d pending, want %d", n, len(hosts)*DefaultMaxPendingPerAddress)
	}
	if full := f.srv.AuthStats().ConnectsRefused["pending_full"]; full != 0 {
		t.Fatalf("pending_full %d, want 0 (the table never filled)", full)
	}
	if d, err := connectWithin(f.addr, "after", waitTimeout); err != nil {
		t.Fatalf("device after the flood: %v (%v)", err, d)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	t.Logf("heap+stacks grew %d KiB for %d silent sockets, %d held", grew>>10, len(hosts)*perHost, f.srv.auth.pending.len())
	if grew > 64<<20 {
		t.Fatalf("heap and stacks grew %d MiB for %d silent sockets", grew>>20, len(hosts)*perHost)
	}
}

// TestPendingTableFull: when the table of silent connections is full,
// a newcomer takes the place of the oldest silent connection of all
// (closed, counted pending_full); a device still gets in, and a
// connection that sent CONNECT no longer counts.
func TestPendingTableFull(t *testing.T) {
	const max, perAddress = 50, 20
	f := start(t, fixtureOpts{options: func(o *Options) {
		o.Limits.MaxPendingConnections, o.Limits.MaxPendingPerAddress = max, perAddress
	}})
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"}
	first := silentFlood(t, f.addr, hosts[:1], perAddress, nil) // the oldest
	silentFlood(t, f.addr, hosts[1:], perAddress, nil)
	// 100 silent connections for 50 places, none over its address's
	// bound: the 50 oldest are closed, 127.0.0.2's first.
	eventually(t, "the closes to be counted", func() bool {
		return f.srv.AuthStats().ConnectsRefused["pending_full"] == uint64(len(hosts)*perAddress-max)
	})
	_ = first[0].SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := first[0].Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the oldest silent connection: read %v; want it closed", err)
	}
	if n := f.srv.auth.pending.len(); n != max {
		t.Fatalf("%d pending, want %d", n, max)
	}
	if _, err := connectWithin(f.addr, "device", waitTimeout); err != nil {
		t.Fatal(err)
	}
	// The device took the oldest's place, then its CONNECT freed it.
	if n := f.srv.auth.pending.len(); n != max-1 {
		t.Fatalf("%d pending after a CONNECT, want %d", n, max-1)
	}
}
