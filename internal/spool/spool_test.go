package spool

import (
	"github.com/devicegate/devicegate/internal/loopback"
	"github.com/devicegate/devicegate/internal/poll"

	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestWriterBoundsAndOrders: while the peer reads nothing, writes
// return until limit bytes are pending and then block; the peer then
// reads every byte, in order.
func TestWriterBoundsAndOrders(t *testing.T) {
	const limit, chunk, n = 64 << 10, 1000, 20_000 // 20 MB: more than loopback's socket buffers
	near, far := loopback.Pair(t)
	s := New(near, limit, nil, nil)
	t.Cleanup(func() { _ = s.Close(); s.Wait() })

	var sent bytes.Buffer
	for i := range n {
		b := bytes.Repeat([]byte{byte(i)}, chunk)
		sent.Write(b)
	}
	written := make(chan error, 1)
	maxPending := 0
	go func() {
		for i := range n {
			if _, err := s.Write(sent.Bytes()[i*chunk : (i+1)*chunk]); err != nil {
				written <- err
				return
			}
			maxPending = max(maxPending, s.Pending())
		}
		written <- nil
	}()
	// The writer blocks: the peer holds what its socket buffers take,
	// the spool limit bytes, and the 20 MB are more than both.
	poll.Until(t, waitTimeout, "a full spool", func() bool { return s.Pending() > limit-chunk })
	select {
	case err := <-written:
		t.Fatalf("every write returned (%v) while the peer read nothing", err)
	default:
	}

	got := make([]byte, sent.Len())
	_ = far.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.ReadFull(far, got); err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent.Bytes()) {
		t.Fatal("the peer read other bytes than were written, or out of order")
	}
	if maxPending > limit {
		t.Fatalf("%d bytes pending, over the limit of %d", maxPending, limit)
	}
}

// TestWriterLargeWrite: a write larger than the limit is taken once
// nothing else is pending, rather than never.
func TestWriterLargeWrite(t *testing.T) {
	near, far := loopback.Pair(t)
	s := New(near, 1024, nil, nil)
	t.Cleanup(func() { _ = s.Close(); s.Wait() })
	big := bytes.Repeat([]byte("x"), 10_000)
	for range 3 {
		if _, err := s.Write(big); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 3*len(big))
	_ = far.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.ReadFull(far, got); err != nil {
		t.Fatal(err)
	}
}

// TestWriterCloseDrains: Close returns at once, ends reads, writes
// what is pending (the DISCONNECT mochi wrote last) and then closes: the
// peer reads every byte, then EOF. Writes after Close fail.
func TestWriterCloseDrains(t *testing.T) {
	near, far := loopback.Pair(t)
	s := New(near, 8<<20, nil, nil)
	payload := bytes.Repeat([]byte("m"), 4<<20)
	if _, err := s.Write(payload); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte{0xe0, 0}); err != nil { // DISCONNECT
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := near.Read(make([]byte, 1))
		readErr <- err
	}()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-readErr; err == nil {
		t.Fatal("a read after Close returned no error")
	}
	if _, err := s.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
	_ = far.SetReadDeadline(time.Now().Add(waitTimeout))
	got, err := io.ReadAll(far)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(payload, 0xe0, 0); !bytes.Equal(got, want) {
		t.Fatalf("peer read %d bytes before EOF, want %d ending in DISCONNECT", len(got), len(want))
	}
	s.Wait()
	if err := s.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// TestWriterPeerGone: once the socket fails, a blocked write and
// every later one fail instead of waiting forever.
func TestWriterPeerGone(t *testing.T) {
	near, far := loopback.Pair(t)
	s := New(near, 64<<10, nil, nil)
	t.Cleanup(func() { _ = s.Close(); s.Wait() })
	if tc, ok := far.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close with a reset
	}
	chunk := make([]byte, 32<<10)
	failed := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Write(chunk); err != nil {
				failed <- err
				return
			}
		}
	}()
	poll.Until(t, waitTimeout, "a full spool", func() bool { return s.Pending() >= 32<<10 })
	far.Close()
	select {
	case err := <-failed:
		if errors.Is(err, net.ErrClosed) {
			t.Fatalf("write failed with %v, want the socket's error", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("writes still blocked after the peer reset the connection")
	}
}

// waitTimeout bounds the tests' waits for the network.
const waitTimeout = 10 * time.Second
