package simulator

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// WriteHTML writes r as one self-contained HTML page: the totals and
// verdict, and three inline SVG charts (fleet throughput over time by
// outcome, a histogram of each device's largest window count as a share
// of its limit, latency percentiles). Nothing is fetched from the
// network: no scripts, styles, fonts or images from elsewhere.
func (r *Report) WriteHTML(w io.Writer) error {
	t := r.Result.Totals
	verdict := "OK"
	if !r.Verdict.OK {
		verdict = "FAIL"
	}
	quota := r.Config.Quota.String()
	if len(r.Config.Mix) > 0 {
		quota = FormatMix(r.Config.Mix)
	}
	var summary strings.Builder
	_ = r.WriteSummary(&summary)
	data := map[string]any{
		"Verdict":    verdict,
		"OK":         r.Verdict.OK,
		"Started":    r.Started.UTC().Format(time.RFC3339),
		"Took":       r.Finished.Sub(r.Started).Round(time.Millisecond).String(),
		"Devices":    t.Devices,
		"Quota":      quota,
		"Summary":    summary.String(),
		"Throughput": template.HTML(throughputSVG(r)),
		"Histogram":  template.HTML(histogramSVG(r.Result)),
		"Latency":    template.HTML(latencySVG(t.Latency)),
	}
	return reportTemplate.Execute(w, data)
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>devicegate simulation: {{.Verdict}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1000px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.ok { color: #1a7f37; } .fail { color: #c62828; }
pre { background: #f5f5f5; padding: 12px; white-space: pre-wrap; font-size: 12px; }
svg { background: #fff; border: 1px solid #ddd; }
svg text { font: 11px sans-serif; fill: #333; }
</style></head><body>
<h1>devicegate simulation: <span class="{{if .OK}}ok{{else}}fail{{end}}">{{.Verdict}}</span></h1>
<p>{{.Devices}} devices, quota {{.Quota}}, started {{.Started}}, took {{.Took}}.</p>
<h2>Fleet throughput over time, by outcome</h2>
{{.Throughput}}
<h2>Largest count in any window, per device, against its limit</h2>
<p>Arrivals in a window, or, where fewer, the admissions that send and ack times confirm within one.</p>
{{.Histogram}}
<h2>End-to-end latency (send to arrival)</h2>
{{.Latency}}
<h2>Summary</h2>
<pre>{{.Summary}}</pre>
</body></html>
`))

// chart geometry shared by the charts.
const (
	chartW, chartH = 900, 300
	padL, padR     = 60, 150
	padT, padB     = 20, 40
)

// series colours by outcome, in stacking order.
var outcomeSeries = []struct{ name, color string }{
	{"accepted", "#2e7d32"}, {"deferred", "#1565c0"}, {"refused", "#ef6c00"}, {"lost", "#c62828"}, {"unacked", "#9e9e9e"},
}

func throughputSVG(r *Report) string {
	tl := r.Result.Timeline
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" id="throughput" width="%d" height="%d" viewBox="0 0 %d %d">`, chartW, chartH, chartW, chartH)
	if tl == nil || len(tl.Accepted) == 0 {
		b.WriteString(`<text x="60" y="40">no messages sent</text></svg>`)
		return b.String()
	}
	series := [][]int{tl.Accepted, tl.Deferred, tl.Refused, tl.Lost, tl.Unacked}
	n := len(tl.Accepted)
	perSec := float64(time.Second) / float64(tl.BinNS)
	peak := 0.0
	for i := range n {
		sum := 0
		for _, s := range series {
			sum += s[i]
		}
		peak = math.Max(peak, float64(sum)*perSec)
	}
	top := niceCeil(peak)
	plotW, plotH := float64(chartW-padL-padR), float64(chartH-padT-padB)
	axes(&b, top, "msgs/s")
	bw := plotW / float64(n)
	for i := range n {
		y := float64(chartH - padB)
		for k, s := range series {
			if s[i] == 0 {
				continue
			}
			h := float64(s[i]) * perSec / top * plotH
			y -= h
			fmt.Fprintf(&b, `<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %d</title></rect>`,
				outcomeSeries[k].name, float64(padL)+float64(i)*bw, y, math.Max(bw-1, 0.5), h, outcomeSeries[k].color, outcomeSeries[k].name, s[i])
		}
	}
	// x labels: about 8 ticks in seconds since the start.
	span := time.Duration(n) * tl.BinNS
	digits := 0
	if span < 10*time.Second {
		digits = 1
	}
	for k := 0; k <= 8; k++ {
		x := float64(padL) + plotW*float64(k)/8
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.*fs</text>`, x, chartH-padB+16, digits, (span * time.Duration(k) / 8).Seconds())
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time since the first message (bins of %s)</text>`, padL+int(plotW)/2, chartH-6, tl.BinNS)
	for _, ev := range r.Restarts {
		x := float64(padL) + plotW*float64(ev.At.Sub(tl.Start))/float64(span)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-dasharray="4 3"/><text x="%.1f" y="%d">restart (%s)</text>`,
			x, padT, x, chartH-padB, x+3, padT+12, template.HTMLEscapeString(ev.Mode))
	}
	for _, ev := range r.Outages {
		x0 := float64(padL) + plotW*float64(ev.At.Sub(tl.Start))/float64(span)
		x1 := float64(padL) + plotW*float64(ev.At.Add(ev.Took).Sub(tl.Start))/float64(span)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#000" fill-opacity="0.08"/><text x="%.1f" y="%d">upstream down</text>`,
			x0, padT, max(x1-x0, 1), chartH-padB-padT, x0+3, padT+26)
	}
	y := padT
	for _, s := range outcomeSeries {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`, chartW-padR+16, y, s.color, chartW-padR+34, y+10, s.name)
		y += 18
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// histogramBins are the buckets of MaxInWindow / Limit, in percent: up
// to 10%, ..., up to 100%, and over 100% (a violation or a crash's
// allowed excess).
const histogramBins = 11

func histogramSVG(res Result) string {
	// The last bucket is split: violations (red) under the devices
	// over their limit within a crash's allowance (amber).
	counts := make([]int, histogramBins)
	violations := 0
	for _, d := range res.Devices {
		if d.Limit <= 0 {
			continue
		}
		pct := 100 * float64(d.Judged()) / float64(d.Limit)
		i := min(max(int(math.Ceil(pct/10))-1, 0), histogramBins-1)
		counts[i]++
		if i == histogramBins-1 && d.Violation() {
			violations++
		}
	}
	peak := 0
	for _, c := range counts {
		peak = max(peak, c)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" id="histogram" width="%d" height="%d" viewBox="0 0 %d %d">`, chartW, chartH, chartW, chartH)
	top := niceCeil(float64(peak))
	axes(&b, top, "devices")
	plotW, plotH := float64(chartW-padL-padR), float64(chartH-padT-padB)
	bw := plotW / histogramBins
	for i, c := range counts {
		color, label := "#2e7d32", fmt.Sprintf("≤%d%%", (i+1)*10)
		if i == histogramBins-1 {
			color, label = "#c62828", "over 100%"
		}
		total := c
		h := float64(c) / top * plotH
		x := float64(padL) + float64(i)*bw
		if i == histogramBins-1 && c > violations {
			// Within the allowance of a crash: not violations.
			hw := float64(c-violations) / top * plotH
			fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f9a825"><title>%s, within a crash's allowance: %d devices</title></rect>`,
				x+2, float64(chartH-padB)-h, bw-4, hw, label, c-violations)
			h -= hw
			c = violations
		}
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s: %d devices</title></rect>`,
			x+2, float64(chartH-padB)-h, bw-4, h, color, label, c)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x+bw/2, chartH-padB+16, label)
		if total > 0 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`, x+bw/2, float64(chartH-padB)-float64(total)/top*plotH-4, total)
		}
	}
	limitX := float64(padL) + 10*bw
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c62828" stroke-width="2"/><text x="%.1f" y="%d" fill="#c62828" text-anchor="end">limit</text>`,
		limitX, padT, limitX, chartH-padB, limitX-4, padT+12)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">largest count in any window of T, as a share of the device's limit</text>`, padL+int(plotW)/2, chartH-6)
	b.WriteString(`</svg>`)
	return b.String()
}

