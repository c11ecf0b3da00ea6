package persist

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeSchema(1), encodeClock(t0), encodeClean(true), true, true)
	f.Add(encodeSchema(1), encodeClock(0), encodeClean(false), true, true)
	f.Add(encodeSchema(1), []byte(nil), []byte(nil), false, false)
	f.Add(encodeSchema(2), encodeClock(t0), encodeClean(false), true, true)
	f.Add([]byte{0x81, 0x00}, encodeClock(t0), []byte{2}, true, true)
	f.Add([]byte{}, []byte{1, 2, 3}, []byte{}, true, true)
	f.Fuzz(func(t *testing.T, schema, clock, clean []byte, hasClock, hasClean bool) {
		if !hasClock {
			clock = nil
		}
		if !hasClean {
			clean = nil
		}
		m, err := decodeMeta(schema, clock, clean)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNewerSchema) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrNewerSchema", err)
			}
			return
		}
		if m.Schema < 1 || m.Schema > SchemaVersion || m.HighWater < 0 || m.New {
			t.Fatalf("decoded out of range: %+v", m)
		}
		// Valid values round-trip.
		if !bytes.Equal(encodeSchema(m.Schema), schema) {
			t.Fatalf("schema % x decoded to %d", schema, m.Schema)
		}
		if clock != nil && !bytes.Equal(encodeClock(m.HighWater), clock) {
			t.Fatalf("clock % x decoded to %d", clock, m.HighWater)
		}
		if clean != nil && !bytes.Equal(encodeClean(m.CleanShutdown), clean) {
			t.Fatalf("clean % x decoded to %v", clean, m.CleanShutdown)
		}
	})
}

func FuzzDecodeOverride(f *testing.F) {
	for _, o := range []devicelimit.Override{
		{Quota: q},
		{Quota: devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: devicelimit.MaxWindow, Policy: devicelimit.PolicyDisconnect}, ExpiresAt: t0},
		{Quota: devicelimit.Quota{Limit: 1, Window: 1, Policy: devicelimit.PolicyDefer}, ExpiresAt: 1},
		{Quota: devicelimit.WithWindows(devicelimit.PolicyDisconnect,
			devicelimit.Limit{Unit: devicelimit.Messages, N: 10, Window: time.Minute},
			devicelimit.Limit{Unit: devicelimit.Bytes, N: devicelimit.MaxBytes, Window: devicelimit.MaxWindow}), ExpiresAt: t0},
		{Quota: devicelimit.Quota{Limit: 3, Window: time.Minute, Shadow: true}, ExpiresAt: t0},
		{Quota: q, Classes: []devicelimit.Class{{Name: "alarms", Topics: []string{"devices/+/alarm/#", "x"},
			Quota: devicelimit.WithWindows(devicelimit.PolicyDrop, devicelimit.Limit{Unit: devicelimit.Bytes, N: 100, Window: time.Minute})}}},
	} {
		f.Add(appendOverride(nil, o))
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 1, 1, 0, 0})
	f.Add([]byte{1, 0x81, 0x00, 1, 0, 0})
	f.Add([]byte{1, 1, 1, 3, 0})
	f.Add([]byte{1, 1, 1, 0, 1})
	f.Add([]byte{1, 1, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := decodeOverride(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if got := appendOverride(nil, o); !bytes.Equal(got, b) {
			t.Fatalf("% x decoded to %+v, which encodes as % x", b, o, got)
		}
		if o.Quota.NWindows > 0 {
			// Several windows: each checked as decoded (ValidateLimits).
			if o.ExpiresAt < 0 || o.Quota.Validate(1) != nil {
				t.Fatalf("decoded out of range: %+v", o)
			}
			return
		}
		if o.ExpiresAt < 0 || o.Quota.Limit < 1 || o.Quota.Window <= 0 || o.Quota.Window > devicelimit.MaxWindow {
			t.Fatalf("decoded out of range: %+v", o)
		}
		// What decodes is a quota a resolver with one bucket accepts
		// when its window is long enough for it.
		if o.Quota.Window >= time.Millisecond {
			if err := o.Quota.Validate(1); err != nil {
				t.Fatalf("decoded %+v does not validate: %v", o, err)
			}
		}
	})
}

func FuzzDecodeDeferredKey(f *testing.F) {
	f.Add(appendDeferredKey(nil, "a", 0))
	f.Add(appendDeferredKey(nil, "sensor-0001", 1<<40))
	f.Add(appendDeferredKey(nil, string(bytes.Repeat([]byte{0xff}, 200)), 7))
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add([]byte{0x80})
	f.Add([]byte{0x81, 0x00, 'a', 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 'a', 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, k []byte) {
		device, seq, err := decodeDeferredKey(k)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if err := validDeferredDevice(string(device)); err != nil {
			t.Fatalf("% x decoded to an invalid device: %v", k, err)
		}
		if got := appendDeferredKey(nil, string(device), seq); !bytes.Equal(got, k) {
			t.Fatalf("% x decoded to %q/%d, which encodes as % x", k, device, seq, got)
		}
	})
}

// FuzzDecodeBlock: a block record of any bytes decodes or fails with an
// error; what decodes as version 2 encodes back to the same bytes, and
// a version 1 record is its end alone.
func FuzzDecodeBlock(f *testing.F) {
	f.Add(encodeBlock(t0, t0.Add(time.Hour), "3 refusals over quota within 1m0s (quota: 10 messages per 1m0s)"))
	f.Add(encodeBlock(0, 1, ""))
	f.Add([]byte(blockV1))
	f.Add([]byte{2, 1, 2})
	f.Fuzz(func(t *testing.T, v []byte) {
		since, until, reason, err := decodeBlock(v)
		if err != nil {
			return
		}
		if len(v) == 8 {
			if since != 0 || reason != "" || !bytes.Equal(encodeBlock(0, until, "")[1:9], v) {
				t.Fatalf("version 1 record % x decoded to %d %d %q", v, since, until, reason)
			}
			return
		}
		if len(reason) <= maxBlockReason && !bytes.Equal(encodeBlock(since, until, reason), v) {
			t.Fatalf("record % x decoded to %d %d %q, which encodes otherwise", v, since, until, reason)
		}
	})
}
