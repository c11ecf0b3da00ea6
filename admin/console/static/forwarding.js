// Forwarding: each destination's state and its history; its dead
// letters (the messages it refused for good) have their page in
// dead.js.
"use strict";

pages.forwarding = { title: "Forwarding", render: async (ctx) => {
  const [fwd, hist] = await Promise.all([ctx.get("/api/v1/forward"), ctx.get("/api/v1/forward/history")]);
  if (ctx.first) {
    ctx.s = { table: el("div", {}), charts: el("div", {}) };
    show(ctx.page, el("h1", {}, "Forwarding"), ctx.s.table, el("h2", {}, "History"), ctx.s.charts);
  }
  update(ctx.s.table, fwd.upstreams.length === 0 ? el("p", { class: "muted" }, "No forward destinations configured (forward:).") :
    el("table", { id: "forward" },
      el("tr", {}, ["destination", "connected", "forwarded", "dropped", "refused", "expired", "backlog", "backlog bytes", "oldest", "last error", "next attempt", "dead letters"].map(h => el("th", { scope: "col" }, h))),
      fwd.upstreams.map(u => el("tr", { class: "upstream" },
        el("td", {}, u.name),
        el("td", { class: u.connected < u.connections ? "bad" : "ok" }, u.connected + " / " + u.connections),
        el("td", { class: "num" }, u.forwarded),
        el("td", { class: "num" }, u.dropped_oldest),
        el("td", { class: "num" }, u.refused),
        el("td", { class: "num" }, u.expired),
        el("td", { class: "num backlog" }, u.backlog_messages),
        el("td", { class: "num" }, fmtBytes(u.backlog_bytes)),
        el("td", { class: "num" }, u.oldest_age_seconds.toFixed(1) + " s"),
        el("td", { class: "last-error" + (u.last_error ? " bad" : "") }, u.last_error || "—"),
        el("td", {}, u.retry_in_seconds ? "in " + u.retry_in_seconds.toFixed(1) + " s" : "—"),
        el("td", { class: "dead" + (u.dead_letters ? " bad" : "") }, el("a", { href: "#/dead/" + enc(u.name) }, deadByReason(u)))))));
  update(ctx.s.charts, hist.upstreams.map(h => h.spans.length === 0 ? "" : el("section", {},
    el("h3", {}, h.name),
    h.spans.map(sp => timeChart({ id: "fwd-" + h.name + "-" + sp.step_seconds, label: h.name + (sp.step_seconds === 60 ? ", last hour by minute" : ", last day by hour"),
      unit: sp.step_seconds === 60 ? "messages per minute" : "messages per hour", startMs: Date.parse(sp.start), stepMs: sp.step_seconds * 1000,
      series: [{ name: "delivered", cls: "admitted", color: "#2e7d32", values: sp.delivered },
        { name: "backlog (peak)", cls: "deferred", color: "#ef8f00", values: sp.backlog },
        { name: "dead letters", cls: "refused", color: "#c62828", values: sp.dead }],
      marks: sp.dead.map((v, i) => v > 0 ? i : -1).filter(i => i >= 0), markLabel: (i) => sp.dead[i] + " dead letters" })))));
} };
