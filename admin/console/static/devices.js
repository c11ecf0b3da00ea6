// Devices: the devices the gateway tracks, searched, filtered by state,
// rule and group, sorted by a column, paged; many selected at once for
// an override, a reset or a lift, each confirmed and counted.
"use strict";

const FILTERS = [["connected", "connected"], ["throttled", "throttled (5 min)"], ["blocked", "blocked"], ["deferring", "deferring"], ["shadow", "shadow mode"], ["override", "with override"]];
const PAGE = 50;
// COLUMNS: heading, the sort it stands for ("" for none).
const COLUMNS = [["device", "device"], ["connection", ""], ["last seen", "last_seen"], ["refusals", "refusals"], ["admitted, 5 min", "rate"],
  ["window use", "use"], ["deferred", "deferred"], ["blocked", ""], ["quota from", ""], ["group", ""]];

// go goes to the devices page with params p changed.
function devicesGo(p, changes) {
  const n = new URLSearchParams(p);
  for (const [k, v] of Object.entries(changes)) {
    n.delete(k);
    for (const x of [].concat(v)) if (x !== "" && x !== undefined && x !== null) n.append(k, x);
  }
  location.hash = "#/devices?" + n;
}

// quotaFields are an override's fields, their IDs prefixed by prefix.
function quotaFields(prefix, q, expires) {
  const input = (name, attrs) => el("input", Object.assign({ name, id: prefix + name }, attrs));
  const single = q && !(q.windows && q.windows.length);
  return {
    limit: input("limit", { type: "number", min: 1, value: single && q.limit ? q.limit : "" }),
    window: input("window", { value: single && q.window ? q.window : "", placeholder: "10s" }),
    expires_at: input("expires_at", { placeholder: "2030-01-02T15:04:05Z (optional)", size: 26, value: expires || "" }),
    policy: el("select", { name: "policy", id: prefix + "policy" }, ["drop", "defer", "disconnect"].map(x => el("option", { value: x, selected: (q && q.policy) === x }, x))),
    shadow: el("input", { type: "checkbox", name: "shadow", id: prefix + "shadow", checked: !!q && q.enforce === false }),
  };
}

// quotaBody is the PUT body of fields (group: no policy, no shadow).
function quotaBody(f, group) {
  const limit = f.limit.value.trim();
  const body = { limit: limit === "" ? 0 : Number(limit), window: f.window.value.trim() };
  if (!group) {
    body.policy = f.policy.value;
    if (f.shadow.checked) body.enforce = false;
  }
  if (f.expires_at.value.trim()) body.expires_at = f.expires_at.value.trim();
  return body;
}

// markField marks the field an API error names ("window: ...",
// "invalid quota: limit must ..."), and returns it.
function markField(f, msg) {
  for (const x of Object.values(f)) { x.classList.remove("invalid"); x.removeAttribute("aria-invalid"); }
  for (const [name, x] of Object.entries(f)) {
    if (new RegExp("(^|: )" + name + "\\b").test(msg)) {
      x.classList.add("invalid");
      x.setAttribute("aria-invalid", "true");
      return x;
    }
  }
  return null;
}

