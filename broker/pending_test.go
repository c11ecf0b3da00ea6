package broker

import (
	"errors"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestPendingConnectionsBounded: connections that never send CONNECT
// count against Limits.MaxPendingConnections; beyond it a new one is
// closed as soon as it is accepted, counted as refused ("pending"), and
// memory stays bounded however many arrive. Before, every idle socket was
// held (about 50 KiB each) until the 10 s CONNECT deadline, whatever
// max_connections said. Once CONNECT is read a connection no longer
// counts.
func TestPendingConnectionsBounded(t *testing.T) {
	const bound, idle = 50, 1000
	f := start(t, fixtureOpts{options: func(o *Options) { o.Limits.MaxPendingConnections = bound }})

	// Connected clients do not count: these 2*bound stay connected.
	for i := range 2 * bound {
		c := rawSession(t, f.addr, "device-"+string(rune('A'+i%26))+string(rune('a'+i/26)), 60)
		defer c.Close()
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	conns := make([]net.Conn, 0, idle)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range idle {
		c, err := net.DialTimeout("tcp", f.addr, waitTimeout)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// The ones over the bound are closed at once; the others wait for
	// their CONNECT.
	// Read every connection at once: a read past a passed deadline
	// times out without looking for the server's close.
	results := make(chan bool, idle)
	deadline := time.Now().Add(2 * time.Second)
	for _, c := range conns {
		go func() {
			_ = c.SetReadDeadline(deadline)
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			results <- err != nil && !(errors.As(err, &ne) && ne.Timeout())
		}()
	}
	closed := 0
	for range idle {
		if <-results {
			closed++
		}
	}
	if closed != idle-bound {
		t.Fatalf("%d of %d idle connections closed at once, want %d (bound %d)", closed, idle, idle-bound, bound)
	}
	if got := f.srv.AuthStats().ConnectsRefused["pending"]; got != idle-bound {
		t.Fatalf("refused pending = %d, want %d", got, idle-bound)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	t.Logf("heap+stacks grew %d KiB for %d idle sockets (bound %d)", grew>>10, idle, bound)
	if grew > 16<<20 {
		t.Fatalf("heap and stacks grew %d MiB for %d idle sockets with a bound of %d", grew>>20, idle, bound)
	}

	// While the bound is full a new connection is closed too; once the
	// idle ones go, a client gets in and its CONNECT frees its place.
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	eventually(t, "the pending connections to end", func() bool { return f.srv.auth.pending.len() == 0 })
	c := rawSession(t, f.addr, "late", 60)
	defer c.Close()
	if n := f.srv.auth.pending.len(); n != 0 {
		t.Fatalf("%d pending after a CONNECT, want 0", n)
	}
}
