// devicegate operator console. Plain JavaScript, no library: every page
// is built from the admin API's JSON with DOM calls that set text
// (textContent), never HTML, so device IDs, topics and reasons are shown
// as text. The admin token lives in sessionStorage (this tab only) and
// goes out as an Authorization header; it is never put in a URL.
"use strict";

const TOKEN_KEY = "devicegate.token";
const REFRESH_MS = 5000;
let refreshTimer = 0;

// el builds an element: attrs are properties or attributes (on* are
// listeners), children are nodes or strings (as text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k in e && typeof v !== "string") e[k] = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  e.append(...nodes(children));
  return e;
}

// nodes turns nested lists of nodes and strings into nodes, strings as
// text; undefined, null, false and "" are left out.
function nodes(children) {
  return children.flat(Infinity).filter(c => c !== undefined && c !== null && c !== false && c !== "")
    .map(c => c instanceof Node ? c : document.createTextNode(String(c)));
}

// show replaces the page's content.
function show(page, ...children) { page.replaceChildren(...nodes(children)); }

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

class APIError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

// api calls the admin API with the token; a 401 logs out, unless
// checking is set (the login form trying a token).
async function api(method, path, body, checking) {
  const init = { method, headers: { "Authorization": "Bearer " + token() }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (resp.status === 401 && !checking) {
    logout("Your token was refused; log in again.");
    throw new APIError(401, "unauthorized");
  }
  if (!resp.ok) throw new APIError(resp.status, (data && data.error) || resp.statusText);
  return data;
}

const enc = encodeURIComponent;
function devicePath(id) { return "/api/v1/devices/" + enc(id); }
function deviceHash(id) { return "#/device/" + enc(id); }

function fmtTime(s) {
  if (!s) return "—";
  const d = new Date(s);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}
function fmtRate(n) { return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2); }
function fmtBytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
  return (n / (1 << 20)).toFixed(1) + " MiB";
}

// ---- login ----

function showLogin(msg) {
  document.getElementById("nav").hidden = true;
  document.getElementById("page").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = msg || "";
  document.getElementById("token").focus();
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearTimeout(refreshTimer);
  showLogin(msg);
}

async function login(ev) {
  ev.preventDefault();
  const input = document.getElementById("token");
  const t = input.value.trim();
  sessionStorage.setItem(TOKEN_KEY, t);
  try {
    await api("GET", "/api/v1/rates", undefined, true);
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    document.getElementById("login-error").textContent =
      e.status === 401 ? "Token refused: that is not the gateway's admin token." : "Cannot reach the gateway: " + e.message;
    return;
  }
  input.value = "";
  document.getElementById("login").hidden = true;
  route();
}

// ---- routing ----

const pages = { overview, devices, device, groups, rules, forwarding, blocks };

function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const parts = path.split("/");
  return { page: parts[0] || "overview", arg: parts.length > 1 ? decodeURIComponent(parts.slice(1).join("/")) : "", params: new URLSearchParams(query || "") };
}

async function route() {
  clearTimeout(refreshTimer);
  if (!token()) { showLogin(); return; }
  const r = parseHash();
  const fn = pages[r.page] || overview;
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === r.page || (r.page === "device" && a.dataset.page === "devices"));
  }
  const page = document.getElementById("page");
  page.hidden = false;
  try {
    await fn(page, r);
  } catch (e) {
    if (e.status === 401) return;
    show(page, el("h1", {}, "Error"), el("p", { class: "error" }, e.message));
  }
}

// refresh re-renders the page in REFRESH_MS while it is shown.
function refresh(fn) {
  clearTimeout(refreshTimer);
  const hash = location.hash;
  refreshTimer = setTimeout(() => { if (location.hash === hash) fn(); }, REFRESH_MS);
}

// confirmButton asks for a confirmation in place before doing act.
function confirmButton(label, question, act) {
  const wrap = el("span", {});
  const b = el("button", { type: "button", class: "danger", onclick: () => {
    const yes = el("button", { type: "button", class: "danger confirm-yes", onclick: async () => {
      try { await act(); } catch (e) { wrap.replaceChildren(b, el("span", { class: "error" }, " " + e.message)); }
    } }, "Confirm");
    const no = el("button", { type: "button", onclick: () => wrap.replaceChildren(b) }, "Cancel");
    wrap.replaceChildren(el("span", { class: "confirm" }, question, yes, no));
  } }, label);
  wrap.append(b);
  return wrap;
}

