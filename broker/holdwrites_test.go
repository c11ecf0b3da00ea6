package broker

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/devicegate/devicegate/internal/loopback"
)

// tcpPair returns both ends of a real loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	client, server = loopback.Pair(t)
	_ = client.SetReadDeadline(time.Now().Add(waitTimeout))
	return server, client
}

// TestHeldWritesInOrder: writes held go out in one write, in order,
// after what was written before; writes after the flush follow them.
// A Close writes what is held first (mochi's DISCONNECT before it
// closes), and a CloseWrite's FIN does not overtake it.
func TestHeldWritesInOrder(t *testing.T) {
	for _, end := range []string{"flush", "close", "closewrite"} {
		t.Run(end, func(t *testing.T) {
			server, client := tcpPair(t)
			w := &writeLog{Conn: server}
			pc := &protoConn{Conn: w}
			mustWrite(t, pc, "a")
			if !pc.hold() {
				t.Fatal("hold refused without a spool")
			}
			mustWrite(t, pc, "b")
			mustWrite(t, pc, "c")
			var err error
			switch end {
			case "flush":
				err = pc.flush()
				mustWrite(t, pc, "d")
				_ = w.CloseWrite()
			case "close":
				err = pc.Close()
			case "closewrite":
				err = pc.CloseWrite()
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(client)
			want := map[string]string{"flush": "abcd", "close": "abc", "closewrite": "abc"}[end]
			if string(got) != want || err != nil {
				t.Fatalf("read %q, %v; want %q then EOF", got, err, want)
			}
			if len(w.writes) != len(want)-1 {
				t.Fatalf("%d writes %q, want b and c in one", len(w.writes), w.writes)
			}
		})
	}
}

// TestHeldWriteFailureEndsConnection: a flush that cannot write closes
// the socket, so the connection ends (mochi's read fails) as when
// mochi's own write fails; the error is returned.
func TestHeldWriteFailureEndsConnection(t *testing.T) {
	server, _ := tcpPair(t)
	pc := &protoConn{Conn: server}
	pc.hold()
	mustWrite(t, pc, "held")
	_ = server.(*net.TCPConn).CloseWrite() // the next write fails: EPIPE
	if err := pc.flush(); err == nil {
		t.Fatal("flush after the write side closed: no error")
	}
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after a failed flush: %v, want the socket closed", err)
	}
	if err := pc.flush(); err != nil {
		t.Fatalf("a second flush, nothing held: %v", err)
	}
}

// TestCloseDoesNotWaitForBlockedRelease: a release writing to a socket
// the client does not read (its buffers full) does not hold up a Close
// (mochi's, when a new connection takes the session over): the Close
// closes the socket at once, which ends the write with an error, as a
// Close ends a write of mochi's own.
func TestCloseDoesNotWaitForBlockedRelease(t *testing.T) {
	server, client := tcpPair(t)
	_ = server.(*net.TCPConn).SetWriteBuffer(4096)
	_ = client.(*net.TCPConn).SetReadBuffer(4096)
	pc := &protoConn{Conn: server}
	pc.hold()
	wrote := make(chan error, 1)
	go func() {
		_, err := pc.Write(make([]byte, 16<<20)) // beyond maxHeld: released at once, and blocks
		wrote <- err
	}()
	eventually(t, "the release writing", func() bool {
		pc.heldMu.Lock()
		defer pc.heldMu.Unlock()
		return pc.releasing
	})
	closed := make(chan error, 1)
	go func() { closed <- pc.Close() }()
	if err := receive(t, "Close to return", closed); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, "the blocked write to end", wrote); err == nil {
		t.Fatal("the write the Close cut short returned no error")
	}
}

// TestSpoolHoldsNothing: with a spool (a backend consumer) hold refuses
// and the writes go to the spool, which writes what is pending in one
// call anyway.
// TestCloseWritesHeldBoundedly: Close writes the held bytes itself when
// no release is writing, and a socket the client no longer reads (its
// buffers full) does not keep it: the write gets closeFlushTimeout.
// Before, Close waited on that write for as long as the peer read
// nothing.
func TestCloseWritesHeldBoundedly(t *testing.T) {
	server, client := tcpPair(t)
	_ = server.(*net.TCPConn).SetWriteBuffer(4096)
	_ = client.(*net.TCPConn).SetReadBuffer(4096)
	// Fill the socket's buffers: the peer reads nothing.
	_ = server.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		if _, err := server.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	_ = server.SetWriteDeadline(time.Time{})
	pc := &protoConn{Conn: server}
	pc.hold()
	mustWrite(t, pc, "disconnect") // held: mochi's last packet before its Close
	closed := make(chan error, 1)
	go func() { closed <- pc.Close() }()
	if err := receive(t, "Close to return", closed); err != nil {
		t.Fatal(err)
	}
}

func TestSpoolHoldsNothing(t *testing.T) {
	server, client := tcpPair(t)
	pc := &protoConn{Conn: server}
	pc.startSpool(1<<16, nil, nil)
	if pc.hold() {
		t.Fatal("hold with a spool")
	}
	mustWrite(t, pc, "x")
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(client); string(got) != "x" || err != nil {
		t.Fatalf("read %q, %v; want x then EOF", got, err)
	}
	pc.ended()
}

func mustWrite(t *testing.T, w io.Writer, s string) {
	t.Helper()
	if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
		t.Fatalf("write %q: %d, %v", s, n, err)
	}
}
