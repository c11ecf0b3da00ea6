package simulator

import (
	"errors"
	"testing"
	"time"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Device: "dev-00042", Seq: 1<<40 + 7, Sent: time.Unix(0, 1763766000123456789)}
	for _, size := range []int{0, 10, 64, 1024} {
		b := AppendHeader(nil, h, size)
		if len(b) < size || len(b) < headerFixed+len(h.Device) {
			t.Fatalf("size %d: payload of %d bytes", size, len(b))
		}
		got, err := DecodeHeader(b)
		if err != nil || got.Device != h.Device || got.Seq != h.Seq || !got.Sent.Equal(h.Sent) {
			t.Fatalf("size %d: got %+v, %v, want %+v", size, got, err, h)
		}
	}
	for _, bad := range [][]byte{nil, []byte("hello"), []byte("DGS1"), AppendHeader(nil, h, 0)[:headerFixed+3]} {
		if _, err := DecodeHeader(bad); !errors.Is(err, ErrBadPayload) {
			t.Fatalf("decode %q: %v, want ErrBadPayload", bad, err)
		}
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(AppendHeader(nil, Header{Device: "d", Seq: 1, Sent: time.Unix(1, 0)}, 32))
	f.Add([]byte("DGS1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		again, err := DecodeHeader(AppendHeader(nil, h, 0))
		if err != nil || again.Device != h.Device || again.Seq != h.Seq || !again.Sent.Equal(h.Sent) {
			t.Fatalf("re-encode of %+v: %+v, %v", h, again, err)
		}
	})
}
