package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"
)

// Mode feedback (make bench-feedback): the cost of device feedback
// (docs/device-feedback.md). Two gateways, alike but for the default
// quota's feedback (off, always), take the same MQTT 5 QoS 1 load
// (loadgen -v5), in interleaved rounds with the order rotated; the
// table gives each one's server CPU per message and the ratio of the
// medians.

// feedbackModes are the gateways compared, the baseline first.
var feedbackModes = []string{"off", "always"}

func feedbackBench(ctx context.Context, dir string, o options) error {
	var targets []target
	for _, mode := range feedbackModes {
		sub := dir + "/fb-" + mode
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		conf := sub + "/gateway.yaml"
		text := strings.Replace(fmt.Sprintf(gatewayConfig, sub+"/data"), "policy: drop}", "policy: drop, feedback: "+mode+"}", 1)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return err
		}
		p, err := start(sub, "gateway", nil, dir+"/gateway", "serve", "--config", conf)
		if err != nil {
			return err
		}
		defer p.stop()
		addr, err := p.waitLog(regexp.MustCompile(`msg="mqtt listening" addr=(\S+)`), 15*time.Second)
		if err != nil {
			return err
		}
		targets = append(targets, target{name: "gateway, feedback " + mode, addr: addr, proc: p})
	}
	results := map[string][]result{}
	for r := range o.rounds {
		for i := range targets {
			tg := targets[(i+r)%len(targets)]
			res, err := loadgen(ctx, dir, o, tg.proc, "-addr", tg.addr, "-qos", "1", "-v5",
				"-subscribers", fmt.Sprint(o.subscribers), "-duration", o.duration.String())
			if err != nil {
				return fmt.Errorf("%s: %w", tg.name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-24s received %8.0f/s server CPU %5.1f µs/msg\n", r+1, tg.name, res.ReceivedPS, cpuPerMsg(res))
			results[tg.name] = append(results[tg.name], res)
		}
	}
	printFeedbackTable(os.Stdout, o, targets, results)
	return nil
}

// printFeedbackTable prints the medians and the ratio of CPU per
// message to the first target's, with the load average.
func printFeedbackTable(w io.Writer, o options, targets []target, results map[string][]result) {
	fmt.Fprintf(w, "\n%d MQTT 5 publishers, %d subscribers, 64-byte payloads, QoS 1 window %d, %d rounds of %s; median (min–max)\n\n",
		o.publishers, o.subscribers, o.inflight, o.rounds, o.duration)
	fmt.Fprintln(w, "| broker | received msgs/s | server CPU µs/msg | CPU/msg ÷ feedback off |")
	fmt.Fprintln(w, "|---|---|---|---|")
	base := spreadOf(column(results[targets[0].name], cpuPerMsg)).med
	for _, tg := range targets {
		rs := results[tg.name]
		cpu := spreadOf(column(rs, cpuPerMsg))
		fmt.Fprintf(w, "| %s | %s | %.1f (%.1f–%.1f) | %.2f |\n", tg.name, spreadOf(column(rs, received)), cpu.med, cpu.lo, cpu.hi, cpu.med/base)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(w, "\nload average at the end: %s", b)
	}
}
