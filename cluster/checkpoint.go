package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// win is one window of an owned device: its class, unit and number
// within the class's windows of that unit (the table's key,
// devicelimit.AppendWindowKey), and its current limit N (what a crash
// charge is capped at, and what the lease is a share of).
type win struct {
	class string
	unit  devicelimit.Unit
	k     int
	n     int
	// length is the window's current length T.
	length time.Duration
}

// key returns the window's key in the table.
func (w win) key(device string) string {
	return string(devicelimit.AppendWindowKey(make([]byte, 0, len(device)+len(w.class)+4), device, w.class, w.unit, w.k))
}

// quota reports whether the window counts quota: a class whose name
// starts with a NUL counts something else (refusals toward a block)
// and takes no lease.
func (w win) quota() bool { return len(w.class) == 0 || w.class[0] != 0 }

// checkpointVersion is the first byte of an encoded checkpoint.
const checkpointVersion = 1

// errBadCheckpoint reports a checkpoint this version cannot read.
var errBadCheckpoint = errors.New("unreadable checkpoint")

// appendCheckpoint encodes a device's windows: the version, then per
// window its class (length and bytes), unit, k, N and T as uvarints, and
// its window's devicelimit encoding (length and bytes); a window the
// table no longer holds (empty) is encoded with an empty window.
func appendCheckpoint(b []byte, t *devicelimit.Table, device string, wins []win) []byte {
	b = append(b, checkpointVersion)
	for _, w := range wins {
		b = binary.AppendUvarint(b, uint64(len(w.class)))
		b = append(b, w.class...)
		b = append(b, byte(w.unit))
		b = binary.AppendUvarint(b, uint64(w.k))
		b = binary.AppendUvarint(b, uint64(w.n))
		b = binary.AppendUvarint(b, uint64(w.length))
		var enc []byte
		if snap, ok := t.Snapshot(w.key(device)); ok {
			enc, _ = snap.MarshalBinary()
		}
		b = binary.AppendUvarint(b, uint64(len(enc)))
		b = append(b, enc...)
	}
	return b
}

// savedWin is one window of a decoded checkpoint.
type savedWin struct {
	win
	w   devicelimit.Window
	has bool
}

// decodeCheckpoint reads appendCheckpoint's encoding; "" is no window.
func decodeCheckpoint(s string) ([]savedWin, error) {
	if s == "" {
		return nil, nil
	}
	b := []byte(s)
	if b[0] != checkpointVersion {
		return nil, fmt.Errorf("%w: version %d", errBadCheckpoint, b[0])
	}
	b = b[1:]
	var out []savedWin
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	for len(b) > 0 {
		var sw savedWin
		cl, ok := next()
		if !ok || cl > uint64(len(b)) {
			return nil, errBadCheckpoint
		}
		sw.class, b = string(b[:cl]), b[cl:]
		if len(b) == 0 || b[0] > byte(devicelimit.Bytes) {
			return nil, errBadCheckpoint
		}
		sw.unit, b = devicelimit.Unit(b[0]), b[1:]
		k, ok1 := next()
		n, ok2 := next()
		length, ok4 := next()
		el, ok3 := next()
		if !ok1 || !ok2 || !ok3 || !ok4 || k >= devicelimit.MaxWindows || n > devicelimit.MaxBytes || length == 0 || length > uint64(devicelimit.MaxWindow) || el > uint64(len(b)) {
			return nil, errBadCheckpoint
		}
		sw.k, sw.n, sw.length = int(k), int(n), time.Duration(length)
		if el > 0 {
			if err := sw.w.UnmarshalBinary(b[:el]); err != nil {
				return nil, fmt.Errorf("%w: %w", errBadCheckpoint, err)
			}
			sw.has = true
		}
		b = b[el:]
		out = append(out, sw)
	}
	return out, nil
}

// charged returns w with units more counted at instant at, in the
// bucket holding at (the ring moved forward to it when at is later than
// its head). The counts it pushes out of the ring are dropped when they
// have expired for every window reaching from (the first decision the
// charge is for: at is later by the claim's time) under the longer of
// w's length and the quota's (length: an override may have grown it);
// else they move to the new oldest bucket, expiring later. A window with no counts is made of length length. The
// charge is capped at limit: the old owner admitted at most limit in
// any window of its length.
func charged(w devicelimit.Window, has bool, units, limit, buckets int, length time.Duration, from, at devicelimit.Tick) devicelimit.Window {
	if !has || len(w.Counts) != buckets+1 || w.Length <= 0 {
		w = devicelimit.Window{Length: length, Head: bucketAt(at, buckets, length), Counts: make([]uint32, buckets+1)}
	}
	units = min(units, limit)
	if units <= 0 {
		return w
	}
	nb := bucketAt(at, buckets, w.Length)
	if shift := nb - w.Head; shift > 0 {
		// Counts[i] is bucket Head-buckets+i: move the ring forward by
		// shift (a decision in bucket nb counts nb-buckets..nb,
		// devicelimit/window.go).
		counts := make([]uint32, buckets+1)
		var keep uint32
		span := max(length, w.Length)
		for i, c := range w.Counts {
			if j := int64(i) - shift; j >= 0 {
				counts[j] = c
			} else if end := bucketStart(w.Head-int64(buckets)+int64(i)+1, buckets, w.Length); end > from.Add(-span) {
				keep += c
			}
		}
		counts[0] += keep
		w.Counts, w.Head = counts, nb
	}
	// at before the head (a clock behind the old owner's): the head
	// bucket, which expires later still.
	w.Counts[len(w.Counts)-1] += uint32(units)
	return w
}

// bucketStart returns the first instant of bucket k (bucketAt's
// inverse, rounded up).
func bucketStart(k int64, buckets int, length time.Duration) devicelimit.Tick {
	q, r := k/int64(buckets), k%int64(buckets)
	return devicelimit.Tick(q*int64(length) + (r*int64(length)+int64(buckets)-1)/int64(buckets))
}

// bucketAt returns floor(at*buckets/length), the table's bucket number.
func bucketAt(at devicelimit.Tick, buckets int, length time.Duration) int64 {
	if at <= 0 {
		return 0
	}
	q, r := int64(at)/int64(length), int64(at)%int64(length)
	return q*int64(buckets) + r*int64(buckets)/int64(length)
}
