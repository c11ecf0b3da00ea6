package devicelimit

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Leases pay for crashes. A table that forgets what it admitted since
// its last snapshot must not let a device have more than its quota
// after a crash, yet must not charge every device a whole window for
// it either. With leases on (EnableLeases), every window counts its
// admissions (adm) and holds a cap: an admission is acted on (acked,
// forwarded) only once a durable record says the window may have
// admitted up to cap. Admissions below a cap already durable need no
// write; a window with less than half a lease left (rounded up: at a
// lease of 1, none) asks for the next one (cap = adm + L) early, so a
// steady publisher rarely waits for it; the store writes the caps asked
// since its last write in one group commit (TakeLeases, LeasesDurable),
// each with the window's counts and adm as they are then, at once when
// an admission waits for one (LeaseWake), else when it likes
// (LeaseAsked): a fleet of quiet devices' early asks go in one write. A snapshot records, with each window's counts, the
// adm they hold (CollectLeases). After a crash, a window is restored
// from the newer of the two and charged cap minus the adm they hold:
// the admissions its open lease could have made beyond them, never
// more than one lease (SettleLease, crashcharge.go).
// A window without an open lease is charged nothing, and a lease closes
// once its window admitted nothing through idleLimit snapshots (the
// unused rest of it is given up: the next admission takes a new lease).
//
// adm and cap are counted per incarnation of a window record (inc,
// unique in the table): a window evicted and made again starts over,
// and a store keeps for each window the highest (inc, cap) and (inc,
// recorded) it was given, in whatever order the writes land.

// LeasePolicy sizes the lease of a window of N: Share of N, at least
// Min and at most Max messages for a message window; Share of N bytes
// for a byte window. A lease always covers the message that takes it
// and never exceeds N. The zero value is invalid; see DefaultLeasePolicy.
type LeasePolicy struct {
	Share    float64
	Min, Max int
}

// DefaultLeasePolicy is a tenth of the window, from 1 to 1000 messages.
var DefaultLeasePolicy = LeasePolicy{Share: 0.1, Min: 1, Max: 1000}

// Validate reports whether p can size leases; the error names the field.
func (p LeasePolicy) Validate() error {
	switch {
	case !(p.Share > 0 && p.Share <= 1):
		return &FieldError{Field: "share", Msg: fmt.Sprintf("must be above 0 and at most 1 (got %v)", p.Share), Err: ErrInvalidQuota}
	case p.Min < 1 || p.Min > MaxLimit:
		return &FieldError{Field: "min", Msg: fmt.Sprintf("must be between 1 and %d (got %d)", MaxLimit, p.Min), Err: ErrInvalidQuota}
	case p.Max < p.Min || p.Max > MaxLimit:
		return &FieldError{Field: "max", Msg: fmt.Sprintf("must be between min (%d) and %d (got %d)", p.Min, MaxLimit, p.Max), Err: ErrInvalidQuota}
	}
	return nil
}

// Size returns the lease of window l for a message counting n there.
func (p LeasePolicy) Size(l Limit, n int) int {
	s := int(float64(l.N) * p.Share)
	if l.Unit == Messages {
		s = min(max(s, p.Min), p.Max)
	}
	return min(max(s, n, 1), max(l.N, n))
}

// lease is a window record's lease state (see above); a slab keeps one
// per record when the table has leases.
type lease struct {
	adm  uint64 // units admitted in this incarnation
	cap  uint64 // units the window may admit under its leases
	dcap uint64 // the cap known durable
	inc  uint64 // the incarnation; 0: no lease taken yet
	gen  uint64 // the batch of the latest cap asked
	// idle counts the collections in a row that found the window with
	// an open lease and no admission since the one before.
	idle uint32
	// charge is what a crash charged the window (crashcharge.go), in
	// the bucket whose number's low 32 bits are chargeBucket (a lease
	// stays 48 bytes).
	charge, chargeBucket uint32
}

// idleCollects is the fewest collections in a row that must find a
// window's lease open and unused before they close it: about 10 s at
// the default snapshot interval. Once the table knows how often it is
// collected (SetCollectInterval), a window waits two of its lengths
// when that is longer, at most maxIdleCollects collections (idleLimit).
// A device sending less often than that takes a lease (and waits for
// its write) for nearly every message; one sending more often keeps its
// lease, and a crash may charge it the rest although it was not
// publishing at that moment. The window's length is the device's own
// time scale: make bench-lease's fleet at random gaps (a mean of 5 s on
// a window of 10 s) waited for a lease at 10,170 publishes a run with
// 10 collections, at 1,680 with 20 (docs/durability.md).
const idleCollects = 10

// maxIdleCollects bounds idleLimit: a minute at the default snapshot
// interval, the longest a silent device stays at risk of a crash's
// charge.
const maxIdleCollects = 60

