// Groups, Rules and Blocks.
"use strict";

const GROUPS_SHOWN = 50;

// slug makes a name safe in an element ID (unique per name: escaped).
function slug(s) { return enc(s).replace(/%/g, "_"); }

pages.groups = { title: "Groups", render: async (ctx) => {
  const all = await ctx.get("/api/v1/groups");
  // The list has no window state: each group's own answer has it.
  const list = await Promise.all(all.groups.slice(0, GROUPS_SHOWN).map(g =>
    ctx.get("/api/v1/groups/" + enc(g.group)).catch(e => { if (e instanceof Stale) throw e; return g; })));
  if (ctx.first) {
    ctx.s = { notice: el("p", { class: "notice", id: "groups-notice", hidden: true }), list: el("div", {}), forms: {} };
    show(ctx.page, el("h1", {}, "Groups"), ctx.s.notice, ctx.s.list);
  }
  const done = async (said) => { ctx.s.forms = {}; await refreshNow(); announce(said, ctx.s.notice); };
  update(ctx.s.list,
    all.groups.length > GROUPS_SHOWN ? el("p", { class: "muted" }, `The first ${GROUPS_SHOWN} of ${all.groups.length} groups.`) : "",
    list.length === 0 ? el("p", { class: "muted" }, "No device has joined a group since the gateway started.") :
      list.map(g => {
        const path = "/api/v1/groups/" + enc(g.group);
        // A group's form is kept across refreshes (a half-typed limit stays).
        const f = ctx.s.forms[g.group] || (ctx.s.forms[g.group] = el("details", {}, el("summary", {}, "Set override"),
          overrideForm("group-" + slug(g.group) + "-", { quota: g.quota, source: g.source }, path, true, done)));
        return el("section", { class: "group" },
          el("h2", {}, g.group + " ", el("span", { class: "muted" }, `${g.connected} connected, quota from ${g.source}` + (g.label && g.label !== g.group ? `, label ${g.label}` : ""))),
          windowTable("group-" + g.group, windowsOf(g.quota)),
          f,
          g.source === "override" ? confirmButton("Delete override", "Delete the override of group " + g.group + "?", async () => {
            await api("DELETE", path + "/quota"); ctx.s.forms = {}; return "Override of group " + g.group + " deleted.";
          }, ctx.s.notice) : "");
      }));
} };

pages.rules = { title: "Rules", render: async (ctx) => {
  const list = await ctx.get("/api/v1/rules");
  if (ctx.first) {
    ctx.s = { notice: el("p", { class: "notice", id: "rules-notice", hidden: true }), list: el("div", {}) };
    show(ctx.page, el("h1", {}, "Rules"),
      el("p", { class: "muted" }, "A rule in shadow mode decides and counts as if enforcing, and lets every message through. A switch covers the rule's own quota and its topic classes, not its group, and holds until the gateway restarts."),
      ctx.s.notice, ctx.s.list);
  }
  update(ctx.s.list, list.rules.length === 0 ? el("p", { class: "muted" }, "No rules configured (limits.rules): every device has the default quota.") :
    el("table", { id: "rules" }, el("tr", {}, ["rule", "mode", "classes", "group (not switched)", "would refuse", ""].map((h, i) => el("th", { scope: "col", class: i === 4 ? "num" : "" }, h))),
      list.rules.map(x => el("tr", {},
        el("td", {}, el("a", { href: "#/devices?rule=" + enc(x.rule) }, x.rule)),
        el("td", { class: x.enforce ? "ok" : "bad" }, x.enforce ? "enforcing" : "shadow"),
        el("td", {}, (x.classes || []).map(c => c.name + (c.enforce ? "" : " (shadow)")).join(", ") || "—"),
        el("td", {}, x.group ? x.group.name + (x.group.enforce ? "" : " (shadow)") : "—"),
        el("td", { class: "num" }, x.would_refuse === undefined ? "—" : x.would_refuse),
        el("td", {}, el("button", { type: "button", class: "rule-switch", id: "switch-" + slug(x.rule), "aria-label": (x.enforce ? "switch rule " + x.rule + " to shadow mode" : "enforce rule " + x.rule), onclick: async (ev) => {
          ev.target.disabled = true;
          try {
            await api("PUT", "/api/v1/rules/" + enc(x.rule) + "/enforce", { enforce: !x.enforce });
            await refreshNow();
            announce("Rule " + x.rule + (x.enforce ? " in shadow mode." : " enforcing."), ctx.s.notice);
          } catch (e) { ev.target.disabled = false; announce(e.message, ctx.s.notice); }
        } }, x.enforce ? "Switch to shadow" : "Enforce"))))));
} };

pages.blocks = { title: "Blocks", render: async (ctx) => {
  const list = await ctx.get("/api/v1/blocks");
  if (ctx.first) {
    ctx.sel = new Set();
    ctx.s = { notice: el("p", { class: "notice", hidden: true, id: "blocks-notice" }), list: el("div", {}) };
    show(ctx.page, el("h1", {}, "Blocks"), ctx.s.notice, ctx.s.list,
      el("p", {}, confirmButton("Lift selected", "Lift the blocks of the devices selected?", async () => {
        const r = await each([...ctx.sel], "Lifted", d => api("DELETE", devicePath(d) + "/block"));
        ctx.sel.clear();
        return r.text.replace(/^Lifted (\d+) of \d+\./, "Lifted $1 block(s).");
      }, ctx.s.notice, { id: "lift-selected" })));
  }
  const boxes = list.blocks.map(b => el("input", { type: "checkbox", class: "block-select", value: b.device, "aria-label": "select " + b.device,
    checked: ctx.sel.has(b.device), onchange: (ev) => { if (ev.target.checked) ctx.sel.add(b.device); else ctx.sel.delete(b.device); } }));
  update(ctx.s.list, list.blocks.length === 0 ? el("p", { class: "muted", id: "no-blocks" }, "No device is blocked.") :
    el("table", { id: "blocks" },
      el("tr", {}, el("th", { scope: "col" }, el("input", { type: "checkbox", id: "select-all", "aria-label": "select every blocked device", onchange: (ev) => {
        for (const x of boxes) { x.checked = ev.target.checked; if (x.checked) ctx.sel.add(x.value); else ctx.sel.delete(x.value); }
      } })), ["device", "blocked until", "since", "reason"].map(h => el("th", { scope: "col" }, h))),
      list.blocks.map((b, i) => el("tr", { class: "block-row" }, el("td", {}, boxes[i]),
        el("td", {}, el("a", { href: deviceHash(b.device) }, b.device)), el("td", {}, fmtTime(b.until)),
        el("td", {}, fmtTime(b.since)), el("td", { class: "block-reason" }, b.reason || "not recorded")))));
} };
