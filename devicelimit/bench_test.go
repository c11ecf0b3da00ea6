package devicelimit_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/devicegate/devicegate/devicelimit"
)

// The benchmarks put the Table beside a baseline that many gateways use:
// a map of golang.org/x/time/rate limiters behind one mutex. Both read the
// time from the same SystemClock (one atomic load) and convert it to
// their own type, both get the same devices in the same order, and both
// enforce 100 messages per 10 s.
//
//	go test -run '^$' -bench AllowAt -benchmem ./devicelimit/

var benchQuota = devicelimit.Quota{Limit: 100, Window: 10 * time.Second}

type limiter interface {
	allow(device string, now devicelimit.Tick) bool
}

type tableImpl struct{ t *devicelimit.Table }

func (l tableImpl) allow(device string, now devicelimit.Tick) bool {
	return l.t.AllowAt(device, benchQuota, now).Allowed
}

// leaseWriter stands in for persist's Leaser: it marks every batch of
// leases durable as soon as it is asked for, for as long as the process
// runs.
func leaseWriter(t *devicelimit.Table) {
	for range t.LeaseWake() {
		gen, keys := t.TakeLeases(func(string, devicelimit.Lease) {})
		t.LeasesDurable(gen)
		t.ReleaseLeaseKeys(keys)
	}
}

// previousImpl is AllowAt as it was before quotas of several windows
// (previous_test.go).
type previousImpl struct{ t *devicelimit.Table }

var previousQuota = devicelimit.PreviousQuota{Limit: benchQuota.Limit, Window: benchQuota.Window}

func (l previousImpl) allow(device string, now devicelimit.Tick) bool {
	return l.t.AllowAtPrevious(device, previousQuota, now).Allowed
}

// windowsImpl decides with AllowAllAt on the first n of benchWindows
// (the first is benchQuota's), 64-byte messages.
type windowsImpl struct {
	t *devicelimit.Table
	n int
}

var benchWindows = []devicelimit.Limit{
	{Unit: devicelimit.Messages, N: benchQuota.Limit, Window: benchQuota.Window},
	{Unit: devicelimit.Messages, N: 1_000_000, Window: 24 * time.Hour},
	{Unit: devicelimit.Bytes, N: 1 << 30, Window: 24 * time.Hour},
}

func (l windowsImpl) allow(device string, now devicelimit.Tick) bool {
	return l.t.AllowAllAt(device, "", benchWindows[:l.n], 64, now).Allowed
}

// groupImpl decides with AllowGroupAt: benchQuota for the device, and a
// group of 1e9 per 10 s (never full: the cost of the second part, not
// of refusals), each device in one of 100 groups by its ID's last two
// digits.
type groupImpl struct {
	t    *devicelimit.Table
	keys [100]string
}

var benchGroupQuota = devicelimit.Quota{Limit: devicelimit.MaxLimit, Window: benchQuota.Window}

func (l *groupImpl) allow(device string, now devicelimit.Tick) bool {
	g := int(device[len(device)-2]-'0')*10 + int(device[len(device)-1]-'0')
	return l.t.AllowGroupAt(device, "", benchQuota, l.keys[g], benchGroupQuota, 64, now).Allowed
}

// xrateImpl is the baseline.
type xrateImpl struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (l *xrateImpl) allow(device string, now devicelimit.Tick) bool {
	l.mu.Lock()
	lim, ok := l.m[device]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(float64(benchQuota.Limit)/benchQuota.Window.Seconds()), benchQuota.Limit)
		l.m[device] = lim
	}
	l.mu.Unlock()
	return lim.AllowN(time.Unix(0, int64(now)), 1)
}

var benchImpls = []struct {
	name string
	make func() limiter
}{
	{"previous", func() limiter {
		t, _ := devicelimit.NewTable(devicelimit.DefaultBuckets)
		return previousImpl{t}
	}},
	{"table", func() limiter {
		t, _ := devicelimit.NewTable(devicelimit.DefaultBuckets)
		return tableImpl{t}
	}},
	{"leased", func() limiter {
		t, _ := devicelimit.NewTable(devicelimit.DefaultBuckets)
		t.EnableLeases(devicelimit.DefaultLeasePolicy)
		go leaseWriter(t)
		return tableImpl{t}
	}},
	{"xrate", func() limiter { return &xrateImpl{m: make(map[string]*rate.Limiter)} }},
	{"windows1", func() limiter { return windowsOf(1) }},
	{"windows2", func() limiter { return windowsOf(2) }},
	{"windows3", func() limiter { return windowsOf(3) }},
	{"group", func() limiter {
		t, _ := devicelimit.NewTable(devicelimit.DefaultBuckets)
		g := &groupImpl{t: t}
		for i := range g.keys {
			g.keys[i] = devicelimit.GroupKey(fmt.Sprintf("tenant-%02d", i))
		}
		return g
	}},
}

