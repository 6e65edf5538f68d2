// The shell: hash routing, sign-in, and the live poller every view uses (paused while hidden).

import { api, ApiError, auth, loadMeta, meta, UNAUTHORIZED_EVENT } from "./api.js";
import { clear, h, toast } from "./dom.js";
import { executorsView } from "./executors.js";
import { submitView } from "./submit.js";
import { taskView } from "./task.js";
import { tasksView } from "./tasks.js";
import { usageView } from "./usage.js";

const POLL_MS = 1500;

const ROUTES = [
  [/^\/tasks\/?$/, "tasks", tasksView],
  [/^\/tasks\/([^/]+)\/([^/]+)\/([^/]+)\/?$/, "tasks", taskView],
  [/^\/submit\/?$/, "submit", submitView],
  [/^\/executors\/?$/, "executors", executorsView],
  [/^\/usage\/?$/, "usage", usageView],
];

const viewEl = document.getElementById("view");
const topbar = document.getElementById("topbar");
const liveEl = document.getElementById("live");
let signInNotice = null;

// ---- live updates ----------------------------------------------------------------------------

/** Runs the current view's refresh every POLL_MS; never two at once; none while the tab is hidden. */
class Poller {
  constructor() {
    this.view = null;
    this.generation = 0;
    this.timer = null;
    this.controller = null;
    this.waiting = false;
    document.addEventListener("visibilitychange", () => {
      setLive(document.hidden ? "paused" : "live");
      if (!document.hidden && this.waiting) this.tick(this.generation);
    });
  }

  start(view) {
    this.stop();
    this.view = view;
    if (view.refresh) this.tick(this.generation);
  }

  stop() {
    this.generation += 1;
    clearTimeout(this.timer);
    this.controller?.abort();
    this.view?.destroy?.();
    this.view = null;
    this.waiting = false;
  }

  /** Refresh now (after an action), then carry on with the usual rhythm. */
  now() {
    if (!this.view?.refresh) return;
    clearTimeout(this.timer);
    this.controller?.abort();
    this.generation += 1;
    this.tick(this.generation);
  }

  async tick(generation) {
    if (generation !== this.generation || !this.view) return;
    if (document.hidden) {
      this.waiting = true;
      return;
    }
    this.waiting = false;
    this.controller = new AbortController();
    try {
      await this.view.refresh(this.controller.signal);
      setLive("live");
    } catch (err) {
      if (err.name === "AbortError") return;
      setLive("error", err.message);
      if (!(err instanceof ApiError) || err.status === 0 || err.status >= 500) {
        console.warn("refresh failed", err);
      } else if (err.status !== 401) {
        this.view?.onError?.(err);
      }
    }
    if (generation !== this.generation) return;
    this.timer = setTimeout(() => this.tick(generation), this.view?.interval ?? POLL_MS);
  }
}

const poller = new Poller();

function setLive(state, detail = "") {
  liveEl.dataset.state = state;
  liveEl.querySelector(".live-text").textContent =
    state === "live" ? "Live" : state === "paused" ? "Paused" : "Reconnecting";
  liveEl.title = state === "error" ? detail : state === "paused" ? "Updates paused while the tab is hidden" :
    "Updates every 1.5 s";
}

// ---- routing -----------------------------------------------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/tasks";
  const [path, query = ""] = raw.split("?");
  return { path, params: new URLSearchParams(query) };
}

export function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  const { path, params } = parseHash();
  if (!auth.token) {
    poller.stop();
    renderSignIn();
    return;
  }
  if (!meta) {
    // A refused token signs out (api.js's event); any other failure is tried again.
    loadMeta().then(route, (err) => { if (err.status !== 401) setTimeout(route, POLL_MS); });
    return;
  }
  topbar.hidden = false;
  document.body.classList.remove("signed-out");
  for (const [pattern, nav, make] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    for (const a of document.querySelectorAll("[data-nav]")) {
      a.classList.toggle("active", a.dataset.nav === nav);
      if (a.dataset.nav === nav) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    poller.stop();
    const ctx = { params, navigate, refreshNow: () => poller.now(), path };
    const view = make(ctx, ...match.slice(1).map(decodeURIComponent));
    document.title = view.title ? `${view.title} · Minions` : "Minions";
    clear(viewEl, view.el);
    viewEl.focus({ preventScroll: true });
    window.scrollTo(0, 0);
    poller.start(view);
    return;
  }
  navigate("#/tasks");
}

// ---- sign in -----------------------------------------------------------------------------------

function renderSignIn() {
  topbar.hidden = true;
  document.body.classList.add("signed-out");
  document.title = "Sign in · Minions";
  const input = h("input#token.input", {
    type: "password", name: "token", autocomplete: "current-password", spellcheck: "false",
    placeholder: "Paste your API token", required: true, "aria-describedby": "token-help",
  });
  const error = h("p.field-error#token-error", { role: "alert", hidden: !signInNotice }, signInNotice || "");
  signInNotice = null;
  const button = h("button.btn.btn-primary.btn-block", { type: "submit" }, "Sign in");
  const reveal = h("button.input-affix", {
    type: "button", "aria-label": "Show token",
    onclick: () => {
      input.type = input.type === "password" ? "text" : "password";
      reveal.textContent = input.type === "password" ? "Show" : "Hide";
    },
  }, "Show");

  async function submit(event) {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    button.disabled = true;
    button.textContent = "Checking…";
    error.hidden = true;
    try {
      await api("/api/v1/tasks?limit=1", { token });
      auth.set(token);
      route();
    } catch (err) {
      error.textContent = err.status === 401 ? "That token was not recognised (unknown or revoked)."
        : err.status === 403 ? "That token cannot read tasks: the web UI needs a user or admin token."
          : err.message;
      error.hidden = false;
      input.classList.add("invalid");
      button.disabled = false;
      button.textContent = "Sign in";
      input.focus();
    }
  }

  const card = h("div.signin",
    h("div.signin-card",
      h("div.signin-brand", h("img", { src: "/ui/favicon.svg", alt: "", width: "44", height: "44" }),
        h("span", "Minions")),
      h("h1", "Sign in"),
      h("p.muted", "Batch inference on idle machines. Use the API token your team was given."),
      h("form.form", { onsubmit: submit, novalidate: true },
        h("div.field",
          h("label", { for: "token" }, "API token"),
          h("div.input-group", input, reveal),
          error,
          h("p.help#token-help", "Create one with ", h("code", "minions token create --role user"),
            " or use the admin token that ", h("code", "minions up"), " printed. It is kept in this browser only.")),
        button)),
    h("p.signin-foot", "Minions · pull-based inference on PostgreSQL"));
  clear(viewEl, card);
  input.focus();
}

function signOut(message) {
  auth.clear();
  signInNotice = message || null;
  if (location.hash && location.hash !== "#/tasks") location.hash = "#/tasks"; // hashchange routes
  else route();
}

document.getElementById("signout").addEventListener("click", () => {
  signOut();
  toast("Signed out");
});

window.addEventListener(UNAUTHORIZED_EVENT, () => {
  if (auth.token) signOut("Your session ended: the token was refused (revoked?). Sign in again.");
});
window.addEventListener("hashchange", route);
window.addEventListener("storage", (event) => {
  if (event.key === "minions.token") route();
});

setLive("live");
route();
