package devicelimit

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"
)

// Several windows per quota. A quota may hold up to MaxWindows limits,
// each "at most N messages" or "at most N bytes" in any interval of its
// window; a message is admitted only when every window admits it, and
// then counted in every one (a refused message is counted in none).
// Each window is a window record of its own in the device's shard, so
// one lock covers them all: the decision is atomic, and each window
// keeps the invariant of window.go on its own. A byte window counts a
// message's size in its bucket instead of 1.
//
// The windows of a device are keyed by the device ID and the window's
// place: the quota's first message window in the device's own quota is
// the device's key itself (so windows stored by a gateway that knew one
// window per device are found again), the others the device ID, a NUL
// (an MQTT string holds none), the class name, a NUL, 'm' or 'b' and the
// window's number among those of its unit ("dev\x00\x00m1",
// "dev\x00alarms\x00b0"). A window whose length changes is re-cut, as a
// single one is (window.go); one whose unit changes is another window.

// Unit is what a window counts.
type Unit uint8

// The units.
const (
	Messages Unit = iota
	Bytes
)

// String returns the unit's configuration name.
func (u Unit) String() string {
	if u == Bytes {
		return "bytes"
	}
	return "messages"
}

const (
	// MaxWindows bounds the windows of one quota: memory per device
	// grows with them.
	MaxWindows = 4
	// MaxBytes is the largest byte limit: a byte window's counters are
	// 4 bytes wide.
	MaxBytes = (1<<32 - 1) & math.MaxInt // 2 GiB - 1 where int is 32 bits (linux/arm)
)

// Limit is one window of a quota: at most N messages (or bytes) in any
// interval of length Window.
type Limit struct {
	Unit   Unit
	N      int
	Window time.Duration
}

// String formats the limit as "10 messages/1m0s".
func (l Limit) String() string { return fmt.Sprintf("%d %s/%s", l.N, l.Unit, l.Window) }

// Validate reports whether l can be enforced by a table with the given
// bucket count; the error names the field and the value.
func (l Limit) Validate(buckets int) error {
	if l.Unit > Bytes {
		return &FieldError{Field: "unit", Msg: fmt.Sprintf("must be messages or bytes (got %d)", l.Unit), Err: ErrInvalidQuota}
	}
	if l.Unit == Bytes {
		if l.N < 1 || l.N > MaxBytes {
			return &FieldError{Field: "bytes", Msg: fmt.Sprintf("must be between 1 and %d (got %d)", MaxBytes, l.N), Err: ErrInvalidQuota}
		}
		l.N = 1 // the rest is checked as for messages
	}
	return Quota{Limit: l.N, Window: l.Window}.Validate(buckets)
}

// ValidateLimits checks the windows of one quota: 1 to MaxWindows, each
// valid; the error names the window's place ("windows[1].bytes").
func ValidateLimits(ls []Limit, buckets int) error {
	if len(ls) < 1 || len(ls) > MaxWindows {
		return &FieldError{Field: "windows", Msg: fmt.Sprintf("must hold 1 to %d windows (got %d)", MaxWindows, len(ls)), Err: ErrInvalidQuota}
	}
	for i, l := range ls {
		if err := l.Validate(buckets); err != nil {
			if fe, ok := err.(*FieldError); ok {
				return &FieldError{Field: fmt.Sprintf("windows[%d].%s", i, fe.Field), Msg: fe.Msg, Err: fe.Err}
			}
			return err
		}
	}
	return nil
}

// AppendLimits appends the encoding of ls that the data file's records
// use (persist's overrides, the broker's deferred messages): the count
// as one byte, then per window its unit as one byte and its limit and
// length in nanoseconds as uvarints.
func AppendLimits(b []byte, ls []Limit) []byte {
	b = append(b, byte(len(ls)))
	for _, l := range ls {
		b = append(b, byte(l.Unit))
		b = binary.AppendUvarint(b, uint64(l.N))
		b = binary.AppendUvarint(b, uint64(l.Window))
	}
	return b
}

