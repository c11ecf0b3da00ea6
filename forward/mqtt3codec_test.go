package forward

import (
	"bufio"
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// FuzzMQTT3Packets: whatever bytes the upstream sends, the client's
// decoder returns packets or an error, never panics, and a PUBLISH it
// read comes back the same once encoded again and read.
func FuzzMQTT3Packets(f *testing.F) {
	for _, seed := range [][]byte{
		{0x40, 2, 0, 1},
		{0x40, 2, 0},
		{0x40, 0xFF, 0xFF, 0xFF, 0xFF, 1},
		{0x32, 10, 0, 5, 'c', 'm', 'd', '/', 'a', 0, 9, '1', 0xD0, 0},
		{0x36, 5, 0, 1, 't', 0, 1},
		{0x30, 3, 0, 9, 't'},
		{0x90, 3, 0, 1, 0x80},
		{0x62, 2, 0, 7},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReader(bytes.NewReader(in))
		var scratch []byte
		for {
			p, err := readPacket(r, &scratch)
			if err != nil {
				return
			}
			switch p.typ {
			case pkPuback, pkPubrel:
				_, _ = idOf(p)
			case pkPublish:
				m, err := parsePublish(p)
				if err != nil {
					continue
				}
				b, err := appendPublish(nil, m.topic, m.payload, m.qos, m.retain, m.id)
				if err != nil {
					t.Fatalf("%+v read, and not encoded again: %v", m, err)
				}
				var s2 []byte
				p2, err := readPacket(bufio.NewReader(bytes.NewReader(b)), &s2)
				if err != nil {
					t.Fatalf("%+v encoded as % x, not read again: %v", m, b, err)
				}
				m2, err := parsePublish(p2)
				if err != nil || m2.topic != m.topic || !bytes.Equal(m2.payload, m.payload) || m2.qos != m.qos || m2.retain != m.retain || m2.id != m.id {
					t.Fatalf("%+v came back as %+v (%v)", m, m2, err)
				}
			}
		}
	})
}

// A packet's claimed length is the upstream's word: a PUBLISH claiming
// 256 MiB and cut off after 3 bytes costs what arrived, not the claim,
// and any other packet claiming more than maxControl is refused before
// a byte of it is read.
func TestReadPacketAllocatesWhatArrives(t *testing.T) {
	var scratch []byte
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readPacket(bufio.NewReader(bytes.NewReader([]byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0, 1, 't'})), &scratch)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "3 of 268435455 bytes read") {
		t.Fatalf("a PUBLISH cut off: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("reading a PUBLISH that claims 256 MiB allocated %d bytes", grew)
	}
	_, err = readPacket(bufio.NewReader(bytes.NewReader([]byte{0x90, 0xFF, 0xFF, 0xFF, 0x7F})), &scratch)
	if !errors.Is(err, errMalformed) || cap(scratch) != 0 {
		t.Fatalf("a SUBACK claiming 256 MiB: %v, scratch of %d bytes", err, cap(scratch))
	}
}
