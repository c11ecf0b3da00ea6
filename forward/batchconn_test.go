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
