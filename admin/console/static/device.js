// One device: its connection, quota and windows, what its next message
// would get (the gateway's own judgement), its history, its deferred
// messages, actions, and its quota override.
"use strict";

// windowsOf lists a quota's windows with their state: several, or the
// one of limit and window (state given beside it).
function windowsOf(q, state) {
  if (q.windows && q.windows.length) return q.windows;
  if (!q.window) return [];
  const s = state || q;
  return [{ messages: q.limit, window: q.window, used: s.used, remaining: s.remaining, retry_after: s.retry_after }];
}

function windowTable(id, ws) {
  return el("table", { class: "windows", id },
    el("tr", {}, ["window", "used / limit", "", "remaining", "retry after"].map((h, i) => el("th", { scope: "col", class: i === 3 ? "num" : "" }, h))),
    ws.map(w => {
      const limit = w.messages || w.bytes;
      const used = w.used || 0;
      const full = w.remaining === 0;
      const bar = el("span", { class: "bar" + (full ? " full" : ""), role: "img", "aria-label": Math.round(100 * used / Math.max(1, limit)) + " % used" }, el("span", {}));
      bar.firstChild.style.width = Math.min(100, 100 * used / Math.max(1, limit)) + "%";
      return el("tr", { class: full ? "window full" : "window" },
        el("td", {}, (w.messages ? w.messages + " messages" : w.bytes + " bytes") + " per " + w.window),
        el("td", { class: "used" }, (w.used === undefined ? "—" : used) + " / " + limit),
        el("td", {}, bar),
        el("td", { class: "num remaining" }, w.remaining === undefined ? "—" : w.remaining),
        el("td", { class: "retry" }, w.retry_after || "—"));
    }));
}

function fact(dt, dd, id) { return [el("dt", {}, dt), el("dd", id ? { id } : {}, dd)]; }

// nextText says what a message would get (an entry of the device's
// "next", decided by the gateway).
function nextText(n, group) {
  const retry = n.retry_after ? ", retry after " + n.retry_after : "";
  switch (n.outcome) {
    case "admitted": return "admitted";
    case "blocked": return "refused: the device is blocked (its connections are refused)" + retry;
    case "deferred": return n.by === "queue" ? `deferred behind ${n.queued} queued message(s)` : "deferred: its window is full; released in about " + (n.retry_after || "—");
    case "would_refuse": return "admitted in shadow mode: " + (n.by === "group" ? "group " + (group || "") + "'s" : "its") + " quota would refuse it" + retry;
    case "refused":
      if (n.by === "queue full") return `refused: its deferral queue is full (${n.queued} queued)`;
      if (n.by === "group") return "refused by group " + (group || "") + "'s window" + retry;
      return "refused" + retry;
  }
  return n.outcome;
}

// overrideForm sets a device's (or with group set, a group's) override:
// it starts from the override in force, expiry included; the API's
// errors name the field, which is marked.
function overrideForm(prefix, d, path, group, done) {
  const f = quotaFields(prefix, d.quota, d.source === "override" ? d.override_expires_at : "");
  const err = el("p", { class: "error", id: prefix + "error", role: "alert" });
  return el("form", { class: "stack", id: prefix + "form", novalidate: true, onsubmit: async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    markField(f, "");
    try {
      await api("PUT", path + "/quota", quotaBody(f, group));
    } catch (e) {
      if (e.status === 401) return;
      err.textContent = e.message;
      const bad = markField(f, e.message);
      if (bad) bad.focus();
      return;
    }
    await done("Override set.");
  } },
    el("label", {}, "limit (messages)", f.limit),
    el("label", {}, "per window", f.window),
    group ? "" : el("label", {}, "policy", f.policy),
    group ? "" : el("label", {}, "shadow mode", f.shadow),
    el("label", {}, "expires at", f.expires_at),
    el("button", { type: "submit", id: prefix + "submit" }, d.source === "override" ? "Change override" : "Set override"),
    err);
}

