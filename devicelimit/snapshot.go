package devicelimit

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"time"
)

// Window is a copy of one device's window, for persistence and
// inspection. Counts[i] is the count of bucket Head-len(Counts)+1+i, oldest
// first; a table's windows have buckets+1 counts. The zero value is an
// empty window.
type Window struct {
	// Length is the window length T the buckets were cut for.
	Length time.Duration
	// Head is the bucket number, floor(tick*buckets/Length), of the newest
	// bucket.
	Head int64
	// Counts holds the count of each bucket, oldest first.
	Counts []uint32
}

// Total returns the sum of the counts.
func (w Window) Total() int {
	n := 0
	for _, c := range w.Counts {
		n += int(c)
	}
	return n
}

// windowVersion is the first byte of an encoded Window.
const windowVersion = 1

// MarshalBinary encodes the window: version 1, then as uvarints the
// length in nanoseconds, the head, the number of counts and each count.
func (w Window) MarshalBinary() ([]byte, error) {
	return w.AppendBinary(nil)
}

// AppendBinary appends the encoding of MarshalBinary to b.
func (w Window) AppendBinary(b []byte) ([]byte, error) {
	if err := w.validate(); err != nil {
		return nil, err
	}
	return appendWindow(b, w.Length, w.Head, windowCounts(w.Counts)), nil
}

// counts are a window's bucket counts, oldest first, as appendWindow
// reads them: a Window's, or a table record's (recCounts).
type counts interface {
	len() int
	at(i int) uint64
}

type windowCounts []uint32

func (c windowCounts) len() int        { return len(c) }
func (c windowCounts) at(i int) uint64 { return uint64(c[i]) }

// appendWindow is the one encoder of a window (MarshalBinary's format):
// version 1, then as uvarints the length in nanoseconds, the head, the
// number of counts and each count.
func appendWindow[C counts](b []byte, length time.Duration, head int64, c C) []byte {
	b = append(b, windowVersion)
	b = binary.AppendUvarint(b, uint64(length))
	b = binary.AppendUvarint(b, uint64(head))
	n := c.len()
	b = binary.AppendUvarint(b, uint64(n))
	for i := range n {
		b = binary.AppendUvarint(b, c.at(i))
	}
	return b
}

// maxTick is the latest tick; heads beyond its bucket would overflow the
// bucket arithmetic.
const maxTick = Tick(1<<63 - 1)

func (w Window) validate() error {
	switch {
	case w.Length < MinBucketWidth || w.Length > MaxWindow:
		return fmt.Errorf("%w: length %s out of range", ErrBadSnapshot, w.Length)
	case len(w.Counts) < 2 || len(w.Counts) > MaxBuckets+1:
		return fmt.Errorf("%w: %d counts, want 2..%d", ErrBadSnapshot, len(w.Counts), MaxBuckets+1)
	case w.Length/time.Duration(len(w.Counts)-1) < MinBucketWidth:
		return fmt.Errorf("%w: %d buckets of %s are shorter than %s", ErrBadSnapshot, len(w.Counts)-1, w.Length, MinBucketWidth)
	}
	if w.Head < 0 || w.Head >= bucketOf(maxTick, len(w.Counts)-1, w.Length) {
		return fmt.Errorf("%w: head %d out of range", ErrBadSnapshot, w.Head)
	}
	total := 0
	for _, c := range w.Counts {
		total += int(c)
	}
	if total > MaxLimit {
		return fmt.Errorf("%w: total %d above %d", ErrBadSnapshot, total, MaxLimit)
	}
	return nil
}

// UnmarshalBinary decodes a window encoded by MarshalBinary. Unknown
// versions, truncated or trailing bytes and out-of-range values are
// errors wrapping ErrBadSnapshot; w is unchanged on error.
func (w *Window) UnmarshalBinary(b []byte) error {
	var buf [MaxBuckets + 1]uint32
	out, err := decodeWindow(b, buf[:])
	if err != nil {
		return err
	}
	out.Counts = append([]uint32(nil), out.Counts...)
	*w = out
	return nil
}

