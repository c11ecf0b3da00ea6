// A destination's dead letters (the messages it refused for good): how
// many by reason, a page of them, and replay or drop of one entry, of
// one device's or of all, each confirmed and counted from the API's
// answer. A damaged entry is marked, its error shown; it can be
// dropped, not replayed (the API leaves it). The API says when each was
// refused, not its attempts: there is no attempts column.
"use strict";

const DEAD_PAGE = 50;
const DEAD_LIST = 1000; // listed at each refresh (the devices offered)
const DEAD_LIST_MAX = 10000; // the API's most in one list
const DEAD_IDS = 1000; // the API's most ids in one replay or drop

// deadDo replays (verb "Replayed") or drops ("Dropped") the dead
// letters of ids at base, DEAD_IDS a call, and returns how many the
// API says it did. A call refused (an id gone meanwhile: 404, nothing
// of that call done) stops there, the count so far said in its error.
async function deadDo(base, verb, ids) {
  const replay = verb === "Replayed";
  let done = 0;
  for (let i = 0; i < ids.length; i += DEAD_IDS) {
    const q = ids.slice(i, i + DEAD_IDS).map(id => "id=" + enc(id)).join("&");
    try {
      const r = await api(replay ? "POST" : "DELETE", base + (replay ? "/replay?" : "?") + q);
      done += (replay ? r.replayed : r.dropped) || 0;
    } catch (e) {
      throw new APIError(e.status, `${verb} ${done} of ${ids.length}; then refused: ${e.message}`);
    }
  }
  return done;
}

// deadOfDevice returns the ids of device's dead letters at base as
// listed now (up to DEAD_LIST_MAX), damaged ones left out when
// replaying, and whether the list was cut short.
async function deadOfDevice(base, device, replay) {
  const list = await api("GET", base + "?limit=" + DEAD_LIST_MAX);
  const ids = list.dead_letters.filter(d => d.device === device && !(replay && d.damaged)).map(d => d.id);
  return { ids, cut: list.total > list.dead_letters.length };
}

pages.dead = { title: (r) => "Dead letters of " + r.arg, render: async (ctx) => {
  const name = ctx.r.arg;
  const offset = Math.max(0, Number(ctx.r.params.get("offset") || 0) || 0);
  const base = "/api/v1/forward/" + enc(name) + "/dead";
  const limit = Math.min(DEAD_LIST_MAX, Math.max(DEAD_LIST, offset + DEAD_PAGE));
  const [fwd, list] = await Promise.all([ctx.get("/api/v1/forward"), ctx.get(base + "?limit=" + limit)]);
  const u = fwd.upstreams.find(x => x.name === name) || {};
  const counted = (verb, ids, done, what) => `${verb} ${done} of ${ids.length} dead letter(s) of ${name}${what}.`;
  if (ctx.first) {
    const s = ctx.s = { summary: el("p", { id: "dead-summary" }), notice: el("p", { class: "notice", id: "dead-notice", hidden: true }),
      device: "", select: el("select", { id: "dead-device" }), byDevice: el("span", {}), list: el("div", {}) };
    s.select.addEventListener("change", () => { s.device = s.select.value; drawDevice(ctx, base, name, counted); });
    const all = (verb, method, path, key) => async () => {
      const r = await api(method, path);
      return `${verb} ${r[key] || 0} dead letter(s) of ${name}.`;
    };
    show(ctx.page, el("p", {}, el("a", { href: "#/forwarding" }, "‹ Forwarding")), el("h1", {}, "Dead letters of " + name),
      s.summary, s.notice,
      el("div", { class: "filters" },
        confirmButton("Replay all", "Send every dead letter of " + name + " again?", all("Replayed", "POST", base + "/replay", "replayed"), s.notice, { id: "dead-replay" }),
        confirmButton("Drop all", "Delete every dead letter of " + name + " for good?", all("Dropped", "DELETE", base, "dropped"), s.notice, { id: "dead-drop" })),
      el("div", { class: "filters" }, el("label", {}, "Device ", s.select), s.byDevice),
      s.list);
  }
  const s = ctx.s;
  update(s.summary, deadByReason(u));
  s.listed = list;
  drawDevice(ctx, base, name, counted);
  const rows = list.dead_letters.slice(offset, offset + DEAD_PAGE);
  const go = (o) => { location.hash = "#/dead/" + enc(name) + "?offset=" + o; };
  const one = (verb, d) => async () => `${counted(verb, [d.id], await deadDo(base, verb, [d.id]), "")}`;
  const what = (d) => (d.topic || "a damaged entry") + (d.device ? " of " + d.device : "");
  update(s.list, list.total === 0 ? el("p", { class: "muted", id: "dead-list" }, "No dead letters.") : [
    el("div", { class: "pager" },
      el("span", { id: "dead-count" }, rows.length ? `${offset + 1}–${offset + rows.length} of ${list.total}` : `none from ${offset + 1} of ${list.total}`),
      offset > 0 ? el("button", { type: "button", id: "dead-previous", onclick: () => go(Math.max(0, offset - DEAD_PAGE)) }, "‹ previous") : "",
      offset + DEAD_PAGE < list.total ? el("button", { type: "button", id: "dead-next", onclick: () => go(offset + DEAD_PAGE) }, "next ›") : ""),
    el("table", { id: "dead-list" },
      el("tr", {}, ["device", "topic", "size", "reason", "error", "refused at", "log", "actions"].map(h => el("th", { scope: "col" }, h))),
      rows.map(d => el("tr", { class: "dead-row" + (d.damaged ? " damaged" : ""), "data-id": d.id },
        el("td", {}, d.damaged ? el("span", { class: "bad" }, "damaged entry") : "", d.damaged && d.device ? " " : "",
          d.device ? el("a", { href: deviceHash(d.device) }, d.device) : ""),
        el("td", {}, d.topic || ""), el("td", { class: "num" }, d.damaged && !d.topic ? "—" : fmtBytes(d.payload_bytes || 0)),
        el("td", {}, d.reason || ""), el("td", { class: "dead-error" + (d.damaged ? " bad" : "") }, d.error || ""),
        el("td", {}, fmtTime(d.refused_at)),
        el("td", { class: "muted", title: "id " + d.id }, (d.log || "") + (d.seq !== undefined ? " #" + d.seq : "")),
        el("td", { class: "actions" },
          confirmButton("Replay", "Send " + what(d) + " to " + name + " again?", one("Replayed", d), s.notice,
            { class: "dead-one-replay danger", value: d.id, "aria-label": "replay " + what(d), disabled: !!d.damaged,
              title: d.damaged ? "a damaged entry cannot be sent again; drop it" : undefined }),
          " ",
          confirmButton("Drop", "Delete " + what(d) + " for good?", one("Dropped", d), s.notice,
            { class: "dead-one-drop danger", value: d.id, "aria-label": "drop " + what(d) })))))]);
} };

