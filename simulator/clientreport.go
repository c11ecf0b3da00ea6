package simulator

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// ClientResult is the outcome of the devices on one client of the
// run's mix (Config.Client): what the gateway's feedback is for, seen
// from the devices.
type ClientResult struct {
	Client  string `json:"client"`
	Devices int    `json:"devices"`
	// Wanted is how many messages the devices' schedule wanted to
	// send; Sent how many they sent: the same for naive clients, fewer
	// for adaptive ones, which send a path's latest reading only when
	// the feedback allows.
	Wanted   int64 `json:"wanted"`
	Sent     int   `json:"sent"`
	Admitted int   `json:"admitted"` // acknowledged with success
	Refused  int   `json:"refused"`  // acknowledged with a code >= 0x80
	// RefusedShare is Refused / Sent.
	RefusedShare float64 `json:"refused_share"`
	// Goodput is admitted messages per second per device; QuotaRate
	// what the quota admits per second per device (per path, the
	// tightest window's limit over its length, bytes turned into
	// messages of the path's mean size; summed over the device's own
	// quota and its topic classes). GoodputShare is admitted messages
	// over what the quota admits in each device's time from its first
	// message to the end of publishing.
	Goodput      float64 `json:"goodput_per_s"`
	QuotaRate    float64 `json:"quota_per_s"`
	GoodputShare float64 `json:"goodput_share"`
	// Latency is send to first arrival of the admitted messages.
	Latency
	// BytesOut and BytesIn are what the devices wrote and read on
	// their connections (MQTT, and TLS when on): bytes on the air.
	// PerAdmitted is both directions over Admitted.
	BytesOut    int64   `json:"bytes_out"`
	BytesIn     int64   `json:"bytes_in"`
	PerAdmitted float64 `json:"bytes_per_admitted"`
	// Violations counts the devices over their quota (Result).
	Violations int `json:"violations"`
}

// clientResults sums the run per client, in the order of the mix.
// Publishing ended at end.
func clientResults(cfg Config, logs []DeviceLog, res Result, counts map[string]*clientCount, end time.Time) []ClientResult {
	byID := make(map[string]int, cfg.Devices) // device ID to its client's place
	out := make([]ClientResult, 0, len(cfg.clients))
	for _, c := range cfg.clients {
		out = append(out, ClientResult{Client: c.Client})
	}
	place := func(client string) int {
		return slices.IndexFunc(out, func(r ClientResult) bool { return r.Client == client })
	}
	for i := range cfg.Devices {
		byID[cfg.DeviceID(i)] = place(cfg.ClientOf(i))
	}
	lat := make([][]time.Duration, len(out))
	capacity := make([]float64, len(out))
	for _, l := range logs {
		k, ok := byID[l.Device]
		if !ok {
			continue
		}
		r := &out[k]
		r.Devices++
		r.Sent += len(l.Sent)
		first := make(map[uint64]time.Time, len(l.Arrivals))
		for _, a := range l.Arrivals {
			if t, seen := first[a.Seq]; !seen || a.At.Before(t) {
				first[a.Seq] = a.At
			}
		}
		for _, s := range l.Sent {
			switch s.Ack {
			case AckSuccess:
				r.Admitted++
				if at, ok := first[s.Seq]; ok {
					lat[k] = append(lat[k], at.Sub(s.At))
				}
			case AckRefused:
				r.Refused++
			}
		}
		if len(l.Sent) > 0 {
			rate := quotaRate(l)
			r.QuotaRate += rate
			capacity[k] += rate * end.Sub(l.Sent[0].At).Seconds()
		}
	}
	for _, d := range res.Devices {
		if k, ok := byID[d.Device]; ok && d.Violation() {
			out[k].Violations++
		}
	}
	span := cfg.Duration.Seconds()
	for k := range out {
		r := &out[k]
		if c := counts[r.Client]; c != nil {
			r.BytesOut, r.BytesIn = c.wire.out.Load(), c.wire.in.Load()
			r.Wanted = c.wanted.Load()
		}
		if r.Client != ClientAdaptive {
			r.Wanted = int64(r.Sent)
		}
		if r.Sent > 0 {
			r.RefusedShare = float64(r.Refused) / float64(r.Sent)
		}
		if r.Devices > 0 {
			r.Goodput = float64(r.Admitted) / float64(r.Devices) / span
			r.QuotaRate /= float64(r.Devices)
		}
		if capacity[k] > 0 {
			r.GoodputShare = float64(r.Admitted) / capacity[k]
		}
		if r.Admitted > 0 {
			r.PerAdmitted = float64(r.BytesOut+r.BytesIn) / float64(r.Admitted)
		}
		slices.Sort(lat[k])
		r.LatencyP50, r.LatencyP95, r.LatencyP99, r.LatencyMax = percentiles(lat[k])
	}
	return out
}

// quotaRate is what the device's quotas admit per second: per path (its
// own quota, each topic class it sent in), the tightest window's limit
// over its length, a byte window's in messages of the path's mean
// payload size; summed over the paths.
func quotaRate(l DeviceLog) float64 {
	size, n := map[string]int{}, map[string]int{}
	for _, s := range l.Sent {
		size[s.Class] += s.Size
		n[s.Class]++
	}
	total := 0.0
	for path, count := range n {
		q := l.Quota
		if path != "" {
			q = l.Classes[path]
		}
		best := -1.0
		for _, w := range q.Limits() {
			r := float64(w.N) / w.Window.Seconds()
			if w.Unit == devicelimit.Bytes {
				r /= max(float64(size[path])/float64(count), 1)
			}
			if best < 0 || r < best {
				best = r
			}
		}
		total += max(best, 0)
	}
	return total
}

// writeClients writes the per-client table.
func writeClients(w io.Writer, rs []ClientResult) error {
	fmt.Fprintf(w, "\nper client:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "client\tdevices\twanted\tsent\tadmitted\trefused\trefused %%\tgoodput/s\tquota/s\tof quota\tp50\tp99\tbytes out\tbytes in\tbytes/admitted\tviolations\t\n")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.3f\t%.3f\t%.1f%%\t%s\t%s\t%d\t%d\t%.0f\t%d\t\n",
			r.Client, r.Devices, r.Wanted, r.Sent, r.Admitted, r.Refused, 100*r.RefusedShare, r.Goodput, r.QuotaRate,
			100*r.GoodputShare, fmtMS(r.LatencyP50), fmtMS(r.LatencyP99), r.BytesOut, r.BytesIn, r.PerAdmitted, r.Violations)
	}
	return tw.Flush()
}
