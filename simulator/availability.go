package simulator

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// What a restart cost the fleet in availability: for each device that
// sent after it, how long it was refused (from its first publish after
// the restart to its first admitted one: reconnecting and the device's
// own pace are not the gateway's doing; publishes the restart cut off
// before their answer are not decisions), and how much of its quota the
// restart took, as the refusals its own windows (the checker's count of
// its first arrivals) had room for.

// ReadmittedWithin is the time refused after a restart the summary
// counts devices admitted again within.
const ReadmittedWithin = 2 * time.Second

// DeviceRestart is one device's availability after one restart.
type DeviceRestart struct {
	Device string `json:"device"`
	// Readmitted is from the device's first publish after the restart
	// to its first admitted one (0: the first was admitted); -1 when
	// none was admitted.
	Readmitted time.Duration `json:"readmitted_ns"`
	// Lost counts the device's messages refused after the restart,
	// within its longest window, while every window of its own quota
	// had room for them: quota the restart took.
	Lost int `json:"lost"`
}

// RestartAvailability sums up the devices' availability after one
// restart.
type RestartAvailability struct {
	// Devices counts the devices that sent after the restart.
	Devices int `json:"devices"`
	// Within counts those admitted again within ReadmittedWithin;
	// Never those never admitted again.
	Within int `json:"within"`
	Never  int `json:"never"`
	// P50, P99 and Max are of Readmitted over the devices admitted
	// again.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// Lost is DeviceRestart.Lost summed over the devices; MaxLost the
	// largest of a device; LostDevices the devices that lost any.
	Lost        int `json:"lost"`
	MaxLost     int `json:"max_lost"`
	LostDevices int `json:"lost_devices"`
	// PerDevice lists every device that sent after the restart.
	PerDevice []DeviceRestart `json:"per_device"`
}

// availability measures each restart's cost from the devices' logs.
func availability(logs []DeviceLog, restarts []RestartEvent) []RestartAvailability {
	out := make([]RestartAvailability, 0, len(restarts))
	for i, ev := range restarts {
		back := ev.At.Add(ev.Took)
		end := time.Time{}
		if i+1 < len(restarts) {
			end = restarts[i+1].At
		}
		var ra RestartAvailability
		var delays []time.Duration
		for _, l := range logs {
			d, ok := deviceRestart(l, ev.At, back, end)
			if !ok {
				continue
			}
			ra.Devices++
			ra.PerDevice = append(ra.PerDevice, d)
			ra.Lost += d.Lost
			ra.MaxLost = max(ra.MaxLost, d.Lost)
			if d.Lost > 0 {
				ra.LostDevices++
			}
			if d.Readmitted < 0 {
				ra.Never++
				continue
			}
			delays = append(delays, d.Readmitted)
			if d.Readmitted <= ReadmittedWithin {
				ra.Within++
			}
		}
		if n := len(delays); n > 0 {
			slices.Sort(delays)
			ra.P50, ra.P99, ra.Max = delays[n/2], delays[min(n-1, n*99/100)], delays[n-1]
		}
		slices.SortFunc(ra.PerDevice, func(a, b DeviceRestart) int { return strings.Compare(a.Device, b.Device) })
		out = append(out, ra)
	}
	return out
}

// deviceRestart measures one device after the restart that began at
// at and was back at back (until end, the next restart; zero: none);
// false when it sent nothing after it.
func deviceRestart(l DeviceLog, at, back, end time.Time) (DeviceRestart, bool) {
	d := DeviceRestart{Device: l.Device, Readmitted: -1}
	limits := l.Quota.Limits()
	longest := time.Duration(0)
	for _, w := range limits {
		longest = max(longest, w.Window)
	}
	arrived := ownArrivals(l)
	var first time.Time // the device's first publish after the restart
	for _, s := range l.Sent {
		if s.At.Before(at) || !end.IsZero() && !s.At.Before(end) || s.Class != "" || s.Ack == AckNone {
			continue // unanswered (cut off by the restart): no decision seen
		}
		if first.IsZero() || s.At.Before(first) {
			first = s.At
		}
	}
	for _, s := range l.Sent {
		if s.At.Before(at) || !end.IsZero() && !s.At.Before(end) || s.Class != "" {
			continue
		}
		switch s.Ack {
		case AckSuccess:
			if r := s.At.Sub(first); d.Readmitted < 0 || r < d.Readmitted {
				d.Readmitted = r
			}
		case AckRefused:
			if s.At.Sub(back) <= longest && roomFor(arrived, limits, s) {
				d.Lost++
			}
		}
	}
	return d, !first.IsZero()
}

// ownArrivals returns the first arrival of each of the device's
// messages in its own quota, with its size, by time.
func ownArrivals(l DeviceLog) []point {
	size := make(map[uint64]int, len(l.Sent))
	for _, s := range l.Sent {
		if s.Class == "" {
			size[s.Seq] = s.Size
		} else {
			size[s.Seq] = -1
		}
	}
	first, _ := firstArrivals(l.Arrivals)
	pts := make([]point, 0, len(first))
	for seq, at := range first {
		if n := size[seq]; n >= 0 {
			pts = append(pts, point{at: at, size: n})
		}
	}
	slices.SortFunc(pts, func(a, b point) int { return a.at.Compare(b.at) })
	return pts
}

// roomFor reports whether every window had room for s by the first
// arrivals of the device's admitted messages in the window before it.
func roomFor(arrived []point, limits []devicelimit.Limit, s Sent) bool {
	for _, w := range limits {
		used := 0
		for _, p := range arrived {
			if p.at.After(s.At) {
				break
			}
			if s.At.Sub(p.at) < w.Window {
				used += w.Units(p.size)
			}
		}
		if used+w.Units(s.Size) > w.N {
			return false
		}
	}
	return true
}

// writeAvailability prints each restart's availability for the summary.
func writeAvailability(w io.Writer, as []RestartAvailability) {
	for i, a := range as {
		if a.Devices == 0 {
			continue
		}
		fmt.Fprintf(w, "after restart %d: %d of %d devices (%.1f%%) admitted within %s of their first publish after it (refused for p50 %s, p99 %s, max %s), %d never; quota lost to the restart: %d messages in all, at most %d per device, %d devices lost any\n",
			i+1, a.Within, a.Devices, 100*float64(a.Within)/float64(a.Devices), ReadmittedWithin, fmtMS(a.P50), fmtMS(a.P99), fmtMS(a.Max), a.Never, a.Lost, a.MaxLost, a.LostDevices)
	}
}
