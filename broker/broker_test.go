package broker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
	"github.com/devicegate/devicegate/internal/logtest"
)

func validOptions(t *testing.T) Options {
	t.Helper()
	table, err := devicelimit.NewTable(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := devicelimit.NewResolver(generous, nil, testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	return Options{TCPAddr: "127.0.0.1:0", Table: table, Resolver: resolver, Clock: devicelimit.NewManualClock(t0)}
}

func closeNow(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	otherTable, err := devicelimit.NewTable(testBuckets + 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*Options)
	}{
		{"TCPAddr", func(o *Options) { o.TCPAddr = "" }},
		{"Table", func(o *Options) { o.Table = nil }},
		{"Resolver", func(o *Options) { o.Resolver = nil }},
		{"Clock", func(o *Options) { o.Clock = nil }},
		{"Identity", func(o *Options) { o.Identity = 7 }},
		{"SweepInterval", func(o *Options) { o.SweepInterval = -time.Second }},
		{"buckets", func(o *Options) { o.Table = otherTable }},
		{"DeferLimits.MaxMessagesPerDevice", func(o *Options) { o.DeferLimits.MaxMessagesPerDevice = -1 }},
		{"DeferLimits.MaxBytesPerDevice", func(o *Options) { o.DeferLimits.MaxBytesPerDevice = -1 }},
		{"DeferLimits.MaxTotalBytes", func(o *Options) { o.DeferLimits.MaxTotalBytes = -1 }},
		{"DeferLimits.MaxAge", func(o *Options) { o.DeferLimits.MaxAge = -time.Second }},
		{"Limits.Consumers", func(o *Options) { o.Limits.Consumers = []string{"backend-*", ""} }},
		{"Limits.ConsumerWriteBuffer", func(o *Options) { o.Limits.ConsumerWriteBuffer = -1 }},
	} {
		o := validOptions(t)
		tc.edit(&o)
		s, err := New(o)
		if err == nil || !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, %v; want an ErrInvalidOptions naming %s", tc.field, s, err, tc.field)
		}
	}
	if _, err := New(validOptions(t)); err != nil {
		t.Fatalf("valid options: %v", err)
	}
}

func TestStartFailsThenCloseIsSafe(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	o := validOptions(t)
	o.TCPAddr = busy.Addr().String()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start()
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), o.TCPAddr) {
		t.Fatalf("start on a busy port: %v, want EADDRINUSE naming %s", err, o.TCPAddr)
	}
	if a := s.Addr(); a != nil {
		t.Fatalf("Addr after a failed start: %v, want nil", a)
	}
	closeNow(t, s)
	closeNow(t, s)
	if err := s.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("start after close: %v, want ErrClosed", err)
	}
}

func TestCloseWithoutStart(t *testing.T) {
	s, err := New(validOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	closeNow(t, s)
	closeNow(t, s)
}

func TestStartTwice(t *testing.T) {
	f := start(t, fixtureOpts{})
	if err := f.srv.Start(); !errors.Is(err, ErrStarted) {
		t.Fatalf("second start: %v, want ErrStarted", err)
	}
	if a, ok := f.srv.Addr().(*net.TCPAddr); !ok || a.Port == 0 {
		t.Fatalf("Addr %v, want the bound TCP port", f.srv.Addr())
	}
}

// Close disconnects MQTT 5 clients with 0x8B, drops 3.1.1 ones, closes
// connections that never sent CONNECT, and stops listening.
func TestCloseDisconnectsEveryone(t *testing.T) {
	f := start(t, fixtureOpts{})
	p5 := f.connect(t, 5, "v5", "")
	p3 := f.connect(t, 3, "v3", "")
	raw, err := net.Dial("tcp", f.addr) // never sends CONNECT
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	eventually(t, "raw connection accepted", func() bool { return f.srv.tcp.open() == 3 })

	closeNow(t, f.srv)
	receive(t, "MQTT 5 client disconnected", p5.lost())
	receive(t, "MQTT 3.1.1 client disconnected", p3.lost())
	eventually(t, "DISCONNECT", func() bool { return p5.disconnect() != nil })
	if code := p5.disconnect().ReasonCode; code != 0x8B {
		t.Fatalf("DISCONNECT 0x%02x, want 0x8B server shutting down", code)
	}
	_ = raw.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection without CONNECT is still open")
	}
	if c, err := net.Dial("tcp", f.addr); err == nil {
		c.Close()
		t.Fatal("still accepting after Close")
	}
	closeNow(t, f.srv)
}

