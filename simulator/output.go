package simulator

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
)

// The simulate command's outputs besides the summary: the report files
// and the progress line (cmd/gateway/simulate.go prints them).

// SaveJSON writes r as indented JSON to the file name, or to stdout when
// name is "-".
func (r *Report) SaveJSON(name string, stdout io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if name == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(name, b, 0o644)
}

// SaveHTML writes the HTML report to the file name.
func (r *Report) SaveHTML(name string) error {
	file, err := os.Create(name)
	if err != nil {
		return err
	}
	err = r.WriteHTML(file)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	return err
}

// ProgressLine returns a Progress callback that redraws one line on w:
// connected devices, messages and refusals per second since the last
// call, devices over quota so far.
func ProgressLine(w io.Writer) func(Progress) {
	var last Progress
	return func(p Progress) {
		dt := (p.Elapsed - last.Elapsed).Seconds()
		if dt <= 0 {
			dt = 1
		}
		fmt.Fprintf(w, "\r\033[K%5.0fs  connected %s  sent/s %s  refused/s %s  over quota %d",
			p.Elapsed.Seconds(), strconv.Itoa(p.Connected),
			strconv.FormatFloat(float64(p.Sent-last.Sent)/dt, 'f', 0, 64),
			strconv.FormatFloat(float64(p.Refused-last.Refused)/dt, 'f', 0, 64), p.Over)
		last = p
	}
}

// LostHint explains lost messages in a run against a gateway the
// simulator did not start (remote): its subscriber takes every device's
// messages, and unless the gateway names it a backend consumer its
// queue is a plain subscriber's, whose overflow the gateway drops.
// Empty when nothing was lost, or the gateway is the simulator's own
// (which names its subscriber itself).
func (r *Report) LostHint(remote bool) string {
	n := r.Result.Totals.Lost
	if n == 0 || !remote || r.SubscriberLost {
		return ""
	}
	return fmt.Sprintf("%d acknowledged messages never reached the subscriber; if the gateway's devicegate_slow_subscriber_drops_total grew by as many, "+
		"its queue for the subscriber overflowed: name the subscriber a backend consumer in the gateway's configuration "+
		"(mqtt.consumers: {client_ids: [\"simulator-sub-*\"]}, or the --sub-client-id or username it uses; docs/simulator.md)", n)
}
