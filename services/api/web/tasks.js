// #/tasks: every task with live progress, filtered by status, team and project. The OpenAI
// interactive lane's requests (a task each) are hidden unless the toggle asks for them.

import { api, isFinished, isUnsplit, meta, progressParts } from "./api.js";
import {
  clear, emptyState, fmtAgo, fmtDuration, fmtInt, fmtPct, fmtRate, fmtTime, h, pill, progressBar, stat,
  taskElapsed, taskHref, taskRate,
} from "./dom.js";

/** "All", then each status the server knows. */
const statusFilters = () => [["", "All"], ...meta.task_statuses.map((s) => [s, s[0].toUpperCase() + s.slice(1)])];
const PAGE = 50;

export function tasksView(ctx) {
  const filters = {
    status: ctx.params.get("status") || "",
    team: ctx.params.get("team") || "",
    project: ctx.params.get("project") || "",
    interactive: ctx.params.get("interactive") === "all" ? "all" : "",
  };
  let limit = PAGE;
  const teamsSeen = new Set();

  const statsEl = h("div.stats");
  const tableHost = h("div.card.table-card", h("div.loading", "Loading tasks…"));
  const moreHost = h("div.more");
  const teamList = h("datalist#teams-list");
  const errorEl = h("div.banner.banner-error", { hidden: true });

  const segmented = h("div.segmented", { role: "tablist", "aria-label": "Filter by status" },
    statusFilters().map(([value, label]) => h("button", {
      type: "button", role: "tab", dataset: { status: value }, "aria-selected": String(filters.status === value),
      onclick: () => setFilter("status", value),
    }, label)));

  const teamInput = filterInput("team", "Team", filters.team, "teams-list");
  const projectInput = filterInput("project", "Project", filters.project);
  const interactiveToggle = h("label.toggle", { title: "Requests to /v1/embeddings and /v1/chat/completions" },
    h("input", { type: "checkbox", name: "interactive", checked: filters.interactive === "all",
      onchange: (e) => setFilter("interactive", e.target.checked ? "all" : "") }),
    h("span", "Interactive requests"));

  function filterInput(key, label, value, list) {
    let debounce = null;
    const input = h("input.input.input-sm", {
      type: "search", placeholder: `All ${label.toLowerCase()}s`, value, list, "aria-label": `Filter by ${label}`,
      name: key, spellcheck: "false", autocomplete: "off",
      oninput: () => {
        clearTimeout(debounce);
        debounce = setTimeout(() => setFilter(key, input.value.trim()), 350);
      },
    });
    return h("label.filter", h("span.filter-label", label), input);
  }

  function setFilter(key, value) {
    filters[key] = value;
    limit = PAGE;
    for (const b of segmented.children) b.setAttribute("aria-selected", String(b.dataset.status === filters.status));
    const q = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    history.replaceState(null, "", `#/tasks${q.toString() ? `?${q}` : ""}`);
    tableHost.classList.add("is-stale");
    ctx.refreshNow();
  }

  const el = h("section.page",
    h("div.page-head",
      h("div", h("h1", "Tasks"), h("p.page-sub", "Batch inference jobs and their progress, updated live.")),
      h("a.btn.btn-primary", { href: "#/submit" }, h("span.btn-icon", "+"), "New task")),
    statsEl,
    h("div.toolbar", segmented, h("div.toolbar-filters", teamInput, projectInput, interactiveToggle), teamList),
    errorEl,
    tableHost,
    moreHost);

  async function refresh(signal) {
    const base = new URLSearchParams();
    if (filters.team) base.set("team", filters.team);
    if (filters.project) base.set("project", filters.project);
    if (filters.interactive) base.set("interactive", filters.interactive);
    const listQuery = new URLSearchParams(base);
    listQuery.set("limit", String(limit));
    if (filters.status) listQuery.set("status", filters.status);
    const overviewQuery = new URLSearchParams(base);
    overviewQuery.set("limit", "200");
    const [list, overview, executors] = await Promise.all([
      api(`/api/v1/tasks?${listQuery}`, { signal }),
      filters.status ? api(`/api/v1/tasks?${overviewQuery}`, { signal }) : null,
      api("/api/v1/executors", { signal }).catch(() => null),
    ]);
    errorEl.hidden = true;
    tableHost.classList.remove("is-stale");
    renderStats((overview || list).tasks, executors?.executors);
    renderTable(list.tasks);
    clear(moreHost, list.next && limit < 500
      ? h("button.btn.btn-secondary", { type: "button", onclick: () => { limit = Math.min(500, limit + PAGE); ctx.refreshNow(); } },
        "Show more tasks")
      : null);
    for (const t of (overview || list).tasks) teamsSeen.add(t.team);
    clear(teamList, [...teamsSeen].sort().map((team) => h("option", { value: team })));
  }

  function renderStats(tasks, executors) {
    const count = (s) => tasks.filter((t) => t.status === s).length;
    const running = tasks.filter((t) => t.status === "running");
    const throughput = running.reduce((sum, t) => sum + (taskRate(t) || 0), 0);
    const active = tasks.filter((t) => !isFinished(t.status)).length;
    const online = executors ? executors.filter((e) => e.status === "busy" || e.status === "idle").length : null;
    const busy = executors ? executors.filter((e) => e.status === "busy").length : null;
    clear(statsEl,
      stat("Active tasks", fmtInt(active), `${count("running")} running · ${tasks.filter((t) => t.status === "queued" || isUnsplit(t.status)).length} waiting`, { tone: "blue" }),
      stat("Throughput", running.length ? `${fmtRate(throughput)}` : "—", running.length ? "records per second" : "nothing running"),
      stat("Completed", fmtInt(count("completed")), `${fmtInt(count("failed"))} failed · ${fmtInt(count("cancelled"))} cancelled`, { tone: "green" }),
      h("a.stat-link", { href: "#/executors" },
        stat("Executors online", online === null ? "—" : fmtInt(online), busy === null ? "" : `${busy} busy · ${online - busy} idle`, { tone: "violet" })));
  }

  function renderTable(tasks) {
    if (!tasks.length) {
      const filtered = filters.status || filters.team || filters.project;
      clear(tableHost, emptyState(filtered
        ? { icon: "⌕", title: "No tasks match these filters", text: "Try another status, team or project.",
          action: h("button.btn.btn-secondary", { type: "button", onclick: () => { teamInput.querySelector("input").value = ""; projectInput.querySelector("input").value = ""; filters.team = ""; filters.project = ""; setFilter("status", ""); } }, "Clear filters") }
        : { icon: "✦", title: "No tasks yet", text: "Submit a batch of records to embed, complete or sleep on, and watch it run here.",
          action: h("a.btn.btn-primary", { href: "#/submit" }, "Submit your first task") }));
      return;
    }
    const table = h("table.table.tasks-table",
      h("thead", h("tr",
        h("th", "Task"), h("th", "Status"), h("th.col-progress", "Progress"), h("th.num", "Rate"),
        h("th.num", "Subtasks"), h("th", "Kind"), h("th", "Submitted"), h("th.num", "Duration"))),
      h("tbody", tasks.map(row)));
    clear(tableHost, h("div.table-scroll", table));
  }

  function row(t) {
    const href = taskHref(t);
    const s = t.subtasks;
    const rate = taskRate(t);
    return h("tr.clickable", {
      dataset: { task: `${t.team}/${t.project}/${t.name}`, status: t.status },
      onclick: (e) => { if (!e.target.closest("a")) ctx.navigate(href); },
    },
    h("td.cell-task",
      h("a.task-name", { href }, t.name),
      h("div.task-scope", h("span", t.team), h("span.sep", "/"), h("span", t.project))),
    h("td", pill(t.status)),
    h("td.col-progress",
      progressBar(progressParts(s), s.total,
        { size: "sm", label: `${t.name} progress` }),
      h("div.progress-caption",
        h("span.progress-records", `${fmtInt(t.records.done)} / ${fmtInt(t.records.total)} records`),
        h("span.progress-pct", fmtPct(t.records.done, t.records.total)))),
    h("td.num", rate ? fmtRate(rate) : "—"),
    h("td.num",
      h("span", `${fmtInt(s.done)} / ${fmtInt(s.total)}`),
      s.failed ? h("div.cell-sub.text-danger", `${fmtInt(s.failed)} failed`) : null,
      !s.failed && s.leased ? h("div.cell-sub.text-info", `${fmtInt(s.leased)} running`) : null),
    h("td.cell-kind", h("span.kind", { class: `kind-${t.kind}` }, t.kind),
      t.model !== t.kind ? h("div.cell-sub.truncate", { title: t.model }, t.model) : null),
    h("td.nowrap", { title: fmtTime(t.created_at) }, fmtAgo(t.created_at)),
    h("td.num", fmtDuration(taskElapsed(t))));
  }

  return { title: "Tasks", el, refresh };
}
