// DOM building and formatting helpers shared by the views. Text always goes in as textContent,
// never as HTML, so nothing a task or an executor reports can inject markup.

/**
 * h("div.card#id", {attrs}, ...children). Attributes: `class`, `dataset`, `on<Event>` handlers,
 * `style` (an object, set through CSSOM), booleans (`disabled`, `hidden`...) and plain strings.
 */
export function h(tag, attrs, ...children) {
  if (attrs === null || typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs)) {
    if (attrs !== undefined && attrs !== null) children.unshift(attrs);
    attrs = {};
  }
  const [, name = "div", rest = ""] = tag.match(/^([a-z0-9-]*)(.*)$/i);
  const el = document.createElement(name || "div");
  for (const part of rest.match(/[.#][^.#]+/g) || []) {
    if (part[0] === ".") el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") {
      for (const c of String(value).split(/\s+/).filter(Boolean)) el.classList.add(c);
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (key === "style") {
      for (const [prop, v] of Object.entries(value)) {
        if (prop.startsWith("--")) el.style.setProperty(prop, v);
        else el.style[prop] = v;
      }
    } else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else if (key === "value" && "value" in el) {
      el.value = value;
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export const clear = (el, ...children) => {
  el.replaceChildren();
  append(el, children);
  return el;
};

// ---- formatting ----------------------------------------------------------------------------

const nf = new Intl.NumberFormat("en-US");
export const fmtInt = (n) => (n === null || n === undefined ? "—" : nf.format(n));

export function fmtPct(done, total) {
  if (!total) return "0%";
  const pct = (100 * done) / total;
  if (pct > 0 && pct < 1) return "<1%";
  if (pct < 100 && pct > 99) return "99%";
  return `${Math.floor(pct)}%`;
}

export function fmtRate(perSecond) {
  if (perSecond === null || perSecond === undefined || !isFinite(perSecond)) return "—";
  if (perSecond === 0) return "0/s";
  if (perSecond >= 100) return `${nf.format(Math.round(perSecond))}/s`;
  if (perSecond >= 10) return `${perSecond.toFixed(1)}/s`;
  return `${perSecond.toFixed(2)}/s`;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
  if (seconds < 0) seconds = 0;
  if (seconds < 0.1) return seconds === 0 ? "0 s" : "<0.1 s";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const m = Math.floor(seconds / 60);
  const s = Math.round(seconds % 60);
  if (m < 60) return `${m}m ${String(s).padStart(2, "0")}s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

export const toDate = (iso) => (iso ? new Date(iso) : null);
export const secondsBetween = (a, b) => (a && b ? (toDate(b) - toDate(a)) / 1000 : null);
export const secondsSince = (iso) => (iso ? (Date.now() - toDate(iso)) / 1000 : null);

export function fmtAgo(iso) {
  if (!iso) return "never";
  const s = Math.max(0, secondsSince(iso));
  if (s < 5) return "just now";
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

// Times carry their zone: a shared pool spans offices, and a bare "14:02" is read in the reader's zone.
const dtf = new Intl.DateTimeFormat(undefined, {
  month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
});
export const fmtTime = (iso) => (iso ? dtf.format(toDate(iso)) : "—");
const clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit",
                                                  timeZoneName: "short" });
/** A time of day, with the date too when it is not today. */
export function fmtClock(iso) {
  if (!iso) return "—";
  const d = toDate(iso);
  return d.toDateString() === new Date().toDateString() ? clock.format(d) : dtf.format(d);
}

export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KB", "MB", "GB", "TB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

// ---- components -------------------------------------------------------------------------------

export function pill(status, text = status) {
  return h("span.pill", { class: `pill-${status}`, dataset: { status } }, h("span.pill-dot"), text);
}

/** A bar in segments, one a part (a subtask state's count, as api.js's progressParts gives them), in the
 * order of `parts`, each a share of the total; each segment's colour is its CSS class, seg-<part>. */
export function progressBar(parts, total, { size = "md", label } = {}) {
  const bar = h("div.progress", {
    class: `progress-${size}`, role: "progressbar", "aria-valuemin": "0", "aria-valuemax": String(total || 0),
    "aria-valuenow": String(parts.done || 0), "aria-label": label || "progress",
  });
  if (total > 0) {
    for (const [key, value] of Object.entries(parts)) {
      if (value > 0) {
        bar.append(h("span.progress-seg", { class: `seg-${key}`, style: { width: `${(100 * value) / total}%` } }));
      }
    }
  }
  return bar;
}

export function emptyState({ icon = "○", title, text, action }) {
  return h("div.empty", h("div.empty-icon", { "aria-hidden": "true" }, icon), h("h3", title),
    text ? h("p", text) : null, action || null);
}

export function toast(message, kind = "info") {
  const host = document.getElementById("toasts");
  if (!host) return;
  const el = h("div.toast", { class: `toast-${kind}`, role: "status" }, message);
  host.append(el);
  setTimeout(() => el.classList.add("toast-out"), 3600);
  setTimeout(() => el.remove(), 4000);
}

export function kv(label, value, extra) {
  return h("div.kv", h("dt", label), h("dd", extra ? { class: extra } : {}, value));
}

export function stat(label, value, sub, { tone } = {}) {
  return h("div.stat", { class: tone ? `stat-${tone}` : "" },
    h("div.stat-label", label), h("div.stat-value", value), sub ? h("div.stat-sub", sub) : null);
}

export function taskHref(t) {
  return `#/tasks/${encodeURIComponent(t.team)}/${encodeURIComponent(t.project)}/${encodeURIComponent(t.name ?? t.task_name)}`;
}

/** Records per second: measured over the last polls while running, else the task's average. */
const samples = new Map();
export function taskRate(task) {
  const key = `${task.team}/${task.project}/${task.name}`;
  const done = task.records.done;
  if (task.status === "running") {
    const now = performance.now();
    const list = samples.get(key) || [];
    if (!list.length || list[list.length - 1].done !== done || now - list[list.length - 1].t > 500) {
      list.push({ t: now, done });
    }
    while (list.length > 2 && now - list[0].t > 15000) list.shift();
    samples.set(key, list);
    const first = list[0];
    if (now - first.t >= 3000 && done >= first.done) return ((done - first.done) * 1000) / (now - first.t);
    const elapsed = secondsSince(task.started_at);
    return elapsed > 0 ? done / elapsed : null;
  }
  samples.delete(key);
  if (task.started_at && task.finished_at && done > 0) {
    const elapsed = secondsBetween(task.started_at, task.finished_at);
    return elapsed > 0 ? done / elapsed : null;
  }
  return null;
}

export function taskElapsed(task) {
  if (!task.started_at) return null;
  return task.finished_at ? secondsBetween(task.started_at, task.finished_at) : secondsSince(task.started_at);
}