// A connection that never sends CONNECT is closed after connectTimeout,
// and counted (connect_timeout).
func TestConnectTimeout(t *testing.T) {
	o := validOptions(t)
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	s.connectTimeout = 50 * time.Millisecond
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer closeNow(t, s)
	raw, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := raw.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read: %v, want the server to close the connection", err)
	}
	eventually(t, "connection untracked", func() bool { return s.tcp.open() == 0 })
	if got := s.AuthStats().ConnectsRefused["connect_timeout"]; got != 1 {
		t.Fatalf("closed for the connect timeout: %d, want 1", got)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Close gives up waiting when its context ends.
func TestCloseHonoursContext(t *testing.T) {
	f := start(t, fixtureOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.srv.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("close with a cancelled context: %v", err)
	}
	closeNow(t, f.srv) // the shutdown finishes anyway
}

// A throttled device is logged once per window however fast it sends,
// and mochi's per-rejection debug lines never reach the log.
func TestThrottledLoggedOncePerWindow(t *testing.T) {
	h := new(logtest.Capture)
	f := start(t, fixtureOpts{
		rules:  []devicelimit.Rule{rule("dev-*", 2, devicelimit.PolicyDrop)},
		logger: slog.New(h),
	})
	p := f.connect(t, 5, "dev-1", "")
	burst := func() {
		for i := range 32 {
			a, _ := p.publish(t, "t/a", "x", 1)
			if (i < 2) != (a.code == 0) {
				t.Fatalf("publish %d: 0x%02x", i, a.code)
			}
		}
	}
	burst()
	if n := h.Count("device throttled"); n != 1 {
		t.Fatalf("%d throttle lines after 30 refusals, want 1", n)
	}
	got := h.All("device throttled")[0]
	want := map[string]string{"level": "INFO", "device": "dev-1", "client": "dev-1", "limit": "2", "window": "1s",
		"policy": "drop", "retry_after": "1.1s"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("log attr %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	f.clock.Advance(2 * time.Second)
	burst()
	if n := h.Count("device throttled"); n != 2 {
		t.Fatalf("%d throttle lines after two windows, want 2", n)
	}
	if n := h.Count("publish packet rejected"); n != 0 {
		t.Fatalf("mochi logged %d rejections", n)
	}
	if n := h.Count("attached listener"); n != 1 {
		t.Fatalf("mochi's own lines: %d 'attached listener', want 1 (mochi logs to the injected logger)", n)
	}
}

// tick evicts idle windows and log-limiter entries, prunes expired
// overrides and forgets connections closed without OnDisconnect.
func TestTick(t *testing.T) {
	f := start(t, fixtureOpts{rules: []devicelimit.Rule{rule("dev-*", 1, devicelimit.PolicyDrop)}})
	p := f.connect(t, 5, "dev-1", "")
	for range 2 {
		p.publish(t, "t/a", "x", 1)
	}
	if err := f.resolver.SetOverride("dev-9", devicelimit.Override{
		Quota: generous, ExpiresAt: f.clock.Now().Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	ghost := f.srv.mqtt.NewClient(nil, "tcp", "ghost", false)
	f.srv.hook.OnSessionEstablish(ghost, packets.Packet{})
	ghost.Stop(nil)

	f.srv.tick(f.clock.Now())
	if f.table.Len() != 1 || f.srv.hook.logs.len() != 1 || len(f.resolver.Overrides(f.clock.Now())) != 1 {
		t.Fatalf("tick within the window evicted something: table %d, logs %d", f.table.Len(), f.srv.hook.logs.len())
	}
	if n := f.srv.hook.connCount(); n != 1 {
		t.Fatalf("%d cached connections after tick, want 1 (the closed ghost forgotten)", n)
	}
	f.clock.Advance(3 * time.Second)
	f.srv.tick(f.clock.Now())
	if f.table.Len() != 0 || f.srv.hook.logs.len() != 0 || len(f.resolver.Overrides(f.clock.Now())) != 0 {
		t.Fatalf("after the window: table %d, logs %d, overrides %v; want all empty",
			f.table.Len(), f.srv.hook.logs.len(), f.resolver.Overrides(f.clock.Now()))
	}
	p.close()
	eventually(t, "connection forgotten on disconnect", func() bool { return f.srv.hook.connCount() == 0 })
}

func TestConnsForgottenOnDisconnect(t *testing.T) {
	f := start(t, fixtureOpts{})
	var ps []publisher
	for i, v := range []int{3, 5, 3, 5} {
		ps = append(ps, f.connect(t, v, "c"+string(rune('0'+i)), ""))
	}
	if n := f.srv.hook.connCount(); n != 4 {
		t.Fatalf("%d cached connections, want 4", n)
	}
	for _, p := range ps {
		p.close()
	}
	eventually(t, "all connections forgotten", func() bool { return f.srv.hook.connCount() == 0 })
}

// Close does not hang on an MQTT 5 subscriber that stopped reading: the
// broker's write of a large message to it is stuck with the client's
// lock held, and the DISCONNECT that Close sends waits for that lock.
// (Keepalive 0, so mochi sets no deadline of its own.)
func TestCloseWithStuckSubscriber(t *testing.T) {
	f := start(t, fixtureOpts{})
	raw, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.(*net.TCPConn).SetReadBuffer(4096)
	_ = raw.SetDeadline(time.Now().Add(waitTimeout))
	send := func(pk packets.Packet, encode func(*packets.Packet, *bytes.Buffer) error) {
		t.Helper()
		var b bytes.Buffer
		if err := encode(&pk, &b); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Write(b.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	// readPacket reads one packet and returns its type.
	r := bufio.NewReader(raw)
	readPacket := func() byte {
		t.Helper()
		first, err := r.ReadByte()
		if err != nil {
			t.Fatal(err)
		}
		n, err := binary.ReadUvarint(r) // MQTT's remaining length is a base-128 varint
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
			t.Fatal(err)
		}
		return first >> 4
	}
	send(packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, ClientIdentifier: "stuck"},
	}, (*packets.Packet).ConnectEncode)
	if typ := readPacket(); typ != packets.Connack {
		t.Fatalf("got packet type %d, want CONNACK", typ)
	}
	send(packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		ProtocolVersion: 5,
		PacketID:        1,
		Filters:         packets.Subscriptions{{Filter: "big/#"}},
	}, (*packets.Packet).SubscribeEncode)
	if typ := readPacket(); typ != packets.Suback {
		t.Fatalf("got packet type %d, want SUBACK", typ)
	}
	// Far more than the socket buffers hold: the write blocks for good.
	if err := f.srv.publishInline("big/1", make([]byte, 32<<20), 0); err != nil {
		t.Fatal(err)
	}
	if b, err := r.ReadByte(); err != nil || b>>4 != packets.Publish { // the write has begun
		t.Fatalf("got %#x, %v, want the start of a PUBLISH", b, err)
	}
	closeNow(t, f.srv)
}