// Verdict is the outcome of AllowAllAt: the message's fate and each
// window's decision. A value: returning it allocates nothing.
type Verdict struct {
	// Allowed reports whether every window admitted the message and it
	// was counted in each.
	Allowed bool
	// RetryAfter is, when refused, how long until every window admits
	// it: the latest of the refusing windows' (counts only expire while
	// nothing is admitted, so this is exact).
	RetryAfter time.Duration
	// TooLarge reports a message larger than one of the byte windows
	// can ever admit: no retry admits it.
	TooLarge bool
	// Refused is the place of the window that refuses it longest (the
	// first too small for it, when TooLarge); -1 when allowed.
	Refused int
	// Windows are the windows' decisions, in the quota's order (for a
	// byte window, Count, Limit and Remaining are bytes).
	Windows [MaxWindows]Decision
	// N is the number of windows.
	N int
	// Lease is Decision.Lease: the latest lease batch of the windows
	// that admitted the message.
	Lease uint32
}

// TooLargeVerdict returns the verdict on a message of size bytes that
// one of the byte windows ls can never admit, and whether there is one:
// refused as too large by the first such window, nothing counted.
func TooLargeVerdict(ls []Limit, size int) (Verdict, bool) {
	for i, l := range ls {
		if l.Unit == Bytes && size > l.N {
			v := Verdict{TooLarge: true, Refused: i, N: len(ls)}
			v.Windows[i] = Decision{Limit: l.N, Remaining: l.N, Unit: Bytes}
			return v, true
		}
	}
	return Verdict{}, false
}

// AllowQuotaAt decides whether device may publish a message of size
// bytes at now under q: against q's windows when it has several
// (AllowAllAt; the decision's Count, Limit and Remaining are the
// refusing window's, or the first's when admitted), its one window
// otherwise (AllowAt).
func (t *Table) AllowQuotaAt(device string, q Quota, size int, now Tick) Decision {
	if q.NWindows == 0 {
		return t.AllowAt(device, q, now)
	}
	return t.decideAll(device, "", q.Windows[:min(max(q.NWindows, 0), MaxWindows)], size, now, true, !q.Shadow).Decision()
}

// Decision sums the verdict up as one window's decision: the refusing
// window's (the first's when admitted), with the verdict's RetryAfter
// and TooLarge.
func (v Verdict) Decision() Decision {
	d := v.Windows[max(v.Refused, 0)]
	d.Allowed, d.RetryAfter, d.TooLarge, d.Lease = v.Allowed, v.RetryAfter, v.TooLarge, v.Lease
	return d
}

// AllowAllAt decides whether device may publish a message of size bytes
// at now under the windows ls of class (the device's own quota when
// empty; a topic class's otherwise), and counts it in every window when
// all admit it. ls must be valid (ValidateLimits); invalid windows
// refuse. It allocates nothing once the device has its windows. Its
// windows take leases (a table with leases) unless class names a
// counter that is not quota (a NUL first).
func (t *Table) AllowAllAt(device, class string, ls []Limit, size int, now Tick) Verdict {
	return t.decideAll(device, class, ls, size, now, true, true)
}

// PeekAllAt returns the verdict AllowAllAt would give (Allowed: it would
// admit the message), changing nothing.
func (t *Table) PeekAllAt(device, class string, ls []Limit, size int, now Tick) Verdict {
	return t.decideAll(device, class, ls, size, now, false, false)
}

