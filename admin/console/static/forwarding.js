// Forwarding: each destination's state, its history, and its dead
// letters (the messages it refused for good): listed, replayed or
// dropped.
"use strict";

const DEAD_PAGE = 50;

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

// A destination's dead letters: how many by reason, a page of them, and
// replay or drop of them all, confirmed and counted. Fields the list
// may carry beyond today's (attempts, damaged...) are shown when there.
pages.dead = { title: (r) => "Dead letters of " + r.arg, render: async (ctx) => {
  const name = ctx.r.arg;
  const offset = Math.max(0, Number(ctx.r.params.get("offset") || 0) || 0);
  const base = "/api/v1/forward/" + enc(name) + "/dead";
  const [fwd, list] = await Promise.all([ctx.get("/api/v1/forward"), ctx.get(base + "?limit=" + Math.min(10000, offset + DEAD_PAGE))]);
  const u = fwd.upstreams.find(x => x.name === name) || {};
  if (ctx.first) {
    ctx.s = { summary: el("p", { id: "dead-summary" }), notice: el("p", { class: "notice", id: "dead-notice", hidden: true }), list: el("div", {}) };
    const act = (verb, method, path, key) => async () => {
      const r = await api(method, path);
      return `${verb} ${r[key] || 0} dead letter(s) of ${name}.`;
    };
    show(ctx.page, el("p", {}, el("a", { href: "#/forwarding" }, "‹ Forwarding")), el("h1", {}, "Dead letters of " + name),
      ctx.s.summary, ctx.s.notice,
      el("div", { class: "filters" },
        confirmButton("Replay all", "Send every dead letter of " + name + " again?", act("Replayed", "POST", base + "/replay", "replayed"), ctx.s.notice, { id: "dead-replay" }),
        confirmButton("Drop all", "Delete every dead letter of " + name + " for good?", act("Dropped", "DELETE", base, "dropped"), ctx.s.notice, { id: "dead-drop" })),
      ctx.s.list);
  }
  update(ctx.s.summary, deadByReason(u));
  const rows = list.dead_letters.slice(offset, offset + DEAD_PAGE);
  const go = (o) => { location.hash = "#/dead/" + enc(name) + "?offset=" + o; };
  update(ctx.s.list, list.total === 0 ? el("p", { class: "muted", id: "dead-list" }, "No dead letters.") : [
    el("div", { class: "pager" },
      el("span", { id: "dead-count" }, rows.length ? `${offset + 1}–${offset + rows.length} of ${list.total}` : `none from ${offset + 1} of ${list.total}`),
      offset > 0 ? el("button", { type: "button", onclick: () => go(Math.max(0, offset - DEAD_PAGE)) }, "‹ previous") : "",
      offset + DEAD_PAGE < list.total ? el("button", { type: "button", id: "dead-next", onclick: () => go(offset + DEAD_PAGE) }, "next ›") : ""),
    el("table", { id: "dead-list" },
      el("tr", {}, ["device", "topic", "size", "reason", "error", "refused at", "attempts", "log"].map(h => el("th", { scope: "col" }, h))),
      rows.map(d => el("tr", { class: "dead-row" + (d.damaged ? " damaged" : "") },
        el("td", {}, d.damaged ? el("span", { class: "bad" }, "damaged entry") : el("a", { href: deviceHash(d.device) }, d.device)),
        el("td", {}, d.topic || ""), el("td", { class: "num" }, d.payload_bytes === undefined ? "—" : fmtBytes(d.payload_bytes)),
        el("td", {}, d.reason || ""), el("td", {}, d.error || ""),
        el("td", {}, fmtTime(d.refused_at || d.last_attempt)),
        el("td", { class: "num" }, d.attempts === undefined ? "—" : d.attempts + (d.first_attempt ? " since " + fmtTime(d.first_attempt) : "")),
        el("td", { class: "muted" }, (d.log || "") + (d.seq !== undefined ? " #" + d.seq : "")))))]);
} };
