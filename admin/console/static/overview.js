// The overview: the fleet's gauges, its publish rates, the forward
// destinations with their dead letters, and the data file's health.
"use strict";

const SERIES = [["admitted", "#2e7d32"], ["refused", "#c62828"], ["deferred", "#ef8f00"], ["would_refuse", "#6a4fc2"]];

// deadByReason says a destination's dead letters: "3 held; moved since
// start: 2 refused, 1 too large".
function deadByReason(u) {
  const by = Object.entries(u.dead_letters_by_reason || {}).filter(([, n]) => n > 0).map(([r, n]) => n + " " + r);
  return (u.dead_letters || 0) + " held" + (by.length ? "; since start: " + by.join(", ") : "");
}

pages.overview = { title: "Overview", render: async (ctx) => {
  const [rates, fwd, health] = await Promise.all([
    ctx.get("/api/v1/rates"), ctx.get("/api/v1/forward"),
    fetch("/healthz", { cache: "no-store" }).then(r => r.json()).catch(() => ({ status: "unreachable" })),
  ]);
  if (!ctx.live()) return;
  if (ctx.first) {
    ctx.s = { cards: el("div", { class: "cards" }), chart: el("div", {}), fwd: el("div", {}), persist: el("p", { id: "persist" }) };
    show(ctx.page, el("h1", {}, "Overview"), ctx.s.cards, el("h2", {}, "Publishes per second, last 15 minutes"), ctx.s.chart,
      el("h2", {}, el("a", { href: "#/forwarding" }, "Forwarding")), ctx.s.fwd, el("h2", {}, "Persistence"), ctx.s.persist);
  }
  const last = rates.samples.length ? rates.samples[rates.samples.length - 1] : { admitted: 0, refused: 0, deferred: 0, would_refuse: 0 };
  const card = (id, href, value, label) => el("a", { class: "card", href, id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
  update(ctx.s.cards,
    card("card-connected", "#/devices?filter=connected", rates.connected, "clients connected"),
    card("card-admitted", "#/devices?sort=rate", fmtRate(last.admitted), "admitted / s"),
    card("card-refused", "#/devices?filter=throttled&sort=refusals", fmtRate(last.refused), "refused / s"),
    card("card-deferred", "#/devices?filter=deferring&sort=deferred", fmtRate(last.deferred), "deferred / s"),
    card("card-would-refuse", "#/rules", fmtRate(last.would_refuse), "would refuse / s (shadow)"),
    card("card-blocked", "#/blocks", rates.blocked, "devices blocked"),
    card("card-tracked", "#/devices", rates.devices_tracked, "windows tracked"),
    card("card-queued", "#/devices?filter=deferring&sort=deferred", rates.deferred_messages, "messages deferred now"),
    card("card-dead", "#/forwarding", fwd.upstreams.reduce((n, u) => n + (u.dead_letters || 0), 0), "dead letters held"));
  const step = rates.interval_seconds * 1000;
  const n = Math.round(900 / rates.interval_seconds);
  const pad = Math.max(0, n - rates.samples.length);
  const start = rates.samples.length ? Date.parse(rates.samples[0].at) - (pad + 1) * step : Date.now() - n * step;
  update(ctx.s.chart, timeChart({ id: "rates-chart", label: "Fleet publishes", unit: "per second", startMs: start, stepMs: step,
    series: SERIES.map(([k, color]) => ({ name: k.replace("_", " "), cls: k, color, values: Array(pad).fill(0).concat(rates.samples.map(x => x[k])) })) }));
  const down = fwd.upstreams.filter(u => u.connected < u.connections).length;
  update(ctx.s.fwd, fwd.upstreams.length === 0 ? el("p", { class: "muted" }, "No forward destinations configured.") : [
    down ? el("p", { class: "bad" }, down + " down") : "",
    el("table", { id: "overview-forward" }, el("tr", {}, ["destination", "state", "backlog", "oldest", "dead letters"].map(h => el("th", { scope: "col" }, h))),
      fwd.upstreams.map(u => el("tr", {},
        el("td", {}, el("a", { href: "#/forwarding" }, u.name)),
        el("td", { class: u.connected < u.connections ? "bad" : "ok" }, u.connected + "/" + u.connections + " connected"),
        el("td", { class: "num" }, u.backlog_messages + " msgs"),
        el("td", { class: "num" }, u.oldest_age_seconds.toFixed(1) + " s"),
        el("td", { class: "dead" + (u.dead_letters ? " bad" : "") }, el("a", { href: "#/dead/" + enc(u.name) }, deadByReason(u))))))]);
  update(ctx.s.persist, health.status === "ok" ? el("span", { class: "ok" }, "data file writable") :
    el("span", { class: "bad" }, "unhealthy: " + (health.error || health.status)));
} };