// decideAll is AllowAllAt (count) or PeekAllAt; the windows take leases
// when lease is set (not a quota in shadow mode), class is quota and
// the table has leases.
func (t *Table) decideAll(device, class string, ls []Limit, size int, now Tick, count, lease bool) Verdict {
	if bad := t.invalidLimit(ls); bad != -1 {
		if bad == -2 {
			return Verdict{}
		}
		return Verdict{Refused: bad, N: len(ls)}
	}
	s, _ := t.shard(device)
	p := part{s: s, stem: device, class: class, lease: lease && t.lease.on && !noLease(class)}
	s.mu.Lock()
	// One window decides and counts at once; several are first decided,
	// then counted in when all admit.
	commit := count && len(ls) == 1
	if t.prepare(&p, ls, size, now, count, commit) && count && !commit {
		t.commit(&p, ls, size, now)
	}
	s.mu.Unlock()
	return p.verdict()
}

// invalidLimit returns the place of the first window of ls a decision
// must refuse, -2 when ls holds none or too many, -1 when all are valid.
func (t *Table) invalidLimit(ls []Limit) int {
	if len(ls) < 1 || len(ls) > MaxWindows {
		return -2
	}
	for i, l := range ls {
		top := MaxLimit
		if l.Unit == Bytes {
			top = MaxBytes
		}
		if l.N < 1 || l.N > top || l.Window < t.minWindow || l.Window > MaxWindow || l.Unit > Bytes {
			return i
		}
	}
	return -1
}

// part is the windows of one stem (a device, or a group's key) in one
// class, in shard s, as a decision goes through them: their verdict so
// far, and their records' refs once prepared. (The windows themselves
// are passed apart: the stem may be kept as a new window's key, and a
// struct's fields escape together.)
type part struct {
	s           *shard
	stem, class string
	v           Verdict
	refs        [MaxWindows]uint32
	allowed     bool
	lease       bool // its windows take leases
}

// prepare decides the message on p's windows ls (s.mu held) and
// reports whether all admit it; commit counts it at once (one window
// only: several are counted by commit once all admit).
func (t *Table) prepare(p *part, ls []Limit, size int, now Tick, count, commit bool) bool {
	p.v = Verdict{Refused: 0, N: len(ls)}
	allowed := true
	var seen [2]int // windows of each unit so far
	for i, l := range ls {
		n := l.Units(size)
		key := p.s.windowKey(p.stem, p.class, l.Unit, seen[l.Unit])
		seen[l.Unit]++
		if n > l.N {
			p.v.Windows[i] = Decision{Limit: l.N, Remaining: l.N, Unit: l.Unit}
			if !p.v.TooLarge {
				p.v.TooLarge, p.v.Refused = true, i
			}
			allowed = false
			continue
		}
		d, ref := t.decideKey(p.s, key, l, n, now, count, commit)
		if d.Allowed && commit && p.lease {
			p.v.Lease = newerLease(p.v.Lease, t.leaseAdmit(p.s, p.s.rec(ref), ref, key, l, n))
		}
		d.Unit = l.Unit
		p.v.Windows[i], p.refs[i] = d, ref
		if d.RetryAfter > 0 { // a refusal always has one (window.go)
			allowed = false
			if !p.v.TooLarge && d.RetryAfter >= p.v.RetryAfter {
				p.v.RetryAfter, p.v.Refused = d.RetryAfter, i
			}
		}
	}
	p.allowed = allowed
	return allowed
}

// commit counts the message in every window of p, prepared (s.mu held;
// the records found again by ref: creating one may move the others'
// bytes, never their refs).
func (t *Table) commit(p *part, ls []Limit, size int, now Tick) {
	var seen [2]int
	for i, l := range ls {
		r := p.s.rec(p.refs[i])
		p.v.Windows[i] = r.decideN(l, now, &p.s.cut, l.Units(size), true)
		p.v.Windows[i].Unit = l.Unit
		if r.flags()&flagDirty == 0 || p.lease {
			key := p.s.windowKey(p.stem, p.class, l.Unit, seen[l.Unit])
			if r.flags()&flagDirty == 0 {
				p.s.markDirty(r, key)
			}
			if p.lease {
				p.v.Lease = newerLease(p.v.Lease, t.leaseAdmit(p.s, r, p.refs[i], key, l, l.Units(size)))
			}
		}
		seen[l.Unit]++
	}
}