function historyCharts(id, h) {
  if (!h.tracked) return el("p", { class: "muted", id: "history" }, "The gateway keeps no history of this device (not seen in the last 24 hours).");
  return el("div", { id: "history" }, h.spans.map(sp => {
    const byMin = sp.step_seconds === 60;
    const at = (i) => fmtClock(Date.parse(sp.start) + i * sp.step_seconds * 1000, !byMin);
    return timeChart({ id: byMin ? "history-hour" : "history-day", label: id + (byMin ? ", last hour by minute" : ", last day by hour"),
      unit: byMin ? "messages per minute" : "messages per hour", startMs: Date.parse(sp.start), stepMs: sp.step_seconds * 1000, pct: true,
      series: [{ name: "admitted", cls: "admitted", color: "#2e7d32", values: sp.admitted },
        { name: "refused", cls: "refused", color: "#c62828", values: sp.refused },
        { name: "deferred", cls: "deferred", color: "#ef8f00", values: sp.deferred },
        { name: "window use (%, right scale)", cls: "use", color: "#1f6fd1", values: sp.use_percent, pct: true }],
      marks: sp.refused.map((v, i) => v > 0 ? i : -1).filter(i => i >= 0),
      markLabel: (i) => `${sp.refused[i]} refused at ${at(i)}` });
  }));
}

