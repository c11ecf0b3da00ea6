package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"time"
)

// spread is the median, min and max of some measurements.
type spread struct{ med, lo, hi float64 }

func spreadOf(v []float64) spread {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return spread{med, s[0], s[n-1]}
}

func (s spread) String() string {
	return fmt.Sprintf("%.0f (%.0f–%.0f)", s.med, s.lo, s.hi)
}

func column(rs []result, f func(result) float64) []float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return v
}

func received(r result) float64  { return r.ReceivedPS }
func delivered(r result) float64 { return r.DeliveredPS }

// cpuPerMsg is the server's CPU time per message received, in µs.
func cpuPerMsg(r result) float64 {
	return float64(r.CPU.Microseconds()) / float64(r.Published)
}

// printTable prints the results as Markdown: messages/s per target and
// QoS, then the goals' ratios, of medians and (in brackets) the range of
// the same ratio within each round.
func printTable(w io.Writer, o options, targets []target, results map[string][]result) {
	fmt.Fprintf(w, "\n%d publishers, %d subscribers, 64-byte payloads, QoS 1 window %d, %d rounds of %s; median (min–max)\n\n",
		o.publishers, o.subscribers, o.inflight, o.rounds, o.duration)
	fmt.Fprintln(w, "| QoS | broker | received msgs/s | delivered msgs/s | delivered/received | server CPU µs/msg |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, qos := range []int{0, 1} {
		for _, tg := range targets {
			rs := results[key(tg.name, qos)]
			rec, del := spreadOf(column(rs, received)), spreadOf(column(rs, delivered))
			share := spreadOf(column(rs, func(r result) float64 { return float64(r.Delivered) / float64(r.Published) }))
			cpu := spreadOf(column(rs, cpuPerMsg))
			fmt.Fprintf(w, "| %d | %s | %s | %s | %.2f | %.1f (%.1f–%.1f) |\n", qos, tg.name, rec, del, share.med, cpu.med, cpu.lo, cpu.hi)
		}
	}
	type goal struct {
		qos      int
		num, den string
		what     string  // received, delivered or CPU/msg
		want     float64 // a msgs/s ratio's floor, or a CPU/msg ratio's ceiling; 0: none
	}
	gw, half, pm, mq := targets[0].name, targets[1].name, targets[2].name, targets[3].name
	goals := []goal{
		{0, half, pm, "received", 0.95}, {1, half, pm, "received", 0.95},
		{0, gw, pm, "received", 0.95}, {1, gw, pm, "received", 0.95},
		{1, gw, mq, "received", 1.0}, {1, half, mq, "received", 1.0},
		{0, gw, mq, "received", 0}, {1, pm, mq, "received", 0},
		{0, gw, pm, "delivered", 0}, {1, gw, pm, "delivered", 0},
		{0, gw, pm, "CPU/msg", 1.02}, {1, gw, pm, "CPU/msg", 1.02},
		{0, half, pm, "CPU/msg", 0}, {1, half, pm, "CPU/msg", 0},
		{1, gw, mq, "CPU/msg", 0},
	}
	if len(targets) == 6 { // -baseline: this build against the other, same rounds
		bgw, bhalf := targets[4].name, targets[5].name
		for _, q := range []int{0, 1} {
			goals = append(goals, goal{q, gw, bgw, "received", 0}, goal{q, gw, bgw, "CPU/msg", 1.0},
				goal{q, half, bhalf, "CPU/msg", 1.0}, goal{q, bgw, pm, "CPU/msg", 0})
		}
	}
	fmt.Fprintln(w, "\n| QoS | ratio | of | median | per round | goal |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, g := range goals {
		f := map[string]func(result) float64{"received": received, "delivered": delivered, "CPU/msg": cpuPerMsg}[g.what]
		a, b := results[key(g.num, g.qos)], results[key(g.den, g.qos)]
		fmt.Fprintf(w, "| %d | %s / %s | %s | %s |\n", g.qos, g.num, g.den, g.what, ratioCells(a, b, f, g.want, g.what == "CPU/msg"))
	}
	fmt.Fprintln(w, "\nmsgs/s ratios above 1 and CPU/msg ratios below 1 favour the first broker. Server CPU is user+system time")
	fmt.Fprintln(w, "of all its threads during the round (/proc, 10 ms ticks); it depends less than msgs/s on what else the machine runs.")
}

// profile runs one more round against the gateway targets and plain
// mochi, each QoS, while the server's CPU profile is taken, and takes its
// allocation profile before and after the round (compare with go tool
// pprof -base).
func profile(ctx context.Context, dir string, o options, targets []target, pprofAddrs []string) error {
	if err := os.MkdirAll(o.profile, 0o755); err != nil {
		return err
	}
	files := []string{"gateway-all", "gateway-half", "plainmochi"}
	for _, qos := range []int{0, 1} {
		for i, tg := range targets {
			base := "http://" + pprofAddrs[i] + "/debug/pprof/"
			name := fmt.Sprintf("%s/%s-qos%d", o.profile, files[i], qos)
			if err := fetch(ctx, base+"allocs", name+".allocs-before.pprof"); err != nil {
				return err
			}
			cpu := make(chan error, 1)
			go func() {
				secs := int(o.duration / time.Second)
				cpu <- fetch(ctx, fmt.Sprintf("%sprofile?seconds=%d", base, max(1, secs)), name+".cpu.pprof")
			}()
			res, err := load(ctx, dir, o, tg, qos)
			if err != nil {
				return err
			}
			if err := <-cpu; err != nil {
				return err
			}
			if err := fetch(ctx, base+"allocs", name+".allocs.pprof"); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "profiled qos %d %-24s received %8.0f/s: %s.{cpu,allocs,allocs-before}.pprof\n", qos, tg.name, res.ReceivedPS, name)
		}
	}
	return nil
}

func fetch(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	return os.WriteFile(file, b, 0o644)
}

// ratioCells is a table's "median | per round | goal" cells for the
// ratio of a's f to b's: the ratio of the medians, the range of the
// ratio within each round, and the verdict against want (0: no goal), a
// floor or, when ceiling, a ceiling.
func ratioCells(a, b []result, f func(result) float64, want float64, ceiling bool) string {
	n := min(len(a), len(b))
	per := make([]float64, n)
	for i := range n {
		per[i] = f(a[i]) / f(b[i])
	}
	den := spreadOf(column(b, f)).med
	if den == 0 {
		return "— | — | no figure to divide by (the second measured 0)"
	}
	ratio := spreadOf(column(a, f)).med / den
	p := spreadOf(per)
	verdict := "—"
	switch {
	case want > 0 && ceiling:
		verdict = fmt.Sprintf("≤ %.2f: %s", want, metOrNot(ratio <= want))
	case want > 0:
		verdict = fmt.Sprintf("≥ %.2f: %s", want, metOrNot(ratio >= want))
	}
	return fmt.Sprintf("%.2f | %.2f–%.2f | %s", ratio, p.lo, p.hi, verdict)
}

func metOrNot(ok bool) string { return map[bool]string{true: "met", false: "not met"}[ok] }