// verdict returns p's verdict, Allowed when every window admitted.
func (p *part) verdict() Verdict {
	v := p.v
	if p.allowed {
		v.Allowed, v.Refused, v.RetryAfter = true, -1, 0
	}
	return v
}

// windowKey returns the key of device's window number k of unit u in
// class, in the shard's key buffer: valid until the next call, under
// s.mu. The device's own first message window is the device's key.
func (s *shard) windowKey(device, class string, u Unit, k int) string {
	if OwnWindow(class, u, k) {
		return device
	}
	b := AppendWindowKey(s.keyBuf[:0], device, class, u, k)
	s.keyBuf = b
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// OwnWindow reports whether window k of unit u in class is a device's
// own first message window, whose key is the device's.
func OwnWindow(class string, u Unit, k int) bool {
	return class == "" && u == Messages && k == 0
}

// AppendWindowKey appends to b the key of device's window number k of
// unit u in class ("" for its own quota): device itself for its own
// first message window, else device, a NUL, the class, a NUL, 'm' or
// 'b' and k. A device ID and a class name hold no NUL, so no two
// windows share a key. device may be any stem that names the device
// (cluster's Redis key, for one).
func AppendWindowKey(b []byte, device, class string, u Unit, k int) []byte {
	b = append(b, device...)
	if OwnWindow(class, u, k) {
		return b
	}
	b = append(b, 0)
	b = append(b, class...)
	return append(b, 0, "mb"[u], byte('0'+k))
}

// inBuffer reports whether key lives in the shard's key buffer
// (windowKey), not in the caller's device ID.
func inBuffer(s *shard, key string) bool {
	return len(s.keyBuf) > 0 && unsafe.StringData(key) == unsafe.SliceData(s.keyBuf)
}

// validKey checks a window's key: a device ID, or one followed by a
// NUL and at most 300 bytes naming another of its windows.
func validKey(key string) error {
	device, rest := key, ""
	if i := stemEnd(key); i >= 0 {
		device, rest = key[:i], key[i+1:]
	}
	if name, ok := GroupOfKey(device); ok {
		device = name // a group's windows
	}
	if len(rest) > 300 {
		return &FieldError{Field: "device", Msg: fmt.Sprintf("a window key's suffix must be at most 300 bytes (got %d)", len(rest)), Err: ErrInvalidDevice}
	}
	return ValidDeviceID(device)
}

// Units is what a message of size payload bytes counts in window l: 1
// in a message window, its bytes in a byte window.
func (l Limit) Units(size int) int {
	if l.Unit == Bytes {
		return max(size, 0)
	}
	return 1
}

// decideKey decides on the window under key (s.mu held) for a message
// counting n: on a copy when count is not set (a read changes nothing),
// on the window itself otherwise, creating it, and counting only when
// commit is set. It returns the window's ref when count is set.
func (t *Table) decideKey(s *shard, key string, q Limit, n int, now Tick, count, commit bool) (Decision, uint32) {
	h := hashString(key)
	var r rec
	var ref uint32
	var ok bool
	if count {
		if inBuffer(s, key) && s.index.find(key, h) < 0 {
			key = strings.Clone(key) // the new record keeps it
		}
		r, ref, ok = s.lookup(key, h, q.N, true)
	} else {
		r, ok = s.peekCopy(key, h, q.N)
	}
	if !ok {
		return Decision{Limit: q.N, Remaining: q.N}, 0
	}
	d := r.decideN(q, now, &s.cut, n, commit)
	if count && d.Allowed && r.flags()&flagDirty == 0 {
		s.markDirty(r, key)
	}
	return d, ref
}

// markDirty flags a window changed since the last Collect (see
// shard.dirty); key may live in the key buffer.
func (s *shard) markDirty(r rec, key string) {
	r.setFlags(r.flags() | flagDirty)
	if s.collected {
		s.dirty = append(s.dirty, strings.Clone(key))
	}
}