// leases is a table's lease book-keeping.
type leases struct {
	on     bool
	policy LeasePolicy
	// idleAfter is idleCollects (tests shorten it).
	idleAfter uint32
	// every is how often the table is collected (SetCollectInterval); 0:
	// not known, idleAfter alone closes a lease.
	every atomic.Int64
	inc   atomic.Uint64 // the last incarnation handed out
	// durable is the latest batch written; every cap asked in it or
	// before is durable.
	durable atomic.Uint64
	// waits counts the WaitLease calls that found the lease not durable.
	waits atomic.Uint64

	mu      sync.Mutex
	open    uint64   // the batch being filled
	pending []string // keys of windows whose cap grew in batch open
	spare   []string
	done    chan struct{} // closed when durable grows
	// wake (capacity 1): an admission waits for a lease of pending;
	// asked (capacity 1): pending is not empty.
	wake, asked chan struct{}
}

// EnableLeases makes every window of the table take leases sized by p
// (see above): an admission's Decision then carries the batch its lease
// waits for (Decision.Lease). Call it on a new table, before it holds a
// window. p must be valid.
func (t *Table) EnableLeases(p LeasePolicy) {
	l := &t.lease
	l.on, l.policy, l.open, l.idleAfter = true, p, 1, idleCollects
	l.done = make(chan struct{})
	l.wake = make(chan struct{}, 1)
	l.asked = make(chan struct{}, 1)
	for i := range t.shards {
		s := &t.shards[i]
		for c := range s.slabs {
			s.slabs[c].leased = true
		}
	}
}

// SetCollectInterval tells the table how often CollectLeases runs (the
// snapshot interval), so that a window's lease stays open through two
// of the window's lengths without an admission (idleLimit), not only
// idleCollects collections. persist.NewSnapshotter calls it.
func (t *Table) SetCollectInterval(d time.Duration) { t.lease.every.Store(int64(d)) }

// idleLimit is how many collections in a row that find a window of
// length idle close its lease: idleAfter, or two lengths when the
// collection interval is known and that is longer, at most
// maxIdleCollects.
func (l *leases) idleLimit(length time.Duration) uint32 {
	every := time.Duration(l.every.Load())
	if every <= 0 {
		return l.idleAfter
	}
	return max(l.idleAfter, uint32(min(2*length/every, maxIdleCollects)))
}

// LeaseWaits returns how many times WaitLease found a lease not yet
// durable: the admissions that waited for a lease write before they
// were acted on.
func (t *Table) LeaseWaits() uint64 { return t.lease.waits.Load() }

// Leases reports whether the table takes leases.
func (t *Table) Leases() bool { return t.lease.on }

// LeasePolicy returns the policy given to EnableLeases.
func (t *Table) LeasePolicy() LeasePolicy { return t.lease.policy }

// noLease reports whether the windows of class never take a lease:
// the counters that are not quota (a class whose name starts with a
// NUL, such as the refusals counted toward a block).
func noLease(class string) bool { return len(class) > 0 && class[0] == 0 }

// leaseAdmit counts an admission of n units in the window rec r (ref
// in s, key its key, under s.mu) and returns the batch the admission
// must wait for (0: its lease is durable). It asks for the next lease
// when the window has gone past its cap, or runs low and none is being
// written.
func (t *Table) leaseAdmit(s *shard, r rec, ref uint32, key string, l Limit, n int) uint32 {
	ls := s.lease(ref)
	if f := r.flags(); f&flagIdle != 0 {
		r.setFlags(f &^ flagIdle)
	}
	ls.idle = 0
	ls.adm += uint64(n)
	d := t.lease.durable.Load()
	if ls.gen <= d {
		ls.dcap = ls.cap
	}
	if ls.adm > ls.cap || (ls.gen <= d && ls.cap-ls.adm < (uint64(t.lease.policy.Size(l, n))+1)/2) {
		t.askLease(s, ls, key, l, n)
	}
	if ls.adm <= ls.dcap {
		return 0
	}
	// This admission waits for its lease: the writer goes now.
	select {
	case t.lease.wake <- struct{}{}:
	default:
	}
	if g := uint32(ls.gen); g != 0 {
		return g
	}
	return 1 // batch 1<<32 and its kind: 0 says no wait; wait one more
}

