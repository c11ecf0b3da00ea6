package simulator

import (
	"fmt"
	"io"
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
	verdict := "OK"
	if !r.Verdict.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\n%s: %d devices over quota (excess %d in all, at most %d), %d lost, %d leaked, %d phantom; %d connect failures, %d disconnects; tolerance %s\n",
		verdict, t.Violations, t.ExcessTotal, t.MaxExcess, t.Lost, t.Leaked, t.Phantom, r.ConnectFailures, r.Disconnects, r.Result.Tolerance)
	if r.SubscriberLost {
		fmt.Fprintf(w, "the subscriber lost its connection: arrivals after that were not seen\n")
	}
	worst := Worst(r.Result, 10)
	if len(worst) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nworst devices:\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "device\tquota\tmax in T\texcess\tlost\tleaked\tphantom\tsent\tp99\t\n")
	for _, d := range worst {
		fmt.Fprintf(tw, "%s\t%d/%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			d.Device, d.Limit, d.WindowNS, d.MaxInWindow, d.Excess, d.Lost, d.Leaked, d.Phantom, d.Sent, fmtMS(d.LatencyP99))
	}
	return tw.Flush()
}

// fmtMS formats d in milliseconds with a tenth.
func fmtMS(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