// decodeWindow decodes b with its counts in buf, which must hold
// MaxBuckets+1 counts; the result's Counts aliases buf.
func decodeWindow(b []byte, buf []uint32) (Window, error) {
	if len(b) == 0 {
		return Window{}, fmt.Errorf("%w: empty", ErrBadSnapshot)
	}
	if b[0] != windowVersion {
		return Window{}, fmt.Errorf("%w: unknown version %d", ErrBadSnapshot, b[0])
	}
	b = b[1:]
	var fields [3]uint64 // length, head, number of counts
	for i, what := range [...]string{"length", "head", "count"} {
		v, n := uvarint(b)
		if n <= 0 {
			return Window{}, fmt.Errorf("%w: truncated or malformed %s", ErrBadSnapshot, what)
		}
		fields[i], b = v, b[n:]
	}
	length, head, n := fields[0], fields[1], fields[2]
	if n < 2 || n > MaxBuckets+1 {
		return Window{}, fmt.Errorf("%w: %d counts, want 2..%d", ErrBadSnapshot, n, MaxBuckets+1)
	}
	if length > uint64(MaxWindow) || head > 1<<62 {
		return Window{}, fmt.Errorf("%w: length or head out of range", ErrBadSnapshot)
	}
	w := Window{Length: time.Duration(length), Head: int64(head), Counts: buf[:n]}
	for i := range w.Counts {
		c, k := uvarint(b)
		if k <= 0 {
			return Window{}, fmt.Errorf("%w: truncated or malformed bucket count", ErrBadSnapshot)
		}
		if c > MaxLimit {
			return Window{}, fmt.Errorf("%w: bucket count %d above %d", ErrBadSnapshot, c, MaxLimit)
		}
		w.Counts[i], b = uint32(c), b[k:]
	}
	if len(b) != 0 {
		return Window{}, fmt.Errorf("%w: %d trailing bytes", ErrBadSnapshot, len(b))
	}
	if err := w.validate(); err != nil {
		return Window{}, err
	}
	return w, nil
}

// Snapshot returns a copy of the device's window, if it has one.
func (t *Table) Snapshot(device string) (Window, bool) {
	s, h := t.shardOfKey(device)
	s.mu.Lock()
	defer s.mu.Unlock()
	ref, ok := s.index.get(device, h)
	if !ok {
		return Window{}, false
	}
	return snapshotRec(s.rec(ref), t.buckets), true
}

func snapshotRec(r rec, buckets int) Window {
	slots := buckets + 1
	w := Window{Length: r.length(), Head: r.head(), Counts: make([]uint32, slots)}
	for pos := range w.Counts {
		w.Counts[pos] = uint32(r.countAt(pos, slots))
	}
	return w
}

// Restore replaces the device's window with w. A window cut into another
// number of buckets than the table's is converted conservatively: all its
// counts move to the table's bucket holding the end of w's newest bucket,
// so they expire no earlier than they would have. The restored window
// counts as stored and not dirty (see Collect).
func (t *Table) Restore(device string, w Window) error {
	if err := validKey(device); err != nil {
		return err
	}
	if err := w.validate(); err != nil {
		return err
	}
	t.restore(device, w)
	return nil
}

// RestoreBinary is Restore of a window encoded by MarshalBinary (or
// handed out by Collect), without allocating for the counts.
func (t *Table) RestoreBinary(device string, enc []byte) error {
	if err := validKey(device); err != nil {
		return err
	}
	var buf [MaxBuckets + 1]uint32
	w, err := decodeWindow(enc, buf[:])
	if err != nil {
		return err
	}
	t.restore(device, w)
	return nil
}

// restore installs the valid window w.
func (t *Table) restore(device string, w Window) {
	total := w.Total()
	s, h := t.shardOfKey(device)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.index.find(device, h); i >= 0 {
		s.evict(i)
	}
	if total == 0 {
		return
	}
	r, _, _ := s.lookup(device, h, total, true)
	r.setFlags(flagStored)
	slots := t.buckets + 1
	r.setLength(w.Length)
	r.setTotal(total)
	if len(w.Counts) == slots {
		r.setHead(w.Head)
		for i, c := range w.Counts {
			if k := w.Head - int64(slots-1) + int64(i); k >= 0 {
				r.setCount(int(k%int64(slots)), int(c))
			}
		}
		return
	}
	end := bucketStart(w.Head+1, len(w.Counts)-1, w.Length) - 1
	head := bucketOf(end, t.buckets, w.Length)
	r.setHead(head)
	r.setCount(int(head%int64(slots)), total)
}

// uvarint is binary.Uvarint that also refuses an encoding longer than
// the value needs (n == 0 then, as for a truncated one), so a window's
// snapshot has exactly one form. (internal/varint does the same for the
// other packages' records; devicelimit imports nothing of ours.)
func uvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 0 && n != max(1, (bits.Len64(v)+6)/7) {
		return 0, 0
	}
	return v, n
}
