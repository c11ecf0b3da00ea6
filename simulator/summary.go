package simulator

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteSummary writes a text table for people: the run's totals, the
// verdict, and the worst 10 devices by excess, then unexpected faults.
// Errors writing to w are returned.
func (r *Report) WriteSummary(w io.Writer) error {
	t := r.Result.Totals
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "devices\tsent\tacked\taccepted\trefused\tdeferred\tpending\tlost\tunacked\tdup\tp50\tp95\tp99\tviolations\t\n")
	fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t\n",
		t.Devices, t.Sent, t.Acked, t.Accepted, t.Refused, t.Deferred, t.Pending, t.Lost, t.Unacked, t.Duplicated,
		fmtMS(t.LatencyP50), fmtMS(t.LatencyP95), fmtMS(t.LatencyP99), t.Violations)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nsent %d = accepted %d + refused %d + deferred %d (released %d, pending %d) + lost %d + unacked %d (arrived %d)\n",
		t.Sent, t.Accepted, t.Refused, t.Deferred, t.Released, t.Pending, t.Lost, t.Unacked, t.UnackedArrived)
	if u := r.Simulator; u.PeakRSS > 0 && t.Devices > 0 {
		fmt.Fprintf(w, "simulator process: peak RSS %.1f MiB (%.1f KB per device), CPU %s\n",
			float64(u.PeakRSS)/(1<<20), float64(u.PeakRSS)/1024/float64(t.Devices), u.CPU.Round(time.Millisecond))
	}
	if c := r.PubackConnected; c.LatencyMax > 0 {
		fmt.Fprintf(w, "PUBACK once every device was connected (after %s): p50 %s, p95 %s, p99 %s, max %s\n",
			fmtMS(r.AllConnected), fmtMS(c.LatencyP50), fmtMS(c.LatencyP95), fmtMS(c.LatencyP99), fmtMS(c.LatencyMax))
	}
	if c := r.Connect; c.LatencyMax > 0 {
		fmt.Fprintf(w, "first connections, dial to CONNACK: p50 %s, p95 %s, p99 %s, max %s\n",
			fmtMS(c.LatencyP50), fmtMS(c.LatencyP95), fmtMS(c.LatencyP99), fmtMS(c.LatencyMax))
	}
	if r.Reconnects > 0 {
		fmt.Fprintf(w, "%d reconnections\n", r.Reconnects)
	}
	for _, ev := range r.Restarts {
		fmt.Fprintf(w, "gateway restart (%s) at %s, back after %s", ev.Mode, fmtMS(ev.At.Sub(r.Started)), fmtMS(ev.Took))
		if ev.Err != "" {
			fmt.Fprintf(w, ": %s", ev.Err)
		}
		fmt.Fprintln(w)
	}
	writeAvailability(w, r.Availability)
	if r.Config.SubAddr != "" {
		fmt.Fprintf(w, "arrivals counted upstream at %s: %d duplicated, %d out of order\n", r.Config.SubAddr, t.Duplicated, t.OutOfOrder)
	} else if t.OutOfOrder > 0 {
		fmt.Fprintf(w, "%d messages arrived out of order\n", t.OutOfOrder)
	}
	for _, ev := range r.Outages {
		fmt.Fprintf(w, "upstream link down at %s for %s\n", fmtMS(ev.At.Sub(r.Started)), fmtMS(ev.Took))
	}
	if r.Config.CrashLoss > 0 {
		fmt.Fprintf(w, "persistence bound: a device may exceed its quota by what reached the subscriber in the %s before a crash; %s exceeded it within that bound, %d beyond it\n",
			r.Config.CrashLoss+r.Result.Tolerance, devicesN(t.WithinBound), t.Violations)
	}
	if t.Unconfirmed > 0 {
		fmt.Fprintf(w, "%s had more arrivals in a window than their quota, but their send and ack times do not confirm it: late deliveries arriving together (latency p99 %s), not counted as violations\n",
			devicesN(t.Unconfirmed), fmtMS(t.LatencyP99))
	}
	verdict := "OK"
	if !r.Verdict.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\n%s: %s over quota (excess at the subscriber %d in all, at most %d), %d lost, %d leaked, %d phantom; %d connect failures, %d disconnects; tolerance %s\n",
		verdict, devicesN(t.Violations), t.ExcessTotal, t.MaxExcess, t.Lost, t.Leaked, t.Phantom, r.ConnectFailures, r.Disconnects, r.Result.Tolerance)
	for _, g := range r.Result.Groups {
		state := "OK"
		if g.Violated {
			state = "OVER ITS LIMIT"
		}
		for _, gw := range g.Windows {
			fmt.Fprintf(w, "group %s (%s): %s: %s\n", g.Group, devicesN(g.Devices), gw.describe(), state)
		}
	}
	if n := len(r.Blocked); n > 0 {
		shown := r.Blocked[:min(n, 10)]
		fmt.Fprintf(w, "%s blocked by the gateway (automatic blocking) and stopped: %s\n", devicesWere(n), strings.Join(shown, ", "))
	}
	if r.RefusedAtConnect > 0 {
		fmt.Fprintf(w, "%s refused at CONNECT for their credentials or client ID (see the errors); nothing was sent for them\n", devicesWere(r.RefusedAtConnect))
	}
	if r.SubscriberLost {
		fmt.Fprintf(w, "the subscriber lost its connection: arrivals after that were not seen\n")
	}
	if len(r.Clients) > 1 || len(r.Clients) == 1 && r.Clients[0].Client == ClientAdaptive {
		if err := writeClients(w, r.Clients); err != nil {
			return err
		}
	}
	worst := Worst(r.Result, 10)
	if len(worst) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nworst devices:\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "device\tquota\tmax in T\texcess\tallowed\tlost\tleaked\tphantom\tsent\tp99\t\n")
	for _, d := range worst {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			d.Device, d.judgedQuota(), d.MaxInWindow, d.Excess, d.Allowance, d.Lost, d.Leaked, d.Phantom, d.Sent, fmtMS(d.LatencyP99))
	}
	return tw.Flush()
}

// judgedQuota names the window the device is judged by: "5/1s:drop",
// or of several, "800 bytes/1s:drop", "2/1s:drop (class alarms)".
func (d DeviceResult) judgedQuota() string {
	q := fmt.Sprintf("%d/%s:%s", d.Limit, d.WindowNS, d.Policy)
	if d.JudgedWindow >= len(d.Windows) {
		return q
	}
	w := d.Windows[d.JudgedWindow]
	if w.Unit == "bytes" {
		q = fmt.Sprintf("%d bytes/%s:%s", d.Limit, d.WindowNS, d.Policy)
	}
	if w.Class != "" {
		q += " (class " + w.Class + ")"
	}
	return q
}

// fmtMS formats d in milliseconds with a tenth.
func fmtMS(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// devicesN is "1 device" or "N devices".
func devicesN(n int) string {
	if n == 1 {
		return "1 device"
	}
	return fmt.Sprintf("%d devices", n)
}

// devicesWere is "1 device was" or "N devices were".
func devicesWere(n int) string {
	if n == 1 {
		return "1 device was"
	}
	return fmt.Sprintf("%d devices were", n)
}
