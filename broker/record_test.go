package broker

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/devicegate/devicegate/devicelimit"
)

// sampleMsgs are records of every shape: bare MQTT 3.1.1, every MQTT 5
// property, empty and binary fields, extreme integers.
func sampleMsgs() []deferredMsg {
	return []deferredMsg{
		{Enqueued: t0, Quota: devicelimit.Quota{Limit: 5, Window: time.Second, Policy: devicelimit.PolicyDefer},
			Version: 4, QoS: 1, Topic: "t/dev-1", Payload: []byte("21.5")},
		{Enqueued: t0.Add(time.Millisecond), Quota: devicelimit.Quota{Limit: 1, Window: time.Millisecond},
			Version: 5, QoS: 2, Retain: true, Topic: "a/b/c", Payload: []byte{0, 1, 2, 0xff},
			PayloadFormat: 1, PayloadFormatFlag: true, MessageExpiry: 60, ContentType: "application/json",
			ResponseTopic: "reply/to", CorrelationData: []byte{0xde, 0xad},
			User: []packets.UserProperty{{Key: "k", Val: "v"}, {Key: "", Val: ""}, {Key: "k", Val: "dup"}}},
		{Enqueued: -1, Quota: devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: devicelimit.MaxWindow, Policy: devicelimit.PolicyDisconnect},
			Version: 3, Topic: "x", MessageExpiry: math.MaxUint32, PayloadFormatFlag: true},
		{Enqueued: math.MaxInt64, Quota: devicelimit.Quota{Limit: 1, Window: 1}, Version: 5, Topic: "é/ü", Payload: bytes.Repeat([]byte("p"), 300)},
		{Enqueued: t0, Quota: devicelimit.WithWindows(devicelimit.PolicyDefer,
			devicelimit.Limit{Unit: devicelimit.Messages, N: 10, Window: time.Minute},
			devicelimit.Limit{Unit: devicelimit.Bytes, N: devicelimit.MaxBytes, Window: devicelimit.MaxWindow}),
			Version: 5, QoS: 1, Topic: "t/dev-2", Payload: []byte("windows")},
	}
}

func TestDeferredRecordRoundTrip(t *testing.T) {
	for i, m := range sampleMsgs() {
		rec := appendDeferred(nil, &m)
		if n := sizeDeferred(&m); n != len(rec) {
			t.Fatalf("sample %d: sizeDeferred %d, encoding has %d bytes", i, n, len(rec))
		}
		got, err := decodeDeferred(rec)
		if err != nil {
			t.Fatalf("sample %d: decode: %v", i, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("sample %d: got %+v, want %+v", i, got, m)
		}
		if again := appendDeferred(nil, &got); !bytes.Equal(again, rec) {
			t.Fatalf("sample %d: re-encoding differs", i)
		}
	}
}

// Every truncation of a valid record, and a record with a byte after
// it, is refused with ErrBadDeferred.
func TestDeferredRecordRefusesDamage(t *testing.T) {
	for i, m := range sampleMsgs() {
		rec := appendDeferred(nil, &m)
		for n := range len(rec) {
			if _, err := decodeDeferred(rec[:n]); !errors.Is(err, ErrBadDeferred) {
				t.Fatalf("sample %d cut at %d: %v, want ErrBadDeferred", i, n, err)
			}
		}
		if _, err := decodeDeferred(append(rec, 0)); !errors.Is(err, ErrBadDeferred) {
			t.Fatalf("sample %d with a trailing byte: %v, want ErrBadDeferred", i, err)
		}
	}
	good := appendDeferred(nil, &sampleMsgs()[0])
	for _, tc := range []struct {
		name string
		edit func([]byte) []byte
	}{
		{"version", func(b []byte) []byte { b[0] = 2; return b }},
		{"non-minimal varint", func(b []byte) []byte {
			// The limit 5 as two bytes: 0x85 0x00.
			off := 1 + len(binaryVarint(int64(t0)))
			return append(append(append([]byte{}, b[:off]...), 0x85, 0x00), b[off+1:]...)
		}},
	} {
		if _, err := decodeDeferred(tc.edit(append([]byte{}, good...))); !errors.Is(err, ErrBadDeferred) {
			t.Errorf("%s: %v, want ErrBadDeferred", tc.name, err)
		}
	}
	for _, m := range []deferredMsg{
		{Quota: devicelimit.Quota{Limit: 0, Window: time.Second}, Version: 4, Topic: "t"},
		{Quota: devicelimit.Quota{Limit: 1, Window: 0}, Version: 4, Topic: "t"},
		{Quota: devicelimit.Quota{Limit: 1, Window: time.Second, Policy: 3}, Version: 4, Topic: "t"},
		{Quota: devicelimit.Quota{Limit: 1, Window: time.Second}, Version: 6, Topic: "t"},
		{Quota: devicelimit.Quota{Limit: 1, Window: time.Second}, Version: 4, QoS: 3, Topic: "t"},
		{Quota: devicelimit.Quota{Limit: 1, Window: time.Second}, Version: 4, Topic: ""},
	} {
		if _, err := decodeDeferred(appendDeferred(nil, &m)); !errors.Is(err, ErrBadDeferred) {
			t.Errorf("%+v: %v, want ErrBadDeferred", m, err)
		}
	}
}

func binaryVarint(v int64) []byte { return binary.AppendVarint(nil, v) }

// Records are decoded from the data file: no input panics, and whatever
// decodes is canonical: it encodes back to the same bytes.
func FuzzDecodeDeferred(f *testing.F) {
	for _, m := range sampleMsgs() {
		rec := appendDeferred(nil, &m)
		f.Add(rec)
		f.Add(rec[:len(rec)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeDeferred(b)
		if err != nil {
			if !errors.Is(err, ErrBadDeferred) {
				t.Fatalf("error %v does not wrap ErrBadDeferred", err)
			}
			return
		}
		if again := appendDeferred(nil, &m); !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v re-encodes to %x, not %x", m, again, b)
		}
		if n := sizeDeferred(&m); n != len(b) {
			t.Fatalf("sizeDeferred %d, encoding has %d bytes", n, len(b))
		}
		// The message shares no memory with the record.
		for i := range b {
			b[i] ^= 0xff
		}
		if m2, err := decodeDeferred(appendDeferred(nil, &m)); err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip after changing the input: %+v, %v", m2, err)
		}
	})
}

