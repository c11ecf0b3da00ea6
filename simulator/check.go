package simulator

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Ack is what a publisher learned about one message from the gateway.
type Ack uint8

const (
	// AckNone means no acknowledgement came: QoS 0, or the connection
	// ended before the PUBACK. The zero value.
	AckNone Ack = iota
	// AckSuccess is a PUBACK with a reason code below 0x80. The gateway
	// acks a deferred message the same way (0x00), so under policy defer
	// the checker tells admitted from deferred by arrival latency.
	AckSuccess
	// AckRefused is a PUBACK with a reason code of 0x80 or more (0x97
	// quota exceeded).
	AckRefused
)

// String returns "none", "success" or "refused".
func (a Ack) String() string {
	switch a {
	case AckNone:
		return "none"
	case AckSuccess:
		return "success"
	case AckRefused:
		return "refused"
	}
	return fmt.Sprintf("Ack(%d)", uint8(a))
}

// MarshalText encodes a as its String.
func (a Ack) MarshalText() ([]byte, error) {
	if a > AckRefused {
		return nil, fmt.Errorf("marshal ack: unknown value %d", uint8(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText decodes "none", "success" or "refused".
func (a *Ack) UnmarshalText(b []byte) error {
	for v := AckNone; v <= AckRefused; v++ {
		if string(b) == v.String() {
			*a = v
			return nil
		}
	}
	return fmt.Errorf("unmarshal ack: unknown value %q", b)
}

// Sent is one message a device published.
type Sent struct {
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
	Ack Ack       `json:"ack"`
	// Code is the PUBACK reason code when Ack is not AckNone.
	Code byte `json:"code"`
	// AckAt is when the ack came; zero when unknown.
	AckAt time.Time `json:"ack_at,omitzero"`
	// Size is the payload's length in bytes, what a byte window counts.
	Size int `json:"size,omitempty"`
	// Class is the topic class the message was sent in ("" for none:
	// the device's own quota); see DeviceLog.Classes.
	Class string `json:"class,omitempty"`
}

// Arrival is one delivery of a device's message to the subscriber.
type Arrival struct {
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
	// Released is the instant the gateway released the message, when it
	// was deferred and says so (devicelimit.ReleasedProperty, MQTT 5).
	Released time.Time `json:"released,omitzero"`
}

// DeviceLog is everything observed about one device: its quota, what it
// sent and what the subscriber received from it, in any order.
type DeviceLog struct {
	Device string
	// Quota is the device's own quota, of one window or several; its
	// messages in a topic class are judged by Classes[class] instead.
	Quota    devicelimit.Quota
	Classes  map[string]devicelimit.Quota
	Sent     []Sent
	Arrivals []Arrival
	// Allowance is the excess over Quota the durability contract
	// allows this device: the admissions a crashed gateway may have
	// forgotten. 0 without a crash.
	Allowance int
	// Group is the gateway's group the device is in ("" for none):
	// its messages are judged with its group's, CheckOptions.Groups.
	Group string
}

// CheckOptions tune the checker. The zero value checks exact windows
// and counts every success-acked message under policy defer as deferred.
type CheckOptions struct {
	// Tolerance is subtracted from each device's window T before counting
	// arrivals in any window. The gateway decides at the instant a
	// publish reaches it; the subscriber timestamps the delivery later,
	// after a variable network and scheduling delay. Two messages the
	// gateway saw exactly T apart can arrive slightly less than T apart,
	// so an exact check would report excess the gateway never admitted.
	// A tolerance a little above the delivery jitter (tens of
	// milliseconds on loopback) removes that false positive while still
	// catching a gateway that admits N+1 in a window.
	Tolerance time.Duration
	// Immediate is, for devices under policy defer, the largest
	// send-to-arrival latency of a message still counted as admitted on
	// the spot; a success-acked message arriving later, or not at all,
	// counts as deferred. Devices under other policies ignore it.
	Immediate time.Duration
	// Groups are the windows of the gateway's groups, by name: the
	// devices whose DeviceLog.Group names one are judged together
	// against them too (groups.go).
	Groups map[string]devicelimit.Quota
}

// DeviceResult is the checker's verdict on one device. The buckets
// Accepted, Refused, Deferred, Lost and Unacked partition Sent: every
// sent sequence number is in exactly one of them.
type DeviceResult struct {
	Device string `json:"device"`
	// Limit, WindowNS (the window T in nanoseconds), the window counts
	// below and Allowance are the device's judged window's: its one,
	// or, of several (Windows), the first violated, else the one of
	// largest excess.
	Limit    int           `json:"limit"`
	WindowNS time.Duration `json:"window_ns"`
	Policy   string        `json:"policy"`
	// Windows are every window's verdict when the device has more than
	// one (several windows, topic classes).
	Windows []WindowResult `json:"windows,omitempty"`
	// JudgedWindow is the place in Windows of the judged window.
	JudgedWindow int `json:"judged_window,omitempty"`

	Counts
	// Latency is send to first arrival, over every message that arrived
	// and was not refused.
	Latency

	// MaxInWindow is the largest number of first arrivals in any
	// half-open window of length T - Tolerance; MaxWindowStart is when
	// the first such window starts. Excess = max(0, MaxInWindow - Limit)
	// is a quota violation.
	MaxInWindow    int       `json:"max_in_window"`
	MaxWindowStart time.Time `json:"max_window_start,omitzero"`
	Excess         int       `json:"excess"`
	// Allowance is DeviceLog.Allowance: excess up to it is within the
	// persistence bound of a crash, not a violation.
	Allowance int `json:"allowance,omitempty"`
	// Confirmed is the largest number of admissions that send and ack
	// times prove fell within less than T (see confirmed); unlike
	// MaxInWindow it cannot be inflated by late deliveries.
	// ConfirmedExcess = max(0, Confirmed - Limit).
	Confirmed       int       `json:"confirmed"`
	ConfirmedExcess int       `json:"confirmed_excess"`
	ConfirmedStart  time.Time `json:"confirmed_start,omitzero"`
}

// Violation reports whether the device's excess is beyond its
// allowance, and not explained by late deliveries: the device's own
// send and ack times confirm it (ConfirmedExcess), or some of its
// messages were deferred and released, which those times cannot place.
func (r DeviceResult) Violation() bool {
	return r.Excess > r.Allowance && (r.ConfirmedExcess > r.Allowance || r.Released > 0)
}

// Judged is the count the verdict holds against the limit: the smaller
// of MaxInWindow and Confirmed, or MaxInWindow alone for a device with
// released messages (see Violation).
func (r DeviceResult) Judged() int {
	if r.Released > 0 {
		return r.MaxInWindow
	}
	return min(r.MaxInWindow, r.Confirmed)
}

// UnackedMissing is the number of unacknowledged messages that never
// arrived.
func (r DeviceResult) UnackedMissing() int { return r.Unacked - r.UnackedArrived }

// Unexpected is the number of faults on this device other than quota
// excess: lost, leaked, phantom and out-of-order messages.
func (r DeviceResult) Unexpected() int { return r.Lost + r.Leaked + r.Phantom + r.OutOfOrder }

// Failed reports whether the device shows a violation or an unexpected
// fault.
func (r DeviceResult) Failed() bool { return r.Violation() || r.Unexpected() > 0 }

// Totals sums the counters over all devices. The Max and Excess fields
// are the largest of any device; Violations counts the devices with
// excess.
type Totals struct {
	Devices int `json:"devices"`
	Counts
	// Violations is the number of devices for which Violation holds;
	// WithinBound the number with excess, all of it within the
	// allowance of a crash. ExcessTotal sums the excess of both;
	// MaxExcess is the largest.
	Violations  int `json:"violations"`
	WithinBound int `json:"within_bound"`
	// Unconfirmed is the number of devices with more arrivals in a
	// window than their quota (and allowance) that their send and ack
	// times do not confirm: late deliveries arriving together, not
	// violations.
	Unconfirmed int `json:"unconfirmed"`
	ExcessTotal int `json:"excess_total"`
	MaxExcess   int `json:"max_excess"`
	// GroupViolations is the number of groups (Result.Groups) whose
	// windows held more than their limit.
	GroupViolations int `json:"group_violations,omitempty"`
	Latency
	// LatencyHist is the histogram of the latencies Latency sums up.
	LatencyHist Histogram `json:"latency_hist"`
}

// Counts are the message counters of a device or of the fleet. The
// buckets Accepted, Refused, Deferred, Lost and Unacked partition Sent.
type Counts struct {
	Sent  int `json:"sent"`
	Acked int `json:"acked"` // PUBACK of any code

	// Accepted: acked with success and arrived (promptly, under defer).
	Accepted int `json:"accepted"`
	// Refused: acked with a code >= 0x80.
	Refused int `json:"refused"`
	// Deferred = Released + Pending: under policy defer, acked with
	// success and arrived late (Released) or not yet (Pending).
	Deferred int `json:"deferred"`
	Released int `json:"released"`
	Pending  int `json:"pending"`
	// Lost: acked with success under a policy other than defer, and
	// never arrived. Always unexpected.
	Lost int `json:"lost"`
	// Unacked = UnackedArrived + UnackedMissing: no PUBACK (QoS 0 or a
	// lost connection), so a missing message is not a fault.
	Unacked        int `json:"unacked"`
	UnackedArrived int `json:"unacked_arrived"`

	// Leaked: refused yet arrived (a subset of Refused); unexpected.
	Leaked int `json:"leaked"`
	// Duplicated counts extra deliveries: arrivals beyond the first of a
	// sequence number.
	Duplicated int `json:"duplicated"`
	// Phantom counts arrivals of sequence numbers never sent; unexpected.
	Phantom int `json:"phantom"`
	// OutOfOrder counts first arrivals of a sequence number lower than
	// one that arrived before it: the device's order broken on the way;
	// unexpected.
	OutOfOrder int `json:"out_of_order"`
}

// Add adds o's counters to c.
func (c *Counts) Add(o Counts) {
	c.Sent += o.Sent
	c.Acked += o.Acked
	c.Accepted += o.Accepted
	c.Refused += o.Refused
	c.Deferred += o.Deferred
	c.Released += o.Released
	c.Pending += o.Pending
	c.Lost += o.Lost
	c.Unacked += o.Unacked
	c.UnackedArrived += o.UnackedArrived
	c.Leaked += o.Leaked
	c.Duplicated += o.Duplicated
	c.OutOfOrder += o.OutOfOrder
	c.Phantom += o.Phantom
}

// Latency holds latency percentiles (nearest rank); 0 when there is no
// sample.
type Latency struct {
	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP95 time.Duration `json:"latency_p95_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	LatencyMax time.Duration `json:"latency_max_ns"`
}

// Result is the checker's verdict on a fleet. Devices are sorted by ID.
type Result struct {
	Tolerance time.Duration  `json:"tolerance_ns"`
	Totals    Totals         `json:"totals"`
	Devices   []DeviceResult `json:"devices"`
	// Groups are the verdicts on the groups' windows, by name.
	Groups []GroupResult `json:"groups,omitempty"`
	// Timeline is nil when nothing was sent.
	Timeline *Timeline `json:"timeline,omitempty"`
}

// Check runs the checker over logs. It is pure: the same logs give the
// same result, and the logs are not modified.
func Check(logs []DeviceLog, opts CheckOptions) Result {
	res := Result{Tolerance: opts.Tolerance, Devices: make([]DeviceResult, 0, len(logs)), Timeline: newTimeline(logs)}
	var all []time.Duration
	for _, l := range logs {
		d, lat := checkDevice(l, opts, res.Timeline)
		res.Devices = append(res.Devices, d)
		all = append(all, lat...)
	}
	sort.Slice(res.Devices, func(i, j int) bool { return res.Devices[i].Device < res.Devices[j].Device })
	t := &res.Totals
	for _, d := range res.Devices {
		t.Devices++
		t.Counts.Add(d.Counts)
		if d.Excess > 0 {
			switch {
			case d.Violation():
				t.Violations++
			case d.Excess <= d.Allowance:
				t.WithinBound++
			default:
				t.Unconfirmed++
			}
			t.ExcessTotal += d.Excess
			t.MaxExcess = max(t.MaxExcess, d.Excess)
		}
	}
	res.Timeline.finish()
	slices.Sort(all)
	t.LatencyP50, t.LatencyP95, t.LatencyP99, t.LatencyMax = percentiles(all)
	t.LatencyHist = newHistogram(all)
	res.Groups = judgeGroups(logs, opts)
	for _, g := range res.Groups {
		if g.Violated {
			t.GroupViolations++
		}
	}
	return res
}

// outOfOrder counts the first arrivals (sequence number: time) of a
// lower sequence number than one that arrived before.
func outOfOrder(first map[uint64]time.Time) int {
	seqs := make([]uint64, 0, len(first))
	for seq := range first {
		seqs = append(seqs, seq)
	}
	slices.SortFunc(seqs, func(a, b uint64) int {
		if c := first[a].Compare(first[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	n := 0
	var high uint64
	for i, seq := range seqs {
		if i > 0 && seq < high {
			n++
		}
		high = max(high, seq)
	}
	return n
}

// checkDevice returns the device's result and its sorted latencies.
func checkDevice(l DeviceLog, opts CheckOptions, tl *Timeline) (DeviceResult, []time.Duration) {
	r := DeviceResult{
		Device: l.Device,
		Policy: l.Quota.Policy.String(),
		Counts: Counts{Sent: len(l.Sent)},
	}
	first, dups := firstArrivals(l.Arrivals)
	r.Duplicated = dups
	r.OutOfOrder = outOfOrder(first)
	sent := make(map[uint64]bool, len(l.Sent))
	var lat []time.Duration
	deferPolicy := l.Quota.Policy == devicelimit.PolicyDefer
	for _, s := range l.Sent {
		sent[s.Seq] = true
		at, arrived := first[s.Seq]
		if s.Ack != AckNone {
			r.Acked++
		}
		if arrived && s.Ack != AckRefused {
			lat = append(lat, at.Sub(s.At))
			tl.addLatency(s.At, at.Sub(s.At))
		}
		switch s.Ack {
		case AckRefused:
			r.Refused++
			tl.add(s.At, outRefused)
			if arrived {
				r.Leaked++
			}
		case AckSuccess:
			switch {
			case deferPolicy && !arrived:
				r.Deferred++
				r.Pending++
				tl.add(s.At, outDeferred)
			case deferPolicy && at.Sub(s.At) > opts.Immediate:
				r.Deferred++
				r.Released++
				tl.add(s.At, outDeferred)
			case arrived:
				r.Accepted++
				tl.add(s.At, outAccepted)
			default:
				r.Lost++
				tl.add(s.At, outLost)
			}
		default:
			r.Unacked++
			tl.add(s.At, outUnacked)
			if arrived {
				r.UnackedArrived++
			}
		}
	}
	for seq := range first {
		if !sent[seq] {
			r.Phantom++
		}
	}
	ws := judgeWindows(l, placeReleases(l, first), opts, deferPolicy, r.Released > 0)
	r.JudgedWindow = worstWindow(ws, r.Released > 0)
	w := ws[r.JudgedWindow]
	r.Limit, r.WindowNS, r.Allowance = w.Limit, w.WindowNS, w.Allowance
	r.MaxInWindow, r.MaxWindowStart, r.Excess = w.MaxInWindow, w.MaxWindowStart, w.Excess
	r.Confirmed, r.ConfirmedStart, r.ConfirmedExcess = w.Confirmed, w.ConfirmedStart, w.ConfirmedExcess
	if len(ws) > 1 {
		r.Windows = ws
	}
	slices.Sort(lat)
	r.LatencyP50, r.LatencyP95, r.LatencyP99, r.LatencyMax = percentiles(lat)
	return r, lat
}

// percentiles returns the nearest-rank p50, p95, p99 and max of sorted.
func percentiles(sorted []time.Duration) (p50, p95, p99, pmax time.Duration) {
	if len(sorted) == 0 {
		return 0, 0, 0, 0
	}
	rank := func(p int) time.Duration {
		k := (p*len(sorted) + 99) / 100 // ceil(p/100 * n), 1-based
		return sorted[max(k, 1)-1]
	}
	return rank(50), rank(95), rank(99), sorted[len(sorted)-1]
}

// Verdict is the exit decision on a Result.
type Verdict struct {
	// OK is true when no device exceeded its quota and nothing
	// unexpected (lost, leaked, phantom) happened.
	OK bool `json:"ok"`
	// Worst names up to n failed devices, worst first: by excess, then
	// by unexpected faults, then by ID.
	Worst []string `json:"worst,omitempty"`
}

// Decide returns the exit decision for res, naming at most n of the
// worst devices.
func Decide(res Result, n int) Verdict {
	failed := Worst(res, -1)
	v := Verdict{OK: len(failed) == 0 && res.Totals.GroupViolations == 0}
	for i, d := range failed {
		if i == n {
			break
		}
		v.Worst = append(v.Worst, d.Device)
	}
	return v
}

// Worst returns the failed devices of res, worst first (by excess, then
// unexpected faults, then ID), at most n of them; n < 0 means all.
func Worst(res Result, n int) []DeviceResult {
	var out []DeviceResult
	for _, d := range res.Devices {
		if d.Failed() {
			out = append(out, d)
		}
	}
	slices.SortStableFunc(out, func(a, b DeviceResult) int {
		if a.Excess != b.Excess {
			return b.Excess - a.Excess
		}
		return b.Unexpected() - a.Unexpected()
	})
	if n >= 0 && len(out) > n {
		out = out[:n]
	}
	return out
}