pages.device = { title: (r) => "Device " + r.arg, render: async (ctx) => {
  const id = ctx.r.arg;
  const [d, hist] = await Promise.all([ctx.get(devicePath(id)), ctx.get(devicePath(id) + "/history")]);
  const group = d.group ? await ctx.get("/api/v1/groups/" + enc(d.group)).catch(e => { if (e instanceof Stale) throw e; return null; }) : null;
  const queue = d.deferred > 0 ? await ctx.get(devicePath(id) + "/deferred?limit=" + DEFERRED_SHOWN) : null;
  if (ctx.first) {
    ctx.s = {};
    for (const k of ["facts", "windows", "classes", "group", "history", "deferred", "actions", "form", "refusals"]) ctx.s[k] = el("div", {});
    ctx.s.notice = el("p", { class: "notice", id: "device-notice", hidden: true });
    show(ctx.page, el("p", {}, el("a", { href: "#/devices" }, "‹ Devices")), el("h1", { id: "device-id" }, id), ctx.s.notice,
      ctx.s.facts, el("h2", {}, "Windows"), ctx.s.windows, ctx.s.classes, ctx.s.group, el("h2", {}, "History"), ctx.s.history,
      el("h2", {}, "Deferred messages"), ctx.s.deferred, el("h2", {}, "Actions"), ctx.s.actions,
      el("h2", {}, "Quota override"), ctx.s.form, el("h2", {}, "Recent refusals"), ctx.s.refusals);
  }
  const q = d.quota;
  const done = async (said) => { ctx.formFor = null; await refreshNow(); announce(said, ctx.s.notice); };
  const next = d.next && d.next.length ? d.next : [{ outcome: d.remaining > 0 ? "admitted" : "refused", by: "window", retry_after: d.retry_after }];
  update(ctx.s.facts, el("dl", { class: "facts" },
    fact("connection", d.connected ? el("span", { class: "ok" }, "connected") : el("span", { class: "muted" }, "not connected"), "connection"),
    d.connected ? fact("client ID", d.client_id || "—", "client-id") : "",
    d.connected && d.username ? fact("username", d.username) : "",
    d.connected ? fact("address", d.remote || "—", "remote") : "",
    d.connected ? fact("protocol", d.protocol === 5 ? "MQTT 5" : d.protocol === 4 ? "MQTT 3.1.1" : "MQTT " + d.protocol) : "",
    d.connected ? fact("connected since", fmtTime(d.connected_since)) : "",
    fact("last seen", fmtTime(d.last_seen)),
    fact("quota from", d.source + (d.override_expires_at ? " (expires " + fmtTime(d.override_expires_at) + ")" : ""), "source"),
    fact("policy", (q.policy || "") + (q.enforce === false ? ", shadow mode (decided, not enforced)" : ", enforcing"), "policy"),
    fact("group", d.group ? el("a", { href: "#/groups" }, d.group) : "none"),
    fact("deferred", d.deferred + " messages queued", "deferred"),
    fact("block", d.blocked_until ? [el("span", { class: "bad" }, "blocked until " + fmtTime(d.blocked_until)),
      d.blocked_since ? " since " + fmtTime(d.blocked_since) : "",
      el("div", { id: "block-reason" }, d.block_reason ? "why: " + d.block_reason : "why: not recorded")] : "not blocked", "block"),
    fact("next message", el("span", { class: next[0].outcome === "admitted" ? "ok" : next[0].outcome === "would_refuse" ? "" : "bad" }, nextText(next[0], d.group)), "retry-after"),
    next.slice(1).map(n => fact("next on class " + n.class, nextText(n, d.group), "next-class-" + n.class))));
  update(ctx.s.windows, windowTable("device-windows", windowsOf(q, d)));
  update(ctx.s.classes, d.classes && d.classes.length ? [el("h2", {}, "Topic classes"), d.classes.map(c => [
    el("h3", {}, c.name + " ", el("span", { class: "muted" }, c.topics.join(", "))),
    windowTable("class-" + c.name, windowsOf(c.quota))])] : "");
  update(ctx.s.group, group ? [el("h2", {}, "Group " + group.group + " windows"), windowTable("group-windows", windowsOf(group.quota))] : "");
  update(ctx.s.history, historyCharts(id, hist));
  update(ctx.s.deferred, deferredTable(queue));
  const n = ctx.s.notice;
  update(ctx.s.actions, el("div", { class: "filters" },
    confirmButton("Reset windows", "Empty every window of " + id + "?", async () => {
      await api("POST", devicePath(id) + "/reset"); return "Windows reset.";
    }, n, { id: "reset" }),
    d.source === "override" ? confirmButton("Delete override", "Delete the quota override of " + id + "?", async () => {
      await api("DELETE", devicePath(id) + "/quota"); ctx.formFor = null; return "Override deleted.";
    }, n, { id: "delete-override" }) : "",
    d.blocked_until ? confirmButton("Lift block", "Lift the block of " + id + "?", async () => {
      await api("DELETE", devicePath(id) + "/block"); return "Block lifted.";
    }, n, { id: "lift" }) : ""));
  // The form is built again only when the override changed (or was set
  // here): a half-typed one stays as it is.
  const key = d.source + "|" + JSON.stringify(q) + "|" + (d.override_expires_at || "");
  if (ctx.formFor !== key) {
    ctx.formFor = key;
    ctx.s.form.replaceChildren(overrideForm("ov-", d, devicePath(id), false, done));
  }
  update(ctx.s.refusals, d.refusals && d.refusals.length ? el("table", { id: "refusals" },
    el("tr", {}, ["at", "topic", "class", "reason"].map(h => el("th", { scope: "col" }, h))),
    d.refusals.map(x => el("tr", {}, el("td", {}, fmtTime(x.at)), el("td", {}, x.topic), el("td", {}, x.class || ""), el("td", {}, x.reason))))
    : el("p", { class: "muted", id: "refusals" }, "none since the gateway started tracking it"));
} };

// DEFERRED_SHOWN is how many of a device's deferred messages its page
// lists (the first, in the order they will be released).
const DEFERRED_SHOWN = 20;

// deferredTable lists a device's deferred messages: topic, class, size
// and age, the first DEFERRED_SHOWN with the total.
function deferredTable(queue) {
  if (!queue || queue.total === 0) return el("p", { class: "muted", id: "deferred-list" }, "none queued");
  return [
    el("p", { id: "deferred-count" }, queue.messages.length < queue.total ?
      `the first ${queue.messages.length} of ${queue.total}, oldest first` : `${queue.total}, oldest first`),
    el("table", { id: "deferred-list" },
      el("tr", {}, ["topic", "class", "size", "QoS", "deferred at", "age"].map((h, i) => el("th", { scope: "col", class: [2, 3, 5].includes(i) ? "num" : "" }, h))),
      queue.messages.map(m => el("tr", { class: "deferred-row" },
        el("td", {}, m.topic), el("td", {}, m.class || ""), el("td", { class: "num" }, fmtBytes(m.size)),
        el("td", { class: "num" }, m.qos), el("td", {}, fmtTime(m.deferred_at)), el("td", { class: "num" }, m.age_seconds.toFixed(1) + " s"))))];
}