// ---- overview ----

const SERIES = ["admitted", "refused", "deferred", "would_refuse"];

async function overview(page) {
  const [rates, fwd, health] = await Promise.all([
    api("GET", "/api/v1/rates"), api("GET", "/api/v1/forward"),
    fetch("/healthz", { cache: "no-store" }).then(r => r.json()).catch(() => ({ status: "unreachable" })),
  ]);
  const last = rates.samples.length ? rates.samples[rates.samples.length - 1] : { admitted: 0, refused: 0, deferred: 0, would_refuse: 0 };
  const card = (id, href, value, label) => el("a", { class: "card", href, id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
  const down = fwd.upstreams.filter(u => u.connected < u.connections).length;
  show(page,
    el("h1", {}, "Overview"),
    el("div", { class: "cards" },
      card("card-connected", "#/devices", rates.connected, "clients connected"),
      card("card-admitted", "#/devices?sort=last_seen", fmtRate(last.admitted), "admitted / s"),
      card("card-refused", "#/devices?filter=throttled&sort=refusals", fmtRate(last.refused), "refused / s"),
      card("card-deferred", "#/devices?filter=deferring&sort=deferred", fmtRate(last.deferred), "deferred / s"),
      card("card-would-refuse", "#/rules", fmtRate(last.would_refuse), "would refuse / s (shadow)"),
      card("card-blocked", "#/blocks", rates.blocked, "devices blocked"),
      card("card-tracked", "#/devices", rates.devices_tracked, "windows tracked"),
      card("card-queued", "#/devices?filter=deferring&sort=deferred", rates.deferred_messages, "messages deferred now"),
    ),
    el("h2", {}, "Publishes per second, last 15 minutes"),
    chart(rates),
    el("h2", {}, el("a", { href: "#/forwarding" }, "Forwarding"), down ? el("span", { class: "bad" }, " — " + down + " down") : ""),
    fwd.upstreams.length === 0 ? el("p", { class: "muted" }, "No forward destinations configured.") :
      el("table", {}, el("tr", {}, el("th", {}, "destination"), el("th", {}, "state"), el("th", { class: "num" }, "backlog"), el("th", { class: "num" }, "oldest")),
        fwd.upstreams.map(u => el("tr", {},
          el("td", {}, el("a", { href: "#/forwarding" }, u.name)),
          el("td", { class: u.connected < u.connections ? "bad" : "ok" }, u.connected + "/" + u.connections + " connected"),
          el("td", { class: "num" }, u.backlog_messages + " msgs"),
          el("td", { class: "num" }, u.oldest_age_seconds.toFixed(1) + " s")))),
    el("h2", {}, "Persistence"),
    el("p", { id: "persist" }, health.status === "ok" ? el("span", { class: "ok" }, "data file writable") :
      el("span", { class: "bad" }, "unhealthy: " + (health.error || health.status))),
  );
  refresh(() => route());
}

// chart draws the rate series as polylines in an inline SVG.
function chart(rates) {
  const W = 900, H = 200, P = 30;
  const s = svg("svg", { viewBox: `0 0 ${W} ${H + 20}`, preserveAspectRatio: "none", role: "img", "aria-label": "publish rates" });
  const n = Math.round(900 / rates.interval_seconds); // samples in 15 minutes
  let max = 1;
  for (const x of rates.samples) for (const k of SERIES) max = Math.max(max, x[k]);
  s.append(svg("line", { x1: P, y1: H, x2: W, y2: H, stroke: "#9aa7bb" }));
  const lbl = svg("text", { x: 2, y: 12, "font-size": 11, fill: "#5b6678" });
  lbl.textContent = fmtRate(max) + "/s";
  s.append(lbl);
  const lbl0 = svg("text", { x: 2, y: H, "font-size": 11, fill: "#5b6678" });
  lbl0.textContent = "0";
  s.append(lbl0);
  const tl = svg("text", { x: P, y: H + 16, "font-size": 11, fill: "#5b6678" });
  tl.textContent = "−15 min";
  s.append(tl);
  const tr = svg("text", { x: W - 30, y: H + 16, "font-size": 11, fill: "#5b6678" });
  tr.textContent = "now";
  s.append(tr);
  const colors = { admitted: "#2e7d32", refused: "#c62828", deferred: "#ef8f00", would_refuse: "#6a4fc2" };
  const off = n - rates.samples.length;
  for (const k of SERIES) {
    const pts = rates.samples.map((x, i) => {
      const px = P + (W - P) * (off + i) / Math.max(1, n - 1);
      const py = H - (H - 10) * x[k] / max;
      return px.toFixed(1) + "," + py.toFixed(1);
    }).join(" ");
    s.append(svg("polyline", { points: pts, fill: "none", stroke: colors[k], "stroke-width": 2, class: "series-" + k }));
  }
  return el("div", { class: "chart" }, s,
    el("div", { class: "legend" }, SERIES.map(k => el("span", { class: "s-" + k }, k.replace("_", " ")))));
}

// ---- devices ----

const FILTERS = [["throttled", "throttled (5 min)"], ["blocked", "blocked"], ["deferring", "deferring"], ["shadow", "shadow mode"], ["override", "with override"]];
const PAGE = 50;

async function devices(page, r) {
  const p = r.params;
  const q = new URLSearchParams();
  if (p.get("prefix")) q.set("prefix", p.get("prefix"));
  for (const f of p.getAll("filter")) q.append("filter", f);
  if (p.get("group")) q.set("group", p.get("group"));
  q.set("sort", p.get("sort") || "device");
  const offset = Number(p.get("offset") || 0);
  q.set("offset", offset);
  q.set("limit", PAGE);
  const list = await api("GET", "/api/v1/devices?" + q);

  const go = (changes) => {
    const n = new URLSearchParams(p);
    for (const [k, v] of Object.entries(changes)) {
      n.delete(k);
      for (const x of [].concat(v)) if (x !== "" && x !== undefined) n.append(k, x);
    }
    location.hash = "#/devices?" + n;
  };
  const form = el("form", { class: "filters", id: "device-filters", onsubmit: (ev) => {
    ev.preventDefault();
    const fd = new FormData(ev.target);
    go({ prefix: fd.get("prefix"), group: fd.get("group"), filter: fd.getAll("filter"), sort: fd.get("sort"), offset: [] });
  } },
    el("label", {}, "ID or prefix ", el("input", { name: "prefix", id: "prefix", value: p.get("prefix") || "" })),
    FILTERS.map(([f, label]) => el("label", {}, el("input", { type: "checkbox", name: "filter", value: f, id: "filter-" + f, checked: p.getAll("filter").includes(f) }), " " + label)),
    el("label", {}, "group ", el("input", { name: "group", id: "group", size: 10, value: p.get("group") || "" })),
    el("label", {}, "sort ", el("select", { name: "sort", id: "sort" },
      [["device", "device ID"], ["refusals", "refusals"], ["deferred", "deferred"], ["last_seen", "last seen"]].map(([v, l]) =>
        el("option", { value: v, selected: (p.get("sort") || "device") === v }, l)))),
    el("button", { type: "submit", id: "apply" }, "Apply"));

  const rows = list.devices.map(d => el("tr", { class: "device-row" },
    el("td", {}, el("a", { href: deviceHash(d.device), class: "device-link" }, d.device)),
    el("td", { class: d.connected ? "ok" : "muted" }, d.connected ? "connected" : "offline"),
    el("td", {}, fmtTime(d.last_seen)),
    el("td", { class: "num" }, d.refusals),
    el("td", { class: "num" }, d.deferred),
    el("td", {}, d.blocked_until ? el("span", { class: "bad" }, "until " + fmtTime(d.blocked_until)) : ""),
    el("td", {}, d.source + (d.shadow ? " (shadow)" : "")),
    el("td", {}, d.group || "")));
  const end = Math.min(list.total, offset + list.devices.length);
  show(page,
    el("h1", {}, "Devices"),
    form,
    el("div", { class: "pager" },
      el("span", { id: "device-count" }, list.total === 0 ? "no device matches" : `${offset + 1}–${end} of ${list.total}`),
      offset > 0 ? el("button", { type: "button", onclick: () => go({ offset: Math.max(0, offset - PAGE) }) }, "‹ previous") : "",
      end < list.total ? el("button", { type: "button", id: "next", onclick: () => go({ offset: offset + PAGE }) }, "next ›") : ""),
    el("table", { id: "devices" },
      el("tr", {}, ["device", "connection", "last seen", "refusals", "deferred", "blocked", "quota from", "group"].map(h =>
        el("th", { class: h === "refusals" || h === "deferred" ? "num" : "" }, h))),
      rows));
}

// ---- one device ----

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
    el("tr", {}, el("th", {}, "window"), el("th", {}, "used / limit"), el("th", {}, ""), el("th", { class: "num" }, "remaining"), el("th", {}, "retry after")),
    ws.map(w => {
      const limit = w.messages || w.bytes;
      const used = w.used || 0;
      const full = w.remaining === 0;
      const bar = el("span", { class: "bar" + (full ? " full" : "") }, el("span", {}));
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

async function device(page, r) {
  const id = r.arg;
  const d = await api("GET", devicePath(id));
  let group = null;
  if (d.group) {
    try { group = await api("GET", "/api/v1/groups/" + enc(d.group)); } catch (e) { group = null; }
  }
  const queue = d.deferred > 0 ? await api("GET", devicePath(id) + "/deferred?limit=" + DEFERRED_SHOWN) : null;
  const reload = () => route();
  const q = d.quota;
  const ws = windowsOf(q, d);
  const msg = el("p", { class: "notice", id: "device-notice", hidden: true });
  const say = (text) => { msg.textContent = text; msg.hidden = false; };

  const actions = el("div", { class: "filters" },
    confirmButton("Reset windows", "Empty every window of " + id + "?", async () => {
      await api("POST", devicePath(id) + "/reset"); await reload(); say("Windows reset.");
    }),
    d.source === "override" ? confirmButton("Delete override", "Delete the quota override of " + id + "?", async () => {
      await api("DELETE", devicePath(id) + "/quota"); await reload(); say("Override deleted.");
    }) : "",
    d.blocked_until ? confirmButton("Lift block", "Lift the block of " + id + "?", async () => {
      await api("DELETE", devicePath(id) + "/block"); await reload(); say("Block lifted.");
    }) : "");

  show(page,
    el("p", {}, el("a", { href: "#/devices" }, "‹ Devices")),
    el("h1", { id: "device-id" }, id),
    msg,
    el("dl", { class: "facts" },
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
      fact("next message", d.remaining > 0 ? "admitted" : "refused, retry after " + d.retry_after, "retry-after")),
    el("h2", {}, "Windows"),
    windowTable("device-windows", ws),
    d.classes && d.classes.length ? [el("h2", {}, "Topic classes"), d.classes.map(c => [
      el("h3", {}, c.name + " ", el("span", { class: "muted" }, c.topics.join(", "))),
      windowTable("class-" + c.name, windowsOf(c.quota))])] : "",
    group ? [el("h2", {}, "Group " + group.group + " windows"), windowTable("group-windows", windowsOf(group.quota))] : "",
    el("h2", {}, "Deferred messages"),
    deferredTable(queue),
    el("h2", {}, "Actions"),
    actions,
    el("h2", {}, "Quota override"),
    overrideForm(id, d, reload, say),
    el("h2", {}, "Recent refusals"),
    d.refusals && d.refusals.length ? el("table", { id: "refusals" },
      el("tr", {}, el("th", {}, "at"), el("th", {}, "topic"), el("th", {}, "class"), el("th", {}, "reason")),
      d.refusals.map(x => el("tr", {}, el("td", {}, fmtTime(x.at)), el("td", {}, x.topic), el("td", {}, x.class || ""), el("td", {}, x.reason))))
      : el("p", { class: "muted", id: "refusals" }, "none since the gateway started tracking it"),
  );
}

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
      el("tr", {}, el("th", {}, "topic"), el("th", {}, "class"), el("th", { class: "num" }, "size"), el("th", { class: "num" }, "QoS"), el("th", {}, "deferred at"), el("th", { class: "num" }, "age")),
      queue.messages.map(m => el("tr", { class: "deferred-row" },
        el("td", {}, m.topic), el("td", {}, m.class || ""), el("td", { class: "num" }, fmtBytes(m.size)),
        el("td", { class: "num" }, m.qos), el("td", {}, fmtTime(m.deferred_at)), el("td", { class: "num" }, m.age_seconds.toFixed(1) + " s"))))];
}

// overrideForm sets a device's (or a group's) override; the API's
// errors name the field ("window: ..."), which is marked.
function overrideForm(id, d, reload, say, groupPath) {
  const q = d ? d.quota : {};
  const single = q && !(q.windows && q.windows.length);
  const input = (name, attrs) => el("input", Object.assign({ name, id: "ov-" + name }, attrs));
  const err = el("p", { class: "error", id: "override-error" });
  const fields = {
    limit: input("limit", { type: "number", min: 1, value: single && q.limit ? q.limit : "" }),
    window: input("window", { value: single && q.window ? q.window : "", placeholder: "10s" }),
    expires_at: input("expires_at", { placeholder: "2030-01-02T15:04:05Z (optional)", size: 26 }),
  };
  const policy = el("select", { name: "policy", id: "ov-policy" }, ["drop", "defer", "disconnect"].map(x => el("option", { value: x, selected: q.policy === x }, x)));
  const shadow = el("input", { type: "checkbox", name: "shadow", id: "ov-shadow", checked: q.enforce === false });
  const form = el("form", { class: "stack", id: "override-form", onsubmit: async (ev) => {
    ev.preventDefault();
    for (const f of Object.values(fields)) f.classList.remove("invalid");
    err.textContent = "";
    const limit = fields.limit.value.trim();
    const body = { limit: limit === "" ? 0 : Number(limit), window: fields.window.value.trim() };
    if (!groupPath) {
      body.policy = policy.value;
      if (shadow.checked) body.enforce = false;
    }
    if (fields.expires_at.value.trim()) body.expires_at = fields.expires_at.value.trim();
    try {
      await api("PUT", (groupPath || devicePath(id)) + "/quota", body);
    } catch (e) {
      if (e.status === 401) return;
      err.textContent = e.message;
      const field = e.message.split(":")[0].trim();
      if (fields[field]) fields[field].classList.add("invalid");
      return;
    }
    await reload();
    say("Override set.");
  } },
    el("label", {}, "limit (messages)", fields.limit),
    el("label", {}, "per window", fields.window),
    groupPath ? "" : el("label", {}, "policy", policy),
    groupPath ? "" : el("label", {}, "shadow mode", shadow),
    el("label", {}, "expires at", fields.expires_at),
    el("button", { type: "submit", id: "override-submit" }, d && d.source === "override" ? "Change override" : "Set override"),
    err);
  return form;
}

// ---- groups ----

const GROUPS_SHOWN = 50;

async function groups(page) {
  const all = await api("GET", "/api/v1/groups");
  // The list has no window state: each group's own answer has it.
  const list = { groups: await Promise.all(all.groups.slice(0, GROUPS_SHOWN).map(g =>
    api("GET", "/api/v1/groups/" + enc(g.group)).catch(() => g))) };
  const say = (t) => { note.textContent = t; note.hidden = false; };
  const note = el("p", { class: "notice", hidden: true });
  show(page, el("h1", {}, "Groups"), note,
    all.groups.length > GROUPS_SHOWN ? el("p", { class: "muted" }, `The first ${GROUPS_SHOWN} of ${all.groups.length} groups.`) : "",
    list.groups.length === 0 ? el("p", { class: "muted" }, "No device has joined a group since the gateway started.") :
      list.groups.map(g => el("section", { class: "group" },
        el("h2", {}, g.group + " ", el("span", { class: "muted" }, `${g.connected} connected, quota from ${g.source}` + (g.label && g.label !== g.group ? `, label ${g.label}` : ""))),
        windowTable("group-" + g.group, windowsOf(g.quota)),
        el("details", {}, el("summary", {}, "Set override"),
          overrideForm(g.group, { quota: g.quota, source: g.source }, () => route(), say, "/api/v1/groups/" + enc(g.group))),
        g.source === "override" ? confirmButton("Delete override", "Delete the override of group " + g.group + "?", async () => {
          await api("DELETE", "/api/v1/groups/" + enc(g.group) + "/quota"); await route(); say("Override deleted.");
        }) : "")));
}

// ---- rules ----

async function rules(page) {
  const list = await api("GET", "/api/v1/rules");
  show(page, el("h1", {}, "Rules"),
    el("p", { class: "muted" }, "A rule in shadow mode decides and counts as if enforcing, and lets every message through. A switch covers the rule's own quota and its topic classes, not its group, and holds until the gateway restarts."),
    list.rules.length === 0 ? el("p", { class: "muted" }, "No rules configured (limits.rules): every device has the default quota.") :
      el("table", { id: "rules" }, el("tr", {}, el("th", {}, "rule"), el("th", {}, "mode"), el("th", {}, "classes"), el("th", {}, "group (not switched)"), el("th", { class: "num" }, "would refuse"), el("th", {}, "")),
        list.rules.map(x => el("tr", {},
          el("td", {}, x.rule),
          el("td", { class: x.enforce ? "ok" : "bad" }, x.enforce ? "enforcing" : "shadow"),
          el("td", {}, (x.classes || []).map(c => c.name + (c.enforce ? "" : " (shadow)")).join(", ") || "—"),
          el("td", {}, x.group ? x.group.name + (x.group.enforce ? "" : " (shadow)") : "—"),
          el("td", { class: "num" }, x.would_refuse === undefined ? "—" : x.would_refuse),
          el("td", {}, el("button", { type: "button", class: "rule-switch", onclick: async () => {
            await api("PUT", "/api/v1/rules/" + enc(x.rule) + "/enforce", { enforce: !x.enforce }); await route();
          } }, x.enforce ? "Switch to shadow" : "Enforce"))))));
}

// ---- forwarding ----

async function forwarding(page) {
  const fwd = await api("GET", "/api/v1/forward");
  show(page, el("h1", {}, "Forwarding"),
    fwd.upstreams.length === 0 ? el("p", { class: "muted" }, "No forward destinations configured (forward:).") :
      el("table", { id: "forward" },
        el("tr", {}, ["destination", "connected", "forwarded", "dropped", "refused", "expired", "backlog", "backlog bytes", "oldest", "last error", "next attempt"].map(h => el("th", {}, h))),
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
          el("td", {}, u.retry_in_seconds ? "in " + u.retry_in_seconds.toFixed(1) + " s" : "—")))));
  refresh(() => route());
}

