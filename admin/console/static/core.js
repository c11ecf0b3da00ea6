// devicegate operator console: the core every page uses. Plain
// JavaScript, no library: pages are built from the admin API's JSON with
// DOM calls that set text (textContent), never HTML, so device IDs,
// topics and reasons are shown as text. The admin token lives in
// sessionStorage (this tab only) and goes out as an Authorization
// header; it is never put in a URL.
"use strict";

const TOKEN_KEY = "devicegate.token";
const REFRESH_MS = 5000;

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

// show replaces an element's content.
function show(parent, ...children) { parent.replaceChildren(...nodes(children)); }

// update replaces a live section's content. What the operator is in the
// middle of is kept: a section is left as it is while a field in it is
// being typed in or a confirmation in it is open (the next refresh
// brings it up to date); a focused button or checkbox gets the focus
// back in the new content (found by its ID, or its class and value).
function update(section, ...children) {
  const f = document.activeElement;
  const inside = f && f !== document.body && section.contains(f);
  if (inside && (f.closest(".confirm") || f.matches("textarea, select, input:not([type=checkbox]):not([type=radio]):not([type=button])"))) return;
  section.replaceChildren(...nodes(children));
  if (!inside) return;
  let again = f.id ? document.getElementById(f.id) : null;
  if (!again && f.className && f.value !== undefined) {
    again = [...section.getElementsByClassName(f.className.split(" ")[0])].find(x => x.value === f.value && x.tagName === f.tagName);
  }
  if (again && section.contains(again)) again.focus({ preventScroll: true });
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

class APIError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

// Stale is thrown by a page's request that finished after the operator
// went to another page: nothing of it is shown.
class Stale extends Error {}

// api calls the admin API with the token; a 401 logs out, unless
// checking is set (the login form trying a token). A network failure
// is an APIError of status 0.
async function api(method, path, body, checking) {
  const init = { method, headers: { "Authorization": "Bearer " + token() }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try { resp = await fetch(path, init); } catch (e) { throw new APIError(0, "cannot reach the gateway (" + e.message + ")"); }
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

// announce says a result to screen readers (the live region) and, when
// a page's notice is given, shows it there too.
function announce(text, notice) {
  const live = document.getElementById("announce");
  live.textContent = "";
  live.textContent = text;
  if (notice) { notice.textContent = text; notice.hidden = false; }
}

// ---- login ----

function showLogin(msg) {
  document.getElementById("nav").hidden = true;
  document.getElementById("page").hidden = true;
  document.getElementById("offline").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = msg || "";
  document.title = "Log in — devicegate console";
  document.getElementById("token").focus();
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  current = null;
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

// ---- routing and refresh ----

// pages maps a hash's first part to its page: a title and a render
// function, called at once and then every REFRESH_MS while the page is
// shown. render(ctx) builds the page's sections on ctx.first and
// refreshes their data every time; ctx.get is api GET that throws Stale
// once the operator has left the page.
const pages = {};
let current = null; // the page shown: its ctx
let refreshTimer = 0;

function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const qi = h.indexOf("?");
  const path = qi < 0 ? h : h.slice(0, qi);
  const parts = path.split("/");
  let arg = "", bad = "";
  if (parts.length > 1) {
    try { arg = decodeURIComponent(parts.slice(1).join("/")); } catch (e) { bad = "That link is damaged: " + parts.slice(1).join("/") + " is not a valid escaped ID."; }
  }
  return { page: parts[0] || "overview", arg, bad, params: new URLSearchParams(qi < 0 ? "" : h.slice(qi + 1)) };
}

async function route() {
  clearTimeout(refreshTimer);
  if (!token()) { current = null; showLogin(); return; }
  const r = parseHash();
  const p = pages[r.page] ? r.page : "overview";
  const page = document.getElementById("page");
  const ctx = { r, page, first: true };
  ctx.live = () => current === ctx;
  ctx.get = async (path) => { const d = await api("GET", path); if (!ctx.live()) throw new Stale(); return d; };
  current = ctx;
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  for (const a of document.querySelectorAll("nav a")) {
    const on = a.dataset.page === p || (p === "device" && a.dataset.page === "devices");
    a.classList.toggle("active", on);
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.title = (typeof pages[p].title === "function" ? pages[p].title(r) : pages[p].title) + " — devicegate console";
  page.replaceChildren(); // nothing of the page left is shown under the new one
  page.hidden = false;
  if (r.bad) {
    show(page, el("h1", {}, "Damaged link"), el("p", { class: "error", role: "alert" }, r.bad), el("p", {}, el("a", { href: "#/devices" }, "Devices")));
    return;
  }
  await tick(ctx, pages[p].render);
}

// tick renders ctx's page and schedules the next refresh; a failure
// says so and is tried again (the gateway restarting comes back by
// itself), a refused token logs out (api).
async function tick(ctx, render) {
  if (!ctx.live()) return;
  const offline = document.getElementById("offline");
  try {
    await render(ctx);
    ctx.first = false;
    offline.hidden = true;
  } catch (e) {
    if (e instanceof Stale || !ctx.live() || e.status === 401) return;
    if (e.status === 0 || e.status >= 500) {
      offline.textContent = "The gateway does not answer (" + e.message + "); trying again every " + REFRESH_MS / 1000 + " s.";
      offline.hidden = false;
    } else if (ctx.first) {
      show(ctx.page, el("h1", {}, "Error"), el("p", { class: "error", role: "alert" }, e.message));
    }
    if (!(e instanceof APIError)) console.error(e);
  }
  if (ctx.live()) {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => tick(ctx, render), REFRESH_MS);
  }
}

// refreshNow renders the page shown again at once (after an action).
function refreshNow() {
  if (current) { clearTimeout(refreshTimer); return tick(current, pages[current.r.page in pages ? current.r.page : "overview"].render); }
}

// confirmButton asks for a confirmation in place before doing act; the
// focus goes to the question's Confirm, and back to the button after.
// act's result (a string) is announced in notice.
function confirmButton(label, question, act, notice, attrs) {
  const wrap = el("span", {});
  const b = el("button", Object.assign({ type: "button", class: "danger", onclick: () => {
    const yes = el("button", { type: "button", class: "danger confirm-yes", onclick: async () => {
      yes.disabled = true;
      try {
        const said = await act();
        wrap.replaceChildren(b);
        b.focus();
        if (said) announce(said, notice);
        await refreshNow(); // the page as the action left it, the focus kept
      } catch (e) {
        wrap.replaceChildren(b, el("span", { class: "error", role: "alert" }, " " + e.message));
        b.focus();
      }
    } }, "Confirm");
    const no = el("button", { type: "button", onclick: () => { wrap.replaceChildren(b); b.focus(); } }, "Cancel");
    wrap.replaceChildren(el("span", { class: "confirm", role: "group", "aria-label": question }, question + " ", yes, no));
    yes.focus();
  } }, attrs || {}), label);
  wrap.append(b);
  return wrap;
}

// each runs act for every item, in turn: a sentence counting what
// worked and naming what failed, and the failures' messages.
async function each(items, verb, act) {
  const failed = [], errors = [];
  for (const x of items) {
    try { await act(x); } catch (e) { failed.push(x + ": " + e.message); errors.push(e.message); }
  }
  return { text: `${verb} ${items.length - failed.length} of ${items.length}.` + (failed.length ? " Failed: " + failed.join("; ") : ""), errors };
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", () => logout("Logged out."));
  window.addEventListener("hashchange", route);
  route();
});