// TestPacketRecordRoundTrip: a device's MQTT 5 publish, turned into a
// deferral record, stored, read back and turned into the publish a
// release injects, keeps everything the device sent.
func TestPacketRecordRoundTrip(t *testing.T) {
	in := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
		TopicName:   "devices/d/t",
		Payload:     []byte("payload"),
		PacketID:    7,
		Properties: packets.Properties{
			PayloadFormat: 1, PayloadFormatFlag: true, MessageExpiryInterval: 60,
			ContentType: "text/plain", ResponseTopic: "r/t", CorrelationData: []byte{1, 2},
			User: []packets.UserProperty{{Key: "k", Val: "v"}},
		},
	}
	q := devicelimit.Quota{Limit: 3, Window: time.Second, Policy: devicelimit.PolicyDefer}
	m := deferredFromPacket(&in, 5, t0, q)
	got, err := decodeDeferred(appendDeferred(nil, &m))
	if err != nil {
		t.Fatal(err)
	}
	out := got.packet(got.MessageExpiry)
	in.PacketID = 1 // an inline publish's
	if !reflect.DeepEqual(out, in) || got.Enqueued != t0 || got.Quota != q || got.Version != 5 {
		t.Fatalf("round trip:\n got %+v\nwant %+v", out, in)
	}
}

// deferredBeforeSeveralWindows is the record a gateway at commit
// 6fc1c5d wrote for a deferred MQTT 5 message under 3 per hour.
const deferredBeforeSeveralWindows = "018080d0e2c6bfce972f0380c0e285e368010504000011646576696365732f6d657465722d322f740a746578742f706c61696e0000000568656c6c6f"

// TestDeferredRecordBeforeSeveralWindows: a message deferred under a
// quota of one window is written in the same bytes as before quotas of
// several windows, and those bytes read back as the same message.
func TestDeferredRecordBeforeSeveralWindows(t *testing.T) {
	m := deferredMsg{Enqueued: 1_700_000_000_000_000_000, Quota: devicelimit.Quota{Limit: 3, Window: time.Hour, Policy: devicelimit.PolicyDefer},
		Version: 5, QoS: 1, Topic: "devices/meter-2/t", Payload: []byte("hello"), ContentType: "text/plain"}
	if got := hex.EncodeToString(appendDeferred(nil, &m)); got != deferredBeforeSeveralWindows {
		t.Fatalf("written as %s, before several windows %s", got, deferredBeforeSeveralWindows)
	}
	b, _ := hex.DecodeString(deferredBeforeSeveralWindows)
	if got, err := decodeDeferred(b); err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("the earlier record reads as %+v, %v; want %+v", got, err, m)
	}
}

// TestDeferredRecordChecksum: a sealed record passes its check under
// the key and number it was sealed for, and fails it with any byte
// changed, under another device or class key, or under another number;
// its body is the record appendDeferred writes.
func TestDeferredRecordChecksum(t *testing.T) {
	for i, m := range sampleMsgs() {
		rec := deferredRecord(&m)
		sealDeferred(rec, "dev-1\x00class", 42)
		if err := checkDeferred(rec, "dev-1\x00class", 42); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !bytes.Equal(deferredBody(rec), appendDeferred(nil, &m)) || cap(rec) != len(rec) {
			t.Fatalf("sample %d: body differs from the record, or not exactly sized", i)
		}
		for _, tc := range []struct {
			key string
			seq uint64
		}{{"dev-1", 42}, {"dev-1\x00clasS", 42}, {"dev-1\x00class", 43}} {
			if err := checkDeferred(rec, tc.key, tc.seq); !errors.Is(err, ErrDamagedDeferred) {
				t.Fatalf("sample %d under %q/%d: %v, want ErrDamagedDeferred", i, tc.key, tc.seq, err)
			}
		}
		for j := 1; j < len(rec); j++ {
			rec[j] ^= 0x10
			if err := checkDeferred(rec, "dev-1\x00class", 42); !errors.Is(err, ErrDamagedDeferred) {
				t.Fatalf("sample %d, byte %d changed: %v, want ErrDamagedDeferred", i, j, err)
			}
			rec[j] ^= 0x10
		}
	}
}
