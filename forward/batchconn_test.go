package forward

import (
	"github.com/devicegate/devicegate/internal/loopback"

	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestBatchConnKeepsBytesInOrder: many small writes arrive whole and in
// order, in fewer reads than writes when they pile up; Close sends what
// was pending before closing; reads go through the buffer.
func TestBatchConnKeepsBytesInOrder(t *testing.T) {
	client, server := loopback.Pair(t)
	b := newBatchConn(client)
	var want bytes.Buffer
	const n = 20000
	got := make(chan []byte, 1)
	go func() {
		all, _ := io.ReadAll(server)
		got <- all
	}()
	for i := range n {
		p := []byte{byte(i), byte(i >> 8), byte(i >> 16), '\n'}
		want.Write(p)
		if _, err := b.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if all := <-got; !bytes.Equal(all, want.Bytes()) {
		t.Fatalf("read %d bytes, want the %d written, in order", len(all), want.Len())
	}
	if _, err := b.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}

	client, server = loopback.Pair(t)
	b = newBatchConn(client)
	go server.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// TestBatchConnWriteError: once the peer is gone a write fails, and so
// does every later one.
func TestBatchConnWriteError(t *testing.T) {
	client, server := loopback.Pair(t)
	b := newBatchConn(client)
	server.Close()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for err == nil && time.Now().Before(deadline) {
		_, err = b.Write(make([]byte, 64<<10))
	}
	if err == nil {
		t.Fatal("writes to a closed peer kept succeeding")
	}
	if _, again := b.Write([]byte("x")); again == nil {
		t.Fatal("a write after a failure succeeded")
	}
}

// TestBatchConnHold: what is written between Hold and Release reaches
// the spool only at Release, in one piece and in order after what came
// before; Release returns at once even when the spool cannot take it
// (the peer reads nothing), and the held bytes follow in order once the
// peer reads.
func TestBatchConnHold(t *testing.T) {
	client, server := loopback.Pair(t)
	b := newBatchConn(client)
	var want bytes.Buffer
	write := func(p []byte) {
		t.Helper()
		want.Write(p)
		if _, err := b.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	write([]byte("before "))
	b.Hold()
	for i := range 100 {
		write([]byte{'p', byte(i)})
	}
	if b.mu.Lock(); len(b.held) != 200 {
		t.Fatalf("held %d bytes, want the 200 written since Hold", len(b.held))
	}
	b.mu.Unlock()
	b.Release()
	if b.mu.Lock(); len(b.held) != 0 {
		t.Fatalf("%d bytes still held after Release", len(b.held))
	}
	b.mu.Unlock()

	// The peer reads nothing: fill the spool until it cannot take a
	// held batch at once.
	chunk := bytes.Repeat([]byte("f"), 16<<10)
	for b.w.Pending()+maxHeld/2 <= b.w.Limit() {
		write(chunk)
	}
	b.Hold()
	for i := range maxHeld / 2 / 1024 {
		write(bytes.Repeat([]byte{byte('a' + i%26)}, 1024))
	}
	released := make(chan struct{})
	go func() { b.Release(); close(released) }()
	select {
	case <-released:
	case <-time.After(10 * time.Second): // a bound on a hang, not a wait
		t.Fatal("Release waited for a full spool")
	}
	got := make(chan []byte, 1)
	go func() {
		all, _ := io.ReadAll(server)
		got <- all
	}()
	write([]byte(" after")) // waits for the held bytes to go first
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if all := <-got; !bytes.Equal(all, want.Bytes()) {
		t.Fatalf("read %d bytes, want the %d written, in order", len(all), want.Len())
	}
}
