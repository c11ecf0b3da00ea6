// Time-series charts in inline SVG: axes with times and values,
// gridlines, a logarithmic value scale (so a spike does not flatten the
// usual traffic) and marks on the slots a series flags (refusals).
"use strict";

const CHART_W = 900, CHART_H = 200, CHART_L = 46, CHART_R = 44, CHART_B = 22, CHART_T = 14;

// logY maps v >= 0 to a height on a log scale topped by top.
function logY(v, top) { return CHART_T + (CHART_H - CHART_T) * (1 - Math.log10(1 + Math.max(0, v)) / Math.log10(1 + top)); }

function fmtCount(n) { return n >= 1e6 ? (n / 1e6) + "M" : n >= 1e3 ? (n / 1e3) + "k" : String(n); }

function fmtClock(ms, withDate) {
  const s = new Date(ms).toISOString();
  return withDate ? s.slice(5, 10) + " " + s.slice(11, 16) : s.slice(11, 16);
}

// timeChart draws series (each {name, cls, color, values}) over slots of
// stepMs from startMs; marks are slot indexes flagged (drawn as red
// ticks above the plot, titled with markLabel(i)); unit names the
// values ("messages / min"). opts.id names the figure.
function timeChart(opts) {
  const { id, startMs, stepMs, series, marks, markLabel, unit, label, pct } = opts;
  const n = Math.max(1, ...series.map(s => s.values.length));
  let max = 0;
  for (const s of series) if (!s.pct) for (const v of s.values) max = Math.max(max, v);
  let top = 10;
  while (top < max) top *= 10;
  const g = svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H + CHART_B}`, role: "img", "aria-label": label + ", logarithmic scale up to " + fmtCount(top) + " " + unit });
  g.append(svg("title", {}, label));
  const right = CHART_W - CHART_R;
  const x = (i) => CHART_L + (right - CHART_L) * (i + 0.5) / n;
  const pctY = (v) => CHART_T + (CHART_H - CHART_T) * (1 - v / 100);
  // Gridlines and value labels: 0, then every power of ten.
  for (let v = 0; v <= top; v = v === 0 ? 1 : v * 10) {
    const y = logY(v, top);
    g.append(svg("line", { x1: CHART_L, y1: y, x2: right, y2: y, class: v === 0 ? "axis" : "grid" }));
    g.append(svg("text", { x: CHART_L - 4, y: y + 4, "text-anchor": "end", class: "tick" }, fmtCount(v)));
  }
  if (pct) { // a percent series on its own right-hand scale
    g.append(svg("line", { x1: right, y1: CHART_T, x2: right, y2: CHART_H, class: "axis" }));
    for (const v of [0, 50, 100]) g.append(svg("text", { x: right + 4, y: pctY(v) + 4, class: "tick" }, v + " %"));
  }
  g.append(svg("line", { x1: CHART_L, y1: CHART_T, x2: CHART_L, y2: CHART_H, class: "axis" }));
  // Time labels: about six along the axis.
  const every = Math.max(1, Math.round(n / 6));
  for (let i = n - 1; i >= 0; i -= every) {
    const at = startMs + i * stepMs;
    g.append(svg("line", { x1: x(i), y1: CHART_H, x2: x(i), y2: CHART_H + 4, class: "axis" }));
    g.append(svg("text", { x: Math.min(x(i), right - 36), y: CHART_H + 16, "text-anchor": "middle", class: "tick" }, fmtClock(at, stepMs >= 3600e3)));
  }
  for (const s of series) {
    const pts = s.values.map((v, i) => x(i).toFixed(1) + "," + (s.pct ? pctY(v) : logY(v, top)).toFixed(1)).join(" ");
    g.append(svg("polyline", { points: pts, fill: "none", stroke: s.color, "stroke-width": 2, class: "series-" + s.cls, "stroke-dasharray": s.pct ? "4 3" : "" }));
  }
  for (const i of marks || []) {
    const m = svg("rect", { x: x(i) - 2, y: 2, width: 4, height: CHART_T - 4, class: "mark" });
    m.append(svg("title", {}, markLabel ? markLabel(i) : ""));
    g.append(m);
  }
  return el("figure", { class: "chart", id },
    el("figcaption", {}, label, el("span", { class: "muted" }, " (" + unit + ", log scale" + (marks && marks.length ? "; red marks: refusals" : "") + ")")),
    g,
    el("div", { class: "legend" }, series.map(s => el("span", { class: "s-" + s.cls }, s.name))));
}