func windowsOf(n int) limiter {
	t, _ := devicelimit.NewTable(devicelimit.DefaultBuckets)
	return windowsImpl{t, n}
}

var benchSizes = []struct {
	name string
	n    int
}{{"10k", 10_000}, {"1M", 1_000_000}}

// benchIDs holds the device IDs per size, shared by both implementations.
var benchIDs = map[int][]string{}

func deviceIDs(n int) []string {
	if ids, ok := benchIDs[n]; ok {
		return ids
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%08d", i)
	}
	benchIDs[n] = ids
	return ids
}

type populated struct {
	l        limiter
	perDev   float64
	now      devicelimit.Tick // where the last run left the time
	devCount int
}

// benchState keeps populated limiters across the calls the testing
// package makes to one benchmark while it sizes b.N.
var benchState = map[string]*populated{}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func populate(key string, mk func() limiter, ids []string) *populated {
	if p, ok := benchState[key]; ok {
		return p
	}
	for k, p := range benchState { // the populations of one size alive at a time
		if p.devCount != len(ids) {
			delete(benchState, k)
		}
	}
	before := heapInUse()
	l := mk()
	now := devicelimit.TickOf(time.Now())
	for _, id := range ids {
		l.allow(id, now)
	}
	after := heapInUse()
	p := &populated{l: l, perDev: float64(after-before) / float64(len(ids)), now: now, devCount: len(ids)}
	benchState[key] = p
	return p
}

// stride walks the devices in an order the hardware cannot predict.
const stride = 7919

// benchModes are the modes of BenchmarkAllowAt. Time is an argument
// of both implementations and advances by a fixed step a decision, so the
// benchmark times the decision and not a clock read
// (BenchmarkSystemClockNow times that). Each device comes round every
// len(ids) decisions: at rate 0.9 its messages come at 0.9 of its quota
// and are all admitted (the common case), at 10 ten times faster and
// most are refused.
var benchModes = []struct {
	name     string
	parallel bool
	rate     float64
}{
	{"serial", false, 0.9},
	{"parallel", true, 0.9},
	{"serial-over", false, 10},
	{"parallel-over", true, 10},
}

// BenchmarkAllowAt runs the implementations back to back for each size
// and mode, so that a ratio compares runs made under the same load of a
// shared machine: the table's AllowAt (a quota of one window, the
// gateway's path for it), the baseline, and AllowAllAt over one, two
// and three windows (windowsN), each reporting its memory per device.
func BenchmarkAllowAt(b *testing.B) {
	for _, size := range benchSizes {
		ids := deviceIDs(size.n)
		n := len(ids)
		// The time between two decisions that brings each device round
		// at its quota's pace.
		pace := float64(benchQuota.Window) / float64(benchQuota.Limit) / float64(n)
		for _, mode := range benchModes {
			step := devicelimit.Tick(max(1, pace/mode.rate))
			for _, impl := range benchImpls {
				name := fmt.Sprintf("impl=%s/devices=%s/mode=%s", impl.name, size.name, mode.name)
				b.Run(name, func(b *testing.B) {
					p := populate(impl.name+size.name, impl.make, ids)
					b.ReportAllocs()
					defer b.ReportMetric(p.perDev, "B/device")
					if !mode.parallel {
						i, now := 0, p.now
						for b.Loop() {
							now += step
							p.l.allow(ids[i], now)
							i += stride
							if i >= n {
								i -= n
							}
						}
						p.now = now
						return
					}
					var seed atomic.Int64
					var end atomic.Int64
					procs := devicelimit.Tick(runtime.GOMAXPROCS(0))
					start := p.now
					b.RunParallel(func(pb *testing.PB) {
						i, now := int(seed.Add(1)*104729)%n, start
						for pb.Next() {
							now += step * procs // each of procs goroutines takes a share
							p.l.allow(ids[i], now)
							i += stride
							if i >= n {
								i -= n
							}
						}
						for cur := end.Load(); int64(now) > cur && !end.CompareAndSwap(cur, int64(now)); cur = end.Load() {
						}
					})
					p.now = max(p.now, devicelimit.Tick(end.Load()))
				})
			}
		}
	}
}

// BenchmarkSystemClockNow times one reading of the gateway's clock, which
// every publish takes once.
func BenchmarkSystemClockNow(b *testing.B) {
	clk := devicelimit.NewSystemClock(0)
	var sink devicelimit.Tick
	for b.Loop() {
		sink += clk.Now()
	}
	_ = sink
}