// drawDevice offers the devices of the dead letters listed (the select
// keeps the operator's choice and is left alone while it has the
// focus) and, for the one chosen, replay and drop of all its dead
// letters, their IDs collected from the list when confirmed.
function drawDevice(ctx, base, name, counted) {
  const s = ctx.s, list = s.listed;
  const count = new Map(), damaged = new Map();
  for (const d of list.dead_letters) {
    if (!d.device) continue;
    count.set(d.device, (count.get(d.device) || 0) + 1);
    if (d.damaged) damaged.set(d.device, (damaged.get(d.device) || 0) + 1);
  }
  if (s.device && !count.has(s.device)) s.device = "";
  if (document.activeElement !== s.select) {
    show(s.select, el("option", { value: "" }, count.size ? "— choose a device —" : "— none —"),
      [...count.keys()].sort().map(dev => el("option", { value: dev }, `${dev} (${count.get(dev)})`)));
    s.select.value = s.device;
  }
  const dev = s.device;
  if (!dev) { update(s.byDevice, list.total > list.dead_letters.length ? el("span", { class: "muted" }, `devices of the first ${list.dead_letters.length} listed`) : ""); return; }
  const n = count.get(dev), k = damaged.get(dev) || 0;
  const act = (verb, replay) => async () => {
    const { ids, cut } = await deadOfDevice(base, dev, replay);
    const done = ids.length ? await deadDo(base, verb, ids) : 0;
    return counted(verb, ids, done, ` (device ${dev})`) + (cut ? ` Only the first ${DEAD_LIST_MAX} listed were looked at.` : "");
  };
  update(s.byDevice,
    confirmButton("Replay the device's", `Send the ${n - k} dead letter(s) of ${dev} to ${name} again` + (k ? ` (${k} damaged stay)?` : "?"),
      act("Replayed", true), s.notice, { id: "dead-device-replay", disabled: n === k }),
    " ",
    confirmButton("Drop the device's", `Delete the ${n} dead letter(s) of ${dev} for good?`, act("Dropped", false), s.notice, { id: "dead-device-drop" }));
}
