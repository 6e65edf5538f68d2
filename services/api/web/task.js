// #/tasks/{team}/{project}/{name}: one task, live: progress, subtask map, attempts, executors,
// a results preview and the download.

import { api, ApiError, isFinished, isProblemAttempt, isUnsplit, meta, progressParts, taskPath } from "./api.js";
import {
  clear, emptyState, fmtAgo, fmtBytes, fmtClock, fmtDuration, fmtInt, fmtPct, fmtRate, fmtTime, h, kv, pill,
  progressBar, secondsBetween, secondsSince, stat, taskElapsed, taskRate, toast,
} from "./dom.js";

const MAX_SUBTASKS = 2000; // cells drawn; the counts above always cover the whole task
const PAGE = 1000;
const PREVIEW_LINES = 20;
const ATTEMPT_ROWS = 100;
const WARNING_LABEL = { unservable: "Waiting. ", held_for_check: "Held for a check. ", pin_released: "Model pin released. ", quarantined_results: "Results in doubt. " };
// A subtask state is shown by its name, capitalised, but for a leased subtask: its executor is running it.
const STATE_LABEL = { leased: "Running" };
const stateLabel = (state) => STATE_LABEL[state] || state[0].toUpperCase() + state.slice(1);

export function taskView(ctx, team, project, name) {
  const path = taskPath(team, project, name);
  let task = null;
  let subtasks = [];
  let subtasksMore = false;
  let subtasksFetchedFinished = false;
  let notFound = false;
  let selected = null; // a subtask_id whose attempts are shown alone
  let problemsOnly = false;
  let previewOpen = false;
  let previewDoneAt = -1;
  let previewLoadedAt = 0;
  let previewBusy = false;

  const headHost = h("div.task-head");
  const errorHost = h("div");
  const progressHost = h("div.card.progress-card");
  const mapHost = h("div.card-body");
  const detailsHost = h("div.card-body");
  const executorsHost = h("div");
  const attemptsHost = h("div");
  const resultsBody = h("div.results-body");
  const resultsActions = h("div.card-actions");
  const problemsToggle = h("label.toggle",
    h("input", { type: "checkbox", onchange: (e) => { problemsOnly = e.target.checked; renderAttempts(); } }),
    h("span", "Only retries and failures"));
  const selectionHost = h("div.card-actions", problemsToggle);

  const cancelDialog = h("dialog.dialog",
    h("form", { method: "dialog" },
      h("h3", "Cancel this task?"),
      h("p", "Pending subtasks are cancelled now; running ones stop at their next heartbeat. Results keep what finished."),
      h("div.dialog-buttons",
        h("button.btn.btn-ghost", { value: "keep" }, "Keep running"),
        h("button.btn.btn-danger", { value: "cancel", dataset: { action: "confirm-cancel" } }, "Cancel task"))));
  cancelDialog.addEventListener("close", () => {
    if (cancelDialog.returnValue === "cancel") cancelTask();
  });

  const el = h("section.page",
    h("nav.crumbs", h("a", { href: "#/tasks" }, "Tasks"), h("span.sep", "/"),
      h("a", { href: `#/tasks?team=${encodeURIComponent(team)}` }, team), h("span.sep", "/"),
      h("a", { href: `#/tasks?team=${encodeURIComponent(team)}&project=${encodeURIComponent(project)}` }, project),
      h("span.sep", "/"), h("span", { "aria-current": "page" }, name)),
    headHost,
    errorHost,
    progressHost,
    h("div.grid-main",
      h("div.column",
        h("div.card", h("div.card-head", h("h2", "Subtasks"), h("span.card-note", "each cell is one subtask")), mapHost),
        h("div.card", h("div.card-head", h("h2", "Executors"), h("span.card-note", "machines that ran this task")),
          executorsHost)),
      h("div.column",
        h("div.card", h("div.card-head", h("h2", "Details")), detailsHost))),
    h("div.card.results-card#results",
      h("div.card-head", h("div", h("h2", "Results"), h("p.card-note.results-note")), resultsActions),
      resultsBody),
    h("div.card", h("div.card-head", h("h2", "Attempts"), selectionHost), attemptsHost),
    cancelDialog);

  async function refresh(signal) {
    if (notFound) return;
    try {
      task = await api(path, { signal });
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        notFound = true;
        clear(el, emptyState({
          icon: "?", title: "Task not found",
          text: `There is no task ${team}/${project}/${name}, or your token cannot see team ${team}.`,
          action: h("a.btn.btn-secondary", { href: "#/tasks" }, "Back to tasks"),
        }));
        return;
      }
      throw err;
    }
    const finished = isFinished(task.status);
    if (!finished || !subtasksFetchedFinished) {
      await loadSubtasks(signal);
      subtasksFetchedFinished = finished;
    }
    render();
    if (previewOpen && (finished ? previewDoneAt !== task.records.done : shouldRefreshPreview())) loadPreview();
  }

  async function loadSubtasks(signal) {
    const all = [];
    let after = null;
    let more = false;
    while (all.length < MAX_SUBTASKS) {
      const q = new URLSearchParams({ limit: String(Math.min(PAGE, MAX_SUBTASKS - all.length)) });
      if (after !== null) q.set("after", after);
      const page = await api(`${path}/subtasks?${q}`, { signal });
      all.push(...page.subtasks);
      after = page.next;
      more = !!page.next;
      if (!page.next) break;
    }
    subtasks = all;
    subtasksMore = more;
  }

  function render() {
    document.title = `${task.name} · Minions`;
    renderHead();
    renderProgress();
    renderMap();
    renderDetails();
    renderExecutors();
    renderAttempts();
    renderResults();
  }

  // ---- header ----
  function renderHead() {
    const finished = isFinished(task.status);
    clear(headHost,
      h("div.task-title",
        h("div.title-row", h("h1", task.name), pill(task.status)),
        h("div.title-meta",
          h("span.kind", { class: `kind-${task.kind}` }, task.kind),
          task.model !== task.kind ? h("span.mono.muted", task.model) : null,
          h("span.dot-sep", "·"), h("span.muted", `${task.team} / ${task.project}`),
          task.priority ? [h("span.dot-sep", "·"), h("span.muted", `priority ${task.priority}`)] : null)),
      h("div.title-actions",
        finished ? null : h("button.btn.btn-danger-outline", {
          type: "button", dataset: { action: "cancel" }, onclick: () => cancelDialog.showModal(),
        }, "Cancel task"),
        h("button.btn.btn-primary", {
          type: "button", dataset: { action: "download" }, disabled: !finished && task.subtasks.done === 0,
          title: finished ? "Download every result as JSON lines" : "Download the results committed so far",
          onclick: (e) => download(e.currentTarget),
        }, finished ? "Download results" : "Download partial")));
    // Warnings say why a task does not move (no online executor serves its model) or why some of its
    // results are in doubt (their executor was quarantined after the task ended).
    const warnings = (task.warnings || []).map((w) =>
      h("div.banner.banner-warning", { dataset: { warning: w.code } },
        h("strong", WARNING_LABEL[w.code] || "Warning. "), w.message,
        // Waiting for an executor: the Executors page shows which are online and what they serve.
        w.code === "unservable" ? [" ", h("a", { href: "#/executors" }, "See the executors →")] : null));
    if (task.error) {
      clear(errorHost, h("div.banner.banner-error", h("strong", task.status === "failed" ? "Task failed. " : "Error. "), task.error), ...warnings);
    } else {
      clear(errorHost, ...warnings);
    }
  }

  function renderProgress() {
    const s = task.subtasks;
    const r = task.records;
    const rate = taskRate(task);
    const elapsed = taskElapsed(task);
    const remaining = Math.max(0, r.total - r.done);
    const eta = task.status === "running" && rate > 0 ? remaining / rate : null;
    const attempts = subtasks.reduce((n, sub) => n + sub.history.filter((a) => a.outcome !== meta.running_attempt).length, 0);
    const retries = subtasks.reduce((n, sub) => n + sub.history.filter(isProblemAttempt).length, 0);
    const waiting = isUnsplit(task.status);
    clear(progressHost,
      h("div.progress-top",
        h("div.progress-figure",
          h("span.progress-big", fmtPct(r.done, r.total)),
          h("span.progress-of", waiting ? "splitting the input…" : `${fmtInt(r.done)} of ${fmtInt(r.total)} records`)),
        h("div.legend", meta.subtask_states.map((state) => {
          const count = s[state] || 0;
          return h("span.legend-item", { class: count ? "" : "legend-zero", dataset: { state } },
            h("span.legend-swatch", { class: `cell-${state}` }), `${stateLabel(state)} `, h("strong", fmtInt(count)));
        }))),
      progressBar(progressParts(s), s.total, { size: "lg", label: "subtasks progress" }),
      h("div.stats.stats-inline",
        stat("Rate", rate ? `${fmtRate(rate)}` : "—", task.status === "running" ? "records / s, live" : "records / s, average"),
        stat(isFinished(task.status) ? "Duration" : "Elapsed", fmtDuration(elapsed),
          task.started_at ? `started ${fmtClock(task.started_at)}` : "not started yet"),
        isFinished(task.status)
          ? stat("Finished", fmtClock(task.finished_at), fmtAgo(task.finished_at))
          : stat("ETA", eta !== null ? fmtDuration(eta) : "—", eta !== null ? `${fmtInt(remaining)} records left` : "measuring…"),
        stat("Subtasks", `${fmtInt(s.done)} / ${fmtInt(s.total)}`, s.failed ? `${fmtInt(s.failed)} failed` : subtaskFlow(s)),
        stat("Attempts", fmtInt(attempts), retries ? `${fmtInt(retries)} retried or lost` : "no retries")));
  }

  // ---- subtask map ----
  function renderMap() {
    if (!subtasks.length) {
      clear(mapHost, h("p.muted.empty-inline", isUnsplit(task.status)
        ? "The splitter is cutting the input into subtasks…" : "No subtasks."));
      return;
    }
    const size = subtasks.length <= 72 ? "cells-large" : subtasks.length > 400 ? "cells-dense" : "";
    const grid = h("div.cells", {
      class: size,
      onclick: (e) => {
        const cell = e.target.closest("[data-subtask]");
        if (!cell) return;
        const id = Number(cell.dataset.subtask);
        selected = selected === id ? null : id;
        renderMap();
        renderAttempts();
      },
    }, subtasks.map((sub) => h("span.cell", {
      class: `cell-${sub.state}${selected === sub.subtask_id ? " cell-selected" : ""}${sub.history.some(isProblemAttempt) ? " cell-retried" : ""}`,
      dataset: { subtask: String(sub.subtask_id), state: sub.state },
      title: cellTitle(sub),
    }, size === "cells-large" ? String(sub.subtask_id) : null)));
    clear(mapHost, grid,
      h("p.map-foot.muted",
        subtasksMore ? `Showing the first ${fmtInt(subtasks.length)} of ${fmtInt(task.subtasks.total)} subtasks. ` : "",
        "Click a subtask to see its attempts; a ring marks one that was retried."));
  }

  function cellTitle(sub) {
    const parts = [`Subtask ${sub.subtask_id}`, stateLabel(sub.state), `${fmtInt(sub.records)} records`];
    if (sub.attempts) parts.push(`${sub.attempts} attempt${sub.attempts === 1 ? "" : "s"}`);
    if (sub.executor) parts.push(`on ${sub.executor}`);
    if (sub.last_error) parts.push(`last error: ${sub.last_error}`);
    return parts.join(" · ");
  }

  // ---- details ----
  function renderDetails() {
    const wait = task.started_at ? secondsBetween(task.created_at, task.started_at) : secondsSince(task.created_at);
    const params = Object.keys(task.params || {}).length ? JSON.stringify(task.params, null, 1).replace(/\n\s*/g, " ") : "none";
    clear(detailsHost, h("dl.kvs",
      kv("Submitted", h("span", { title: task.created_at }, `${fmtTime(task.created_at)}`)),
      kv("Started", task.started_at ? fmtTime(task.started_at) : "—"),
      kv("Finished", task.finished_at ? fmtTime(task.finished_at) : "—"),
      kv("Queue wait", `${fmtDuration(wait)}${task.started_at ? "" : " so far"}`),
      kv("Subtask size", `${fmtInt(task.subtask_size)} records`),
      kv("Priority", String(task.priority)),
      task.kind === "sleep" ? null : kv("Model identity", modelIdentity(task.fingerprint), "mono truncate-2"),
      kv("Parameters", params, "mono"),
      kv("Input", task.input_uri || "inline records, kept in the database", "mono truncate-2")));
  }

  // The fingerprint every result of the task comes from (pinned at submission or by its first lease).
  function modelIdentity(fingerprint) {
    if (!fingerprint) return h("span.muted", "not pinned yet: the first lease pins it");
    if (fingerprint.startsWith("unknown:")) return h("span", { title: fingerprint }, "unreported (an agent that sends no fingerprint): its executor alone");
    return h("span", { title: fingerprint }, fingerprint);
  }

  // ---- executors ----
  function renderExecutors() {
    const byName = new Map();
    for (const sub of subtasks) {
      for (const a of sub.history) {
        const key = a.executor || "(unknown)";
        const e = byName.get(key) || { name: key, attempts: 0, done: 0, problems: 0, running: 0, records: 0, seconds: 0, last: null };
        e.attempts += 1;
        if (a.outcome === "done") {
          e.done += 1;
          e.records += sub.records;
          e.seconds += a.seconds || 0;
        } else if (a.outcome === meta.running_attempt) {
          e.running += 1;
        } else if (isProblemAttempt(a)) {
          e.problems += 1;
        }
        const at = a.ended_at || a.started_at;
        if (!e.last || at > e.last) e.last = at;
        byName.set(key, e);
      }
    }
    const rows = [...byName.values()].sort((a, b) => b.records - a.records || a.name.localeCompare(b.name));
    if (!rows.length) {
      clear(executorsHost, h("p.muted.empty-inline.card-body", "No executor has picked up this task yet."));
      return;
    }
    clear(executorsHost, h("div.table-scroll", h("table.table.table-compact",
      h("thead", h("tr", h("th", "Executor"), h("th.num", "Done"), h("th.num", "Records"),
        h("th.num", "Avg time"), h("th.num", "Running"), h("th.num", "Lost/failed"), h("th", "Last seen"))),
      h("tbody", rows.map((e) => h("tr", { dataset: { executor: e.name } },
        h("td", h("a.strong", { href: "#/executors" }, e.name)),
        h("td.num", fmtInt(e.done)),
        h("td.num", fmtInt(e.records)),
        h("td.num", e.done ? fmtDuration(e.seconds / e.done) : "—"),
        h("td.num", e.running ? h("span.text-info", fmtInt(e.running)) : h("span.muted", "0")),
        h("td.num", e.problems ? h("span.text-danger", fmtInt(e.problems)) : h("span.muted", "0")),
        h("td.muted", { title: fmtTime(e.last) }, fmtAgo(e.last))))))));
  }

  // ---- attempts ----
  function renderAttempts() {
    let entries = [];
    for (const sub of subtasks) {
      if (selected !== null && sub.subtask_id !== selected) continue;
      for (const a of sub.history) entries.push({ ...a, subtask_id: sub.subtask_id, records: sub.records });
    }
    if (problemsOnly) entries = entries.filter(isProblemAttempt);
    entries.sort((a, b) => (b.started_at || "").localeCompare(a.started_at || "") || b.attempt - a.attempt);
    const chip = selected !== null
      ? h("button.chip", { type: "button", onclick: () => { selected = null; renderMap(); renderAttempts(); } },
        `Subtask ${selected}`, h("span.chip-x", { "aria-hidden": "true" }, "×"))
      : null;
    clear(selectionHost, chip, problemsToggle);
    if (!entries.length) {
      clear(attemptsHost, h("p.muted.empty-inline.card-body", problemsOnly ? "No retries or failures. Every attempt went through."
        : selected !== null ? `Subtask ${selected} has not been attempted yet.` : "No attempts yet: subtasks are waiting for an executor."));
      return;
    }
    const shown = entries.slice(0, ATTEMPT_ROWS);
    clear(attemptsHost, h("div.table-scroll", h("table.table.table-compact.attempts-table",
      h("thead", h("tr", h("th.num", "Subtask"), h("th.num", "Attempt"), h("th", "Executor"),
        task.kind === "sleep" ? null : h("th", "Model"),
        h("th", "Outcome"), h("th", "Started"), h("th.num", "Duration"), h("th.col-error", "Error"))),
      h("tbody", shown.map((a) => h("tr", { dataset: { outcome: a.outcome } },
        h("td.num", String(a.subtask_id)),
        h("td.num", `#${a.attempt}`),
        h("td", a.executor || h("span.muted", "—")),
        task.kind === "sleep" ? null : h("td.mono", { title: a.fingerprint || "" },
          a.fingerprint ? `${shortFingerprint(a.fingerprint)}${a.precision ? ` · ${a.precision}` : ""}` : h("span.muted", "—")),
        h("td", pill(a.outcome)),
        h("td.muted", { title: a.started_at }, fmtTime(a.started_at)),
        h("td.num", fmtDuration(a.seconds)),
        h("td.col-error", a.error ? h("span.error-text", { title: a.error }, a.error) : h("span.muted", "—")))))),
    entries.length > shown.length ? h("p.table-foot.muted", `Showing the latest ${ATTEMPT_ROWS} of ${fmtInt(entries.length)} attempts.`) : null));
  }

  function shortFingerprint(fingerprint) {
    if (fingerprint.startsWith("unknown:")) return "unreported";
    const bare = fingerprint.replace(/^sha256:/, "");
    return bare.length > 12 ? `${fingerprint.startsWith("sha256:") ? "sha256:" : ""}${bare.slice(0, 12)}` : fingerprint;
  }

  // ---- results ----
  function renderResults() {
    const finished = isFinished(task.status);
    const note = el.querySelector(".results-note");
    note.textContent = finished
      ? `${fmtInt(task.records.total)} lines, one per input record, in input order.`
      : task.subtasks.done ? "Partial: the subtasks committed so far, in input order." : "Results appear as subtasks finish.";
    clear(resultsActions,
      h("button.btn.btn-secondary.btn-sm", {
        type: "button", dataset: { action: "preview" }, "aria-expanded": String(previewOpen),
        disabled: !finished && task.subtasks.done === 0,
        onclick: () => {
          previewOpen = !previewOpen;
          renderResults();
          if (previewOpen) loadPreview();
        },
      }, previewOpen ? "Hide preview" : "Preview"),
      h("button.btn.btn-secondary.btn-sm", {
        type: "button", dataset: { action: "download-results" }, disabled: !finished && task.subtasks.done === 0,
        onclick: (e) => download(e.currentTarget),
      }, "Download .jsonl"));
    if (!previewOpen) {
      clear(resultsBody, h("p.muted.empty-inline", finished || task.subtasks.done
        ? `Preview shows the first ${PREVIEW_LINES} lines.` : "Nothing to show yet."));
    }
  }

  function shouldRefreshPreview() {
    return task.records.done !== previewDoneAt && Date.now() - previewLoadedAt > 4000;
  }

  async function loadPreview() {
    if (previewBusy) return;
    previewBusy = true;
    const doneAt = task.records.done;
    const finished = isFinished(task.status);
    if (!resultsBody.querySelector(".preview")) clear(resultsBody, h("p.muted.empty-inline", "Loading preview…"));
    try {
      const resp = await api(`${path}/results${finished ? "" : "?partial=true"}`, { raw: true, headers: { Accept: "application/x-ndjson" } });
      const lines = await firstLines(resp, PREVIEW_LINES);
      previewDoneAt = doneAt;
      previewLoadedAt = Date.now();
      if (!previewOpen) return;
      if (!lines.length) {
        clear(resultsBody, h("p.muted.empty-inline", "No results committed yet."));
        return;
      }
      clear(resultsBody,
        h("ol.preview", lines.map((line) => h("li", h("code", line.length > 240 ? `${line.slice(0, 240)} …` : line)))),
        h("p.table-foot.muted", `First ${lines.length} line${lines.length === 1 ? "" : "s"}${finished ? "" : " committed so far"}.`));
    } catch (err) {
      clear(resultsBody, h("p.field-error", `Could not load results: ${err.message}`));
    } finally {
      previewBusy = false;
    }
  }

  async function download(button) {
    const finished = isFinished(task.status);
    const label = button.textContent;
    button.disabled = true;
    button.textContent = "Preparing…";
    try {
      const resp = await api(`${path}/results${finished ? "" : "?partial=true"}`, { raw: true, headers: { Accept: "application/x-ndjson" } });
      const blob = await resp.blob();
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: `${task.team}-${task.project}-${task.name}${finished ? "" : "-partial"}.jsonl`, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      toast(`Downloaded ${fmtBytes(blob.size)} of results`, "success");
    } catch (err) {
      toast(`Download failed: ${err.message}`, "error");
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }

  async function cancelTask() {
    try {
      task = await api(`${path}/cancel`, { method: "POST" });
      toast(`Task ${task.name} cancelled`, "info");
    } catch (err) {
      toast(err.message, "error");
    }
    ctx.refreshNow();
  }

  clear(progressHost, h("div.loading", "Loading task…"));
  return { title: name, el, refresh };
}

/** The first `n` lines of a streamed body, without reading the rest. */
async function firstLines(resp, n) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const lines = [];
  try {
    while (lines.length < n) {
      const { value, done } = await reader.read();
      if (done) {
        buffer += decoder.decode();
        if (buffer.trim()) lines.push(buffer);
        break;
      }
      buffer += decoder.decode(value, { stream: true });
      let i;
      while (lines.length < n && (i = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, i);
        buffer = buffer.slice(i + 1);
        if (line.trim()) lines.push(line);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  return lines.slice(0, n);
}

// What moves now: the subtasks being worked on, apart from those an executor claimed ahead of its
// work (subtasks.running, API.md), then what waits.
function subtaskFlow(s) {
  const running = s.running ?? s.leased;
  const ahead = s.leased > running ? `, ${fmtInt(s.leased - running)} claimed ahead` : "";
  return `${fmtInt(running)} running${ahead}, ${fmtInt(s.pending)} pending`;
}
