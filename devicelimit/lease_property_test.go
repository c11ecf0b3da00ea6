package devicelimit

import (
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// leaseSequences is how many random sequences of admissions, lease
// writes, snapshots and crashes TestPropertyLeasesKeepQuotaAcrossCrashes
// runs.
const leaseSequences = 100_000

// leaseStore is a store as persist keeps one, in memory: window
// snapshots, and per window the highest (inc, cap) a lease write gave
// and the highest (inc, recorded) a snapshot gave, merged as persist
// merges them.
type leaseStore struct {
	windows map[string][]byte
	leases  map[string]storedLease
}

type storedLease struct {
	inc, cap, rec uint64
	length        time.Duration
	adm           uint64
	window        []byte
}

func (st *leaseStore) putLease(key string, l Lease) {
	cur := st.leases[key]
	switch {
	case cur.inc < l.Inc:
		cur = storedLease{inc: l.Inc, cap: l.Cap, length: l.Length}
	case cur.inc == l.Inc:
		cur.cap, cur.length = max(cur.cap, l.Cap), l.Length
	default:
		return
	}
	if l.Adm > cur.adm {
		cur.adm, cur.window = l.Adm, slices.Clone(l.Window)
	}
	st.leases[key] = cur
}

// held is what the store's counts of the window hold of its
// incarnation's admissions: the lease write's or the snapshot's.
func (sl storedLease) held() uint64 {
	if sl.window != nil && sl.adm > sl.rec {
		return sl.adm
	}
	return sl.rec
}

func (sl storedLease) stored() StoredLease {
	return StoredLease{Inc: sl.inc, Cap: sl.cap, Recorded: sl.rec, Length: sl.length, Adm: sl.adm, Window: sl.window}
}

func (st *leaseStore) putMark(key string, m LeaseMark) {
	if m.Inc == 0 {
		return
	}
	cur := st.leases[key]
	switch {
	case cur.inc < m.Inc:
		cur = storedLease{inc: m.Inc, rec: m.Recorded}
	case cur.inc == m.Inc:
		cur.rec = max(cur.rec, m.Recorded)
	default:
		return
	}
	st.leases[key] = cur
}

// admission is one admitted message's count in one window: the
// window's key, the lease incarnation and admission count after it.
type admission struct {
	key      string
	run      int // the crashes before it
	inc, adm uint64
	units    int
	at       Tick
	limitN   int
	limitT   time.Duration
}

type pendingMsg struct {
	lease uint32
	parts []admission
}

// leaseWorld runs one sequence.
type leaseWorld struct {
	t       *testing.T
	r       *rand.Rand
	policy  LeasePolicy
	buckets int
	// idleAfter is the table's idleCollects, short so that sequences
	// close leases.
	idleAfter uint32
	// every is the table's collection interval (SetCollectInterval): 0
	// or a second, so that a lease closes after idleAfter or after two
	// window lengths of idle collections.
	every   time.Duration
	tab     *Table
	st      leaseStore
	now     Tick
	pending []pendingMsg
	acted   []admission
	crashes int
	// leaseMax is, per window, the most a lease of it may be: under
	// the largest quota it was decided or leased at connect under.
	leaseMax map[string]int
	// trace, unless nil, gets a line per event (tracef).
	trace io.Writer
}

// tracef writes a line of the sequence's events to w.trace: the same
// seed must give the same lines (TestLeaseSequencesReplay). Call it
// only when w.trace is set: its arguments cost an allocation each.
func (w *leaseWorld) tracef(format string, args ...any) {
	fmt.Fprintf(w.trace, format+"\n", args...)
}

// newTable starts a table as a new process would, reusing the last
// one's memory (making 256 shards a crash cost the test most of its
// time).
func (w *leaseWorld) newTable() {
	tab := w.tab
	if tab == nil || tab.buckets != w.buckets {
		var err error
		if tab, err = NewTable(w.buckets); err != nil {
			w.t.Fatal(err)
		}
	}
	for i := range tab.shards {
		s := &tab.shards[i]
		if s.index.n == 0 && len(s.dirty) == 0 && len(s.gone) == 0 && !s.collected {
			continue
		}
		slabs := s.slabs
		s.init(w.buckets + 1)
		for c := range s.slabs {
			s.slabs[c].data = slabs[c].data[:0]
			s.slabs[c].leases = slabs[c].leases[:0]
		}
		s.dirty, s.gone, s.collected = s.dirty[:0], s.gone[:0], false
	}
	tab.lease = leases{}
	tab.EnableLeases(w.policy)
	tab.lease.idleAfter = w.idleAfter
	tab.lease.every.Store(int64(w.every))
	w.tab = tab
}

// parts reads the lease state of the windows a message was counted in.
func (w *leaseWorld) parts(stem, class string, ls []Limit, size int) []admission {
	var out []admission
	var seen [2]int
	for _, l := range ls {
		key := string(AppendWindowKey(nil, stem, class, l.Unit, seen[l.Unit]))
		seen[l.Unit]++
		s, h := w.tab.shardOfKey(key)
		s.mu.Lock()
		ref, ok := s.index.get(key, h)
		if !ok {
			s.mu.Unlock()
			w.t.Fatalf("admitted in %q without a window", key)
		}
		ls := *s.lease(ref)
		s.mu.Unlock()
		out = append(out, admission{key: key, run: w.crashes, inc: ls.inc, adm: ls.adm, units: l.Units(size), at: w.now,
			limitN: l.N, limitT: l.Window})
		w.leaseMax[key] = max(w.leaseMax[key], w.policy.Size(l, 64))
	}
	return out
}

func (w *leaseWorld) act(all bool) {
	kept := w.pending[:0]
	for _, p := range w.pending {
		if w.tab.LeaseDurable(p.lease) {
			w.acted = append(w.acted, p.parts...)
		} else if !all {
			kept = append(kept, p)
		}
	}
	w.pending = kept
	if all {
		w.pending = w.pending[:0]
	}
}

func (w *leaseWorld) writeLeases(apply bool) {
	gen, keys := w.tab.TakeLeases(func(key string, l Lease) {
		if w.trace != nil {
			w.tracef("lease %q %+v", key, l)
		}
		if apply {
			w.st.putLease(key, l)
		}
	})
	if w.trace != nil {
		w.tracef("lease batch %d written %v", gen, apply)
	}
	if apply {
		w.tab.LeasesDurable(gen)
	} else {
		w.tab.RequeueLeases(keys)
	}
}

type leaseCollected struct {
	key string
	enc []byte
	m   LeaseMark
}

// snapshot collects and applies the first keep changes (all when keep
// < 0), each window with its mark, as one transaction each does. When
// it keeps some, they are the first in a random order of their windows
// (a window's changes in the order the table handed them), not in the
// table's order: that is by shard, and a window's shard follows its
// hash, random per process (hash.go), which must not choose what a
// crash keeps (the seed replays the run, TestLeaseSequencesReplay).
func (w *leaseWorld) snapshot(keep int) {
	var cs []leaseCollected
	w.tab.CollectLeases(func(key string, enc []byte, m LeaseMark) {
		cs = append(cs, leaseCollected{key, slices.Clone(enc), m})
	})
	slices.SortStableFunc(cs, func(a, b leaseCollected) int { return strings.Compare(a.key, b.key) })
	if w.trace != nil {
		for _, c := range cs {
			w.tracef("collected %q %x %+v", c.key, c.enc, c.m)
		}
	}
	if keep < 0 || keep > len(cs) {
		keep = len(cs)
	}
	if keep < len(cs) {
		var keys []string
		for i, c := range cs {
			if i == 0 || c.key != cs[i-1].key {
				keys = append(keys, c.key)
			}
		}
		w.r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		slices.SortStableFunc(cs, func(a, b leaseCollected) int {
			return slices.Index(keys, a.key) - slices.Index(keys, b.key)
		})
		if w.trace != nil {
			w.tracef("snapshot cut after %d of %q", keep, keys)
		}
	}
	for _, c := range cs[:keep] {
		if c.enc == nil {
			delete(w.st.windows, c.key)
			if sl, ok := w.st.leases[c.key]; ok && sl.inc <= c.m.Inc {
				sl.rec, sl.adm, sl.window = max(sl.rec, sl.adm), 0, nil // as persist does: the counts are gone
				w.st.leases[c.key] = sl
			}
			continue
		}
		w.st.windows[c.key] = c.enc
		w.st.putMark(c.key, c.m)
	}
}

// crash loses the table and what waits for a lease, then starts again
// as the gateway does: restore, charge each open lease at the crash's
// instant, write the charged windows, clear the leases.
func (w *leaseWorld) crash() {
	defer func() { w.crashes++ }()
	// What each window lost, per incarnation of its lease.
	for _, key := range slices.Sorted(maps.Keys(w.st.leases)) {
		sl := w.st.leases[key]
		charge := uint64(0)
		if sl.cap > sl.held() {
			charge = sl.cap - sl.held()
		}
		lost, waiting, bound := 0, 0, w.leaseMax[key]
		for _, a := range w.acted {
			if a.key == key && a.run == w.crashes && a.inc == sl.inc && a.adm > sl.held() {
				lost += a.units
			}
		}
		for _, p := range w.pending {
			for _, a := range p.parts {
				if a.key == key && a.inc == sl.inc {
					waiting += a.units
				}
			}
		}
		if w.trace != nil {
			w.tracef("crash %d: %q stored %+v charge %d lost %d waiting %d", w.crashes, key, sl, charge, lost, waiting)
		}
		if uint64(lost) > charge {
			w.t.Fatalf("crash %d: window %q lost %d acted units, charged %d (lease %+v)", w.crashes, key, lost, charge, sl)
		}
		if int(charge)-lost > bound+waiting {
			var mem lease
			s, h := w.tab.shardOfKey(key)
			if ref, ok := s.index.get(key, h); ok {
				mem = *s.lease(ref)
			}
			w.t.Fatalf("crash %d: window %q charged %d for %d lost: more than a lease (%d) and %d waiting (stored %+v, memory %+v)", w.crashes, key, charge, lost, bound, waiting, sl, mem)
		}
	}
	// Restarted after up to a second, charged at a bound of the
	// crash's instant up to two seconds after it (the gateway's
	// high-water plus two snapshot intervals).
	w.restart(time.Duration(w.r.IntN(3))*time.Second/2, w.now.Add(time.Duration(w.r.IntN(5))*time.Second/2))
}

func TestPropertyLeasesKeepQuotaAcrossCrashes(t *testing.T) {
	tabs := map[int]*Table{}
	n := leaseSequences
	if raceScale > 1 {
		n /= 50 // the race detector makes a sequence 50 times slower here
	}
	forEachSeq(t, 28, n, func(seq int, r *rand.Rand) {
		w := leaseSequence(t, r, tabs, nil)
		checkActed(t, seq, w.acted)
	})
}

// leaseSequence runs one random sequence of
// TestPropertyLeasesKeepQuotaAcrossCrashes on a table of tabs (or a new
// one), writing its events to trace unless nil, and returns its world.
func leaseSequence(t *testing.T, r *rand.Rand, tabs map[int]*Table, trace io.Writer) *leaseWorld {
	buckets := 2 + r.IntN(6)
	w := &leaseWorld{t: t, r: r, buckets: buckets, tab: tabs[buckets], idleAfter: uint32(1 + r.IntN(3)), every: time.Duration(r.IntN(2)) * time.Second,
		policy: LeasePolicy{Share: []float64{0.05, 0.2, 0.5, 1}[r.IntN(4)], Min: 1 + r.IntN(2), Max: 2 + r.IntN(8)},
		st:     leaseStore{windows: map[string][]byte{}, leases: map[string]storedLease{}},
		now:    t0, leaseMax: map[string]int{}, trace: trace}
	w.newTable()
	defer func() { tabs[buckets] = w.tab }()
	// The quotas: one or two windows for the devices, in their own
	// quota or a class; a group's window above them, or none.
	window := func() time.Duration { return time.Duration(1+r.IntN(4)) * time.Second }
	var dq Quota
	dq.NWindows = 1 + r.IntN(2)
	dq.Windows[0] = Limit{Unit: Messages, N: 1 + r.IntN(12), Window: window()}
	if dq.NWindows == 2 {
		dq.Windows[1] = Limit{Unit: Bytes, N: 64 + r.IntN(300), Window: window()}
	}
	class := []string{"", "alarms"}[r.IntN(2)]
	group := r.IntN(3) == 0
	gq := Quota{Limit: 2 + r.IntN(15), Window: window()}
	groupKey := GroupKey("g")
	var one [1]Limit
	gls := limitsInto(gq, &one)
	dls := dq.Windows[:dq.NWindows]
	// The quota of a rule a reload removed between a device's
	// connect and its first publish: the connect's leases were
	// asked under it, every decision is under dq
	// (broker.Server.Reconfigure). (A quota changed back and forth
	// over a window's counts re-cuts them, docs/quotas.md: not
	// this test's invariant.)
	var was Quota
	was.NWindows = 1 + r.IntN(2)
	was.Windows[0] = Limit{Unit: Messages, N: 1 + r.IntN(40), Window: window()}
	if was.NWindows == 2 {
		was.Windows[1] = Limit{Unit: Bytes, N: 64 + r.IntN(900), Window: window()}
	}
	if w.trace != nil {
		w.tracef("sequence: buckets %d policy %+v idle %d every %v quota %v class %q group %v %v was %v", buckets, w.policy, w.idleAfter, w.every, dls, class, group, gls, was.Windows[:was.NWindows])
	}
	devices := []string{"a", "b", "c"}
	touched := map[string]bool{} // connected or decided in this sequence
	for range 30 + r.IntN(60) {
		switch op := r.IntN(100); {
		case op < 5: // a device connects: its first leases asked (prelease.go)
			dev := devices[r.IntN(len(devices))]
			ls := dls
			if !touched[dev] && r.IntN(2) == 0 {
				ls = was.Windows[:was.NWindows]
			}
			touched[dev] = true
			w.tab.Prelease(dev, class, ls, w.now)
			if w.trace != nil {
				w.tracef("prelease %s %v", dev, ls)
			}
			var seen [2]int
			for _, l := range ls {
				key := string(AppendWindowKey(nil, dev, class, l.Unit, seen[l.Unit]))
				seen[l.Unit]++
				w.leaseMax[key] = max(w.leaseMax[key], w.policy.Size(l, 64))
			}
		case op < 55:
			w.now = w.now.Add(time.Duration(r.IntN(400)) * time.Millisecond)
			dev := devices[r.IntN(len(devices))]
			touched[dev] = true
			size := 1 + r.IntN(64)
			var d Decision
			if group {
				d = w.tab.AllowGroupAt(dev, class, dq, groupKey, gq, size, w.now).Decision
			} else {
				d = w.tab.AllowClassAt(dev, class, dq, size, w.now)
			}
			if w.trace != nil {
				w.tracef("publish %s %d at %v: %+v", dev, size, w.now.Sub(t0), d)
			}
			if !d.Allowed {
				continue
			}
			parts := w.parts(dev, class, dls, size)
			if group {
				parts = append(parts, w.parts(groupKey, "", gls, size)...)
			}
			w.pending = append(w.pending, pendingMsg{lease: d.Lease, parts: parts})
		case op < 68:
			w.writeLeases(r.IntN(8) != 0) // a write that fails now and then
		case op < 78:
			w.act(false)
		case op < 88:
			w.snapshot(-1)
		case op < 92:
			w.now = w.now.Add(time.Duration(r.IntN(3000)) * time.Millisecond)
		case op < 94: // crash during a snapshot
			w.snapshot(r.IntN(4))
			w.crash()
		case op < 96: // crash during a lease write
			w.tab.TakeLeases(func(string, Lease) {})
			w.crash()
		default:
			w.crash()
		}
	}
	w.act(false)
	if w.trace != nil {
		w.tracef("acted %d", len(w.acted))
	}
	return w
}

// checkActed fails when some closed interval of a window's length holds
// more than its limit of the units acted on.
func checkActed(t *testing.T, seq int, acted []admission) {
	t.Helper()
	by := map[string][]admission{}
	for _, a := range acted {
		by[a.key] = append(by[a.key], a)
	}
	for _, key := range slices.Sorted(maps.Keys(by)) {
		as := by[key]
		slices.SortStableFunc(as, func(a, b admission) int { return int(a.at - b.at) })
		sum, j := 0, 0
		for i, a := range as {
			sum += a.units
			for as[j].at < a.at.Add(-a.limitT) {
				sum -= as[j].units
				j++
			}
			if sum > a.limitN {
				t.Fatalf("seq %d: window %q: %d units within %v, limit %d (admissions %d..%d)", seq, key, sum, a.limitT, a.limitN, j, i)
			}
		}
	}
}

// With leases, a decision still allocates nothing: not when it asks for
// a lease (the queue of keys is reused), not when the lease is written.
func TestLeasedDecisionsAllocateNothing(t *testing.T) {
	tab := newTable(t, 20)
	tab.EnableLeases(DefaultLeasePolicy)
	var q Quota
	q.NWindows = 2
	q.Windows[0] = Limit{Unit: Messages, N: 1000, Window: time.Second}
	q.Windows[1] = Limit{Unit: Bytes, N: 1 << 20, Window: time.Second}
	gq := Quota{Limit: 100_000, Window: time.Second}
	g := GroupKey("g")
	now := t0
	calls, asked := 0, 0
	step := func() {
		now += Tick(2 * ms)
		for _, d := range []Decision{
			tab.AllowAt("dev", Quota{Limit: 1000, Window: time.Second}, now),
			tab.AllowClassAt("dev", "alarms", q, 100, now),
			tab.AllowGroupAt("dev2", "", q, g, gq, 100, now).Decision,
		} {
			if !d.Allowed {
				t.Fatalf("refused: %+v", d)
			}
			if d.Lease != 0 {
				asked++
			}
		}
		if calls++; calls%7 == 0 {
			gen, keys := tab.TakeLeases(func(string, Lease) {})
			tab.LeasesDurable(gen)
			tab.ReleaseLeaseKeys(keys)
		}
	}
	for range 100 {
		step() // the windows and the queue reach their size
	}
	if allocs := testing.AllocsPerRun(2000, step); allocs != 0 {
		t.Fatalf("leased decisions allocated %v times per round", allocs)
	}
	if asked == 0 {
		t.Fatal("no decision waited for a lease: the test shows nothing")
	}
}

// The counters that are not quota take no lease, so a crash never
// charges them: refusals counted toward a block (a class whose name
// starts with a NUL) and the windows of a quota in shadow mode.
func TestNonQuotaCountersTakeNoLease(t *testing.T) {
	tab := newTable(t, 10)
	tab.EnableLeases(DefaultLeasePolicy)
	q := Quota{Limit: 100, Window: time.Second}
	shadow := q
	shadow.Shadow = true
	gq := Quota{Limit: 100, Window: time.Second, Shadow: true}
	for i, d := range []Decision{
		tab.AllowClassAt("dev", "\x00refusals", q, 0, t0),
		tab.AllowAt("dev", shadow, t0),
		tab.AllowClassAt("dev", "alarms", shadow, 10, t0),
		tab.AllowGroupAt("dev2", "", shadow, GroupKey("g"), gq, 10, t0).Decision,
	} {
		if !d.Allowed || d.Lease != 0 {
			t.Errorf("decision %d: %+v, want admitted without a lease", i, d)
		}
	}
	var keys []string
	tab.TakeLeases(func(key string, _ Lease) { keys = append(keys, key) })
	if len(keys) != 0 {
		t.Errorf("leases taken for %q, want none", keys)
	}
	// The enforced part of a group with a shadow part takes its lease.
	d := tab.AllowGroupAt("dev3", "", q, GroupKey("g"), gq, 10, t0)
	tab.TakeLeases(func(key string, _ Lease) { keys = append(keys, key) })
	if d.Lease == 0 || len(keys) != 1 || keys[0] != "dev3" {
		t.Errorf("enforced device in a shadow group: lease %d for %q, want one for dev3", d.Lease, keys)
	}
}

func TestLeasePolicySize(t *testing.T) {
	p := LeasePolicy{Share: 0.1, Min: 2, Max: 50}
	for _, c := range []struct {
		l    Limit
		n    int
		want int
	}{
		{Limit{Unit: Messages, N: 1000}, 1, 50},
		{Limit{Unit: Messages, N: 100}, 1, 10},
		{Limit{Unit: Messages, N: 10}, 1, 2},
		{Limit{Unit: Messages, N: 1}, 1, 1},
		{Limit{Unit: Bytes, N: 100_000}, 10, 10_000},
		{Limit{Unit: Bytes, N: 100}, 60, 60},
	} {
		if got := p.Size(c.l, c.n); got != c.want {
			t.Errorf("Size(%v, %d) = %d, want %d", c.l, c.n, got, c.want)
		}
	}
	for _, bad := range []LeasePolicy{{Share: 0, Min: 1, Max: 1}, {Share: 1.5, Min: 1, Max: 1}, {Share: 0.1, Min: 0, Max: 1}, {Share: 0.1, Min: 3, Max: 2}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", bad)
		}
	}
	_ = fmt.Sprint
}