// ---- blocks ----

async function blocks(page) {
  const list = await api("GET", "/api/v1/blocks");
  const note = el("p", { class: "notice", hidden: true, id: "blocks-notice" });
  const boxes = list.blocks.map(b => el("input", { type: "checkbox", class: "block-select", value: b.device }));
  show(page, el("h1", {}, "Blocks"), note,
    list.blocks.length === 0 ? el("p", { class: "muted", id: "no-blocks" }, "No device is blocked.") : [
      el("table", { id: "blocks" },
        el("tr", {}, el("th", {}, el("input", { type: "checkbox", id: "select-all", title: "select all", onchange: (ev) => {
          for (const x of boxes) x.checked = ev.target.checked;
        } })), el("th", {}, "device"), el("th", {}, "blocked until"), el("th", {}, "since"), el("th", {}, "reason")),
        list.blocks.map((b, i) => el("tr", { class: "block-row" }, el("td", {}, boxes[i]),
          el("td", {}, el("a", { href: deviceHash(b.device) }, b.device)), el("td", {}, fmtTime(b.until)),
          el("td", {}, fmtTime(b.since)), el("td", { class: "block-reason" }, b.reason || "not recorded")))),
      el("p", {}, confirmButton("Lift selected", "Lift the blocks of the devices selected?", async () => {
        const chosen = boxes.filter(x => x.checked).map(x => x.value);
        const failed = [];
        for (const d of chosen) {
          try { await api("DELETE", devicePath(d) + "/block"); } catch (e) { failed.push(d + ": " + e.message); }
        }
        await route();
        const n = document.querySelector("#page .notice");
        if (n) { n.textContent = `Lifted ${chosen.length - failed.length} block(s).` + (failed.length ? " Failed: " + failed.join("; ") : ""); n.hidden = false; }
      }))]);
}

// ---- start ----

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", () => logout("Logged out."));
  window.addEventListener("hashchange", route);
  route();
});