pages.devices = { title: "Devices", render: async (ctx) => {
  const p = ctx.r.params;
  const q = new URLSearchParams();
  for (const k of ["prefix", "group", "rule"]) if (p.get(k)) q.set(k, p.get(k));
  for (const f of p.getAll("filter")) q.append("filter", f);
  const sort = p.get("sort") || "device";
  q.set("sort", sort);
  const offset = Number(p.get("offset") || 0) || 0;
  q.set("offset", offset);
  q.set("limit", PAGE);
  const list = await ctx.get("/api/v1/devices?" + q);
  if (ctx.first) {
    const rules = await ctx.get("/api/v1/rules").catch(e => { if (e instanceof Stale) throw e; return { rules: [] }; });
    ctx.sel = new Set();
    ctx.s = { pager: el("div", { class: "pager" }), table: el("div", {}), notice: el("p", { class: "notice", id: "devices-notice", hidden: true }), count: el("span", { id: "selected-count" }) };
    const form = el("form", { class: "filters", id: "device-filters", onsubmit: (ev) => {
      ev.preventDefault();
      const fd = new FormData(ev.target);
      devicesGo(p, { prefix: fd.get("prefix"), group: fd.get("group"), rule: fd.get("rule"), filter: fd.getAll("filter"), sort: fd.get("sort"), offset: [] });
    } },
      el("label", {}, "ID or prefix ", el("input", { name: "prefix", id: "prefix", value: p.get("prefix") || "" })),
      el("fieldset", {}, el("legend", {}, "state"), FILTERS.map(([f, label]) => el("label", {}, el("input", { type: "checkbox", name: "filter", value: f, id: "filter-" + f, checked: p.getAll("filter").includes(f) }), " " + label))),
      el("label", {}, "rule ", el("select", { name: "rule", id: "rule" }, el("option", { value: "" }, "any"), el("option", { value: "default", selected: p.get("rule") === "default" }, "default quota"),
        rules.rules.map(x => el("option", { value: x.rule, selected: p.get("rule") === x.rule }, x.rule)))),
      el("label", {}, "group ", el("input", { name: "group", id: "group", size: 10, value: p.get("group") || "" })),
      el("label", {}, "sort ", el("select", { name: "sort", id: "sort" },
        COLUMNS.filter(c => c[1]).map(([l, v]) => el("option", { value: v, selected: sort === v }, l)))),
      el("button", { type: "submit", id: "apply" }, "Apply"));
    const bf = quotaFields("bulk-", null);
    const chosen = () => [...ctx.sel];
    const bulkErr = el("p", { class: "error", id: "bulk-error" });
    const bulk = el("details", { id: "bulk" }, el("summary", {}, "Act on the devices selected"),
      el("form", { class: "stack", id: "bulk-form", novalidate: true, onsubmit: (ev) => ev.preventDefault() },
        el("label", {}, "limit (messages)", bf.limit), el("label", {}, "per window", bf.window), el("label", {}, "policy", bf.policy),
        el("label", {}, "shadow mode", bf.shadow), el("label", {}, "expires at", bf.expires_at), bulkErr),
      el("div", { class: "filters" },
        confirmButton("Set override", "Set this override on every device selected?", async () => {
          const ids = chosen();
          if (!ids.length) return "No device selected.";
          const r = await each(ids, "Override set on", id => api("PUT", devicePath(id) + "/quota", quotaBody(bf)));
          bulkErr.textContent = r.errors[0] || "";
          markField(bf, r.errors[0] || "");
          return r.text;
        }, ctx.s.notice, { id: "bulk-override" }),
        confirmButton("Reset windows", "Empty the windows of every device selected?", async () => {
          const r = await each(chosen(), "Windows reset on", id => api("POST", devicePath(id) + "/reset"));
          return r.text;
        }, ctx.s.notice, { id: "bulk-reset" }),
        confirmButton("Lift blocks", "Lift the blocks of every device selected?", async () => {
          const r = await each(chosen(), "Blocks lifted on", id => api("DELETE", devicePath(id) + "/block"));
          return r.text;
        }, ctx.s.notice, { id: "bulk-lift" }),
        el("button", { type: "button", id: "select-none", onclick: () => { ctx.sel.clear(); refreshNow(); } }, "Clear selection"),
        ctx.s.count));
    show(ctx.page, el("h1", {}, "Devices"), form, ctx.s.notice, bulk, ctx.s.pager, ctx.s.table);
  }
  const end = Math.min(list.total, offset + list.devices.length);
  const go = (changes) => devicesGo(p, changes);
  update(ctx.s.pager,
    el("span", { id: "device-count" }, list.total === 0 ? "no device matches" : `${offset + 1}–${end} of ${list.total}`),
    offset > 0 ? el("button", { type: "button", onclick: () => go({ offset: Math.max(0, offset - PAGE) }) }, "‹ previous") : "",
    end < list.total ? el("button", { type: "button", id: "next", onclick: () => go({ offset: offset + PAGE }) }, "next ›") : "");
  const counted = () => { ctx.s.count.textContent = ctx.sel.size + " selected"; };
  counted();
  const boxes = list.devices.map(d => el("input", { type: "checkbox", class: "device-select", value: d.device, "aria-label": "select " + d.device,
    checked: ctx.sel.has(d.device), onchange: (ev) => { if (ev.target.checked) ctx.sel.add(d.device); else ctx.sel.delete(d.device); counted(); } }));
  const all = el("input", { type: "checkbox", id: "select-page", "aria-label": "select every device of this page",
    checked: boxes.length > 0 && boxes.every(b => b.checked), onchange: (ev) => {
      for (const b of boxes) { b.checked = ev.target.checked; if (b.checked) ctx.sel.add(b.value); else ctx.sel.delete(b.value); }
      counted();
    } });
  update(ctx.s.table, el("table", { id: "devices" },
    el("tr", {}, el("th", { scope: "col" }, all), COLUMNS.map(([h, key]) => el("th", { scope: "col", class: ["refusals", "deferred", "rate", "use"].includes(key) ? "num" : "",
      "aria-sort": key && key === sort ? (key === "device" ? "ascending" : "descending") : false },
      key ? el("button", { type: "button", class: "sort" + (key === sort ? " sorted" : ""), "data-sort": key, onclick: () => go({ sort: key, offset: [] }) }, h) : h))),
    list.devices.map((d, i) => el("tr", { class: "device-row" },
      el("td", {}, boxes[i]),
      el("td", {}, el("a", { href: deviceHash(d.device), class: "device-link" }, d.device)),
      el("td", { class: d.connected ? "ok" : "muted" }, d.connected ? "connected" : "offline"),
      el("td", {}, fmtTime(d.last_seen)),
      el("td", { class: "num" }, d.refusals),
      el("td", { class: "num" }, d.recent === undefined ? "—" : d.recent),
      el("td", { class: "num" }, d.use_percent === undefined ? "—" : d.use_percent + " %"),
      el("td", { class: "num" }, d.deferred),
      el("td", {}, d.blocked_until ? el("span", { class: "bad" }, "until " + fmtTime(d.blocked_until)) : ""),
      el("td", {}, d.source + (d.shadow ? " (shadow)" : "")),
      el("td", {}, d.group || "")))));
} };
