package simulator

import (
	"slices"
	"time"
)

// Timeline is the fleet's messages over time by outcome: how many of
// the messages sent in each bin of BinNS from Start were accepted,
// refused, deferred, lost or unacked (see Counts), and the delivery
// latency of the messages sent in each bin that reached the subscriber
// (the totals' latency, by bin: LatencyP99 and LatencyMax, 0 where none
// arrived), which shows when a run's tail came. Every series has the
// same length.
type Timeline struct {
	Start      time.Time       `json:"start,omitzero"`
	BinNS      time.Duration   `json:"bin_ns"`
	Accepted   []int           `json:"accepted"`
	Refused    []int           `json:"refused"`
	Deferred   []int           `json:"deferred"`
	Lost       []int           `json:"lost"`
	Unacked    []int           `json:"unacked"`
	LatencyP99 []time.Duration `json:"latency_p99_ns"`
	LatencyMax []time.Duration `json:"latency_max_ns"`

	lat [][]time.Duration // each bin's latencies, until finish
}

// outcome is the bucket Check sorts a sent message into.
type outcome uint8

const (
	outAccepted outcome = iota
	outRefused
	outDeferred
	outLost
	outUnacked
)

// timelineBins are the bin widths a timeline may use; the smallest that
// gives at most maxBins bins is chosen.
var timelineBins = []time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 5 * time.Minute, 10 * time.Minute, time.Hour,
}

const maxBins = 120

// newTimeline returns an empty timeline covering the send times of
// logs, or nil when nothing was sent.
func newTimeline(logs []DeviceLog) *Timeline {
	var first, last time.Time
	for _, l := range logs {
		for _, s := range l.Sent {
			if first.IsZero() || s.At.Before(first) {
				first = s.At
			}
			if s.At.After(last) {
				last = s.At
			}
		}
	}
	if first.IsZero() {
		return nil
	}
	span := last.Sub(first)
	bin := timelineBins[len(timelineBins)-1]
	for _, b := range timelineBins {
		if span/b < maxBins {
			bin = b
			break
		}
	}
	n := int(span/bin) + 1
	return &Timeline{
		Start: first, BinNS: bin,
		Accepted: make([]int, n), Refused: make([]int, n), Deferred: make([]int, n),
		Lost: make([]int, n), Unacked: make([]int, n),
		LatencyP99: make([]time.Duration, n), LatencyMax: make([]time.Duration, n),
		lat: make([][]time.Duration, n),
	}
}

// bin returns the index of the bin of a message sent at at.
func (t *Timeline) bin(at time.Time) int {
	return min(max(int(at.Sub(t.Start)/t.BinNS), 0), len(t.Accepted)-1)
}

// addLatency records the delivery latency of a message sent at at.
func (t *Timeline) addLatency(at time.Time, d time.Duration) {
	if t == nil {
		return
	}
	i := t.bin(at)
	t.lat[i] = append(t.lat[i], d)
}

// finish sets each bin's latency figures from the latencies added.
func (t *Timeline) finish() {
	if t == nil {
		return
	}
	for i, l := range t.lat {
		slices.Sort(l)
		_, _, t.LatencyP99[i], t.LatencyMax[i] = percentiles(l)
	}
	t.lat = nil
}

// add counts a message sent at at with outcome o.
func (t *Timeline) add(at time.Time, o outcome) {
	if t == nil {
		return
	}
	i := t.bin(at)
	switch o {
	case outAccepted:
		t.Accepted[i]++
	case outRefused:
		t.Refused[i]++
	case outDeferred:
		t.Deferred[i]++
	case outLost:
		t.Lost[i]++
	default:
		t.Unacked[i]++
	}
}