func latencySVG(l Latency) string {
	vals := []struct {
		name string
		d    time.Duration
	}{{"p50", l.LatencyP50}, {"p95", l.LatencyP95}, {"p99", l.LatencyP99}, {"max", l.LatencyMax}}
	const h = 160
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" id="latency" width="%d" height="%d" viewBox="0 0 %d %d">`, chartW, h, chartW, h)
	peak := niceCeil(float64(l.LatencyMax) / float64(time.Millisecond))
	plotW := float64(chartW - padL - padR)
	for i, v := range vals {
		ms := float64(v.d) / float64(time.Millisecond)
		y := 15 + i*34
		wd := ms / peak * plotW
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, padL-8, y+17, v.name)
		fmt.Fprintf(&b, `<rect class="bar" x="%d" y="%d" width="%.1f" height="24" fill="#1565c0"><title>%s %.1f ms</title></rect>`, padL, y, math.Max(wd, 1), v.name, ms)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.1f ms</text>`, float64(padL)+math.Max(wd, 1)+6, y+17, ms)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// axes draws the y axis from 0 to top with five grid lines, and the x
// axis.
func axes(b *strings.Builder, top float64, unit string) {
	for k := 0; k <= 5; k++ {
		y := float64(chartH-padB) - float64(chartH-padT-padB)*float64(k)/5
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`,
			padL, y, chartW-padR, y, padL-6, y+4, trimFloat(top*float64(k)/5))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(b, `<text x="12" y="%d" transform="rotate(-90 12 %d)" text-anchor="middle">%s</text>`, chartH/2, chartH/2, unit)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten; at least 1.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}