// askLease raises ls's cap to a lease beyond its admissions and queues
// the window for the next write, once per batch: the write takes the
// cap as it is then. No admission waits for it yet (leaseAdmit wakes
// the writer when one does), so the writer may take its time (asked),
// unless the window asked its last lease in one of the latest batches
// (fastAsk): then it is likely to need this one before a lazy write,
// and the writer goes now (wake).
func (t *Table) askLease(s *shard, ls *lease, key string, l Limit, n int) {
	if ls.inc == 0 {
		ls.inc = t.lease.inc.Add(1)
	}
	ls.cap = ls.adm + uint64(t.lease.policy.Size(l, n))
	t.lease.mu.Lock()
	open := t.lease.open
	queued := ls.gen == open
	urgent := !queued && ls.gen != 0 && open-ls.gen <= fastAsk
	if !queued {
		if inBuffer(s, key) {
			key = strings.Clone(key) // the queue keeps it
		}
		ls.gen = open
		t.lease.pending = append(t.lease.pending, key)
	}
	t.lease.mu.Unlock()
	if queued {
		return
	}
	ch := t.lease.asked
	if urgent {
		ch = t.lease.wake
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// fastAsk is how many batches back a window's previous ask makes its
// next urgent: a window asking in consecutive lazy writes uses a lease
// in less time than they are apart.
const fastAsk = 2

// Lease is a window's lease as a store writes it: its incarnation, its
// cap and its length (a window charged after a crash may have no
// snapshot to take the length from), and the window as it is when the
// lease is written: Adm, the units it admitted in this incarnation, and
// Window, its counts (encoded as by Window.MarshalBinary; valid only
// during TakeLeases' call). The counts are what makes the cost of a
// crash one lease: a window restored from them holds every admission
// at the instant it was made, and only the units admitted after the
// write, at most Cap - Adm (one lease), are charged at a later instant
// than their own (SettleLease).
type Lease struct {
	Inc, Cap uint64
	Length   time.Duration
	Adm      uint64
	Window   []byte
}

// LeaseMark is what a snapshot of a window records of its lease: the
// incarnation and the units admitted that the window's counts hold.
// The zero value: the window has no lease.
type LeaseMark struct {
	Inc, Recorded uint64
}

// LeaseWake returns a channel that receives when an admission waits for
// a lease write: write the leases asked now. Nil without leases.
func (t *Table) LeaseWake() <-chan struct{} { return t.lease.wake }

// LeaseAsked returns a channel that receives when leases are asked that
// no admission waits for yet (a window asks for its next lease early):
// they may wait for a later write, which then holds many of them, as
// long as it comes before the windows need them (LeaseWake says when
// one does). Nil without leases.
func (t *Table) LeaseAsked() <-chan struct{} { return t.lease.asked }

// TakeLeases hands the leases asked since the last TakeLeases to fn,
// for a store to write in one transaction, and returns their batch:
// once they are durable, call LeasesDurable(gen). The keys are for
// RequeueLeases when the write fails. fn runs under a shard's lock: it
// must copy and return.
func (t *Table) TakeLeases(fn func(key string, l Lease)) (gen uint64, keys []string) {
	l := &t.lease
	l.mu.Lock()
	gen, keys = l.open, l.pending
	l.pending, l.spare = l.spare[:0], nil
	l.open++
	l.mu.Unlock()
	var buf []byte
	for _, key := range keys {
		s, h := t.shardOfKey(key)
		s.mu.Lock()
		if ref, ok := s.index.get(key, h); ok {
			if ls := s.lease(ref); ls.inc != 0 {
				r := s.rec(ref)
				buf = appendRec(buf[:0], r, t.buckets)
				fn(key, Lease{Inc: ls.inc, Cap: ls.cap, Length: r.length(), Adm: ls.adm, Window: buf})
			}
		}
		s.mu.Unlock()
	}
	return gen, keys
}

// ReleaseLeaseKeys gives back the keys of a TakeLeases whose batch was
// written, for reuse.
func (t *Table) ReleaseLeaseKeys(keys []string) {
	clear(keys)
	t.lease.mu.Lock()
	if t.lease.spare == nil {
		t.lease.spare = keys[:0]
	}
	t.lease.mu.Unlock()
}

// RequeueLeases puts the keys of a batch whose write failed back in the
// next one: its waiters wait for that.
func (t *Table) RequeueLeases(keys []string) {
	l := &t.lease
	l.mu.Lock()
	l.pending = append(l.pending, keys...)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// LeasesDurable records that every lease of batch gen and before is
// durable, and wakes the admissions waiting for them.
func (t *Table) LeasesDurable(gen uint64) {
	l := &t.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen <= l.durable.Load() {
		return
	}
	l.durable.Store(gen)
	close(l.done)
	l.done = make(chan struct{})
}

// LeaseDurable reports whether the lease batch gen (Decision.Lease) is
// durable: 0 always is.
func (t *Table) LeaseDurable(gen uint32) bool {
	return gen == 0 || int32(uint32(t.lease.durable.Load())-gen) >= 0
}

// WaitLease waits until the lease batch gen is durable, or timeout; it
// reports whether it is.
func (t *Table) WaitLease(gen uint32, timeout time.Duration) bool {
	if t.LeaseDurable(gen) {
		return true
	}
	t.lease.waits.Add(1)
	return t.waitLease(gen, timeout)
}

// WaitSessionLease is WaitLease for the batch a Prelease returned: a
// session's start waits, not an admission, so LeaseWaits does not
// count it.
func (t *Table) WaitSessionLease(gen uint32, timeout time.Duration) bool {
	return t.LeaseDurable(gen) || t.waitLease(gen, timeout)
}

// waitLease waits until the lease batch gen is durable, or timeout.
func (t *Table) waitLease(gen uint32, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		t.lease.mu.Lock()
		done := t.lease.done
		t.lease.mu.Unlock()
		if t.LeaseDurable(gen) {
			return true
		}
		select {
		case <-done:
		case <-timer.C:
			return t.LeaseDurable(gen)
		}
	}
}

// newerLease returns the later of two lease batches (0: none).
func newerLease(a, b uint32) uint32 {
	if a == 0 || (b != 0 && int32(b-a) > 0) {
		return b
	}
	return a
}
