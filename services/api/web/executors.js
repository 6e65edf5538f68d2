// #/executors: the machines that pull work, their hardware, what they run now and what they prefer,
// and how far their results are trusted (spot checks).

import { api } from "./api.js";
import { clear, emptyState, fmtAgo, fmtDuration, fmtInt, fmtTime, h, pill, secondsSince, stat, taskHref } from "./dom.js";

const ORDER = { busy: 0, idle: 1, online: 1, offline: 2, lost: 3 };
const FILTERS = [["", "All"], ["busy", "Busy"], ["idle", "Idle"], ["offline", "Offline"], ["lost", "Lost"]];

export function executorsView(ctx) {
  let filter = ctx.params.get("status") || "";
  const statsEl = h("div.stats");
  const noticeHost = h("div");
  const tableHost = h("div.card.table-card", h("div.loading", "Loading executors…"));
  const segmented = h("div.segmented", { role: "tablist", "aria-label": "Filter by status" },
    FILTERS.map(([value, label]) => h("button", {
      type: "button", role: "tab", dataset: { status: value }, "aria-selected": String(filter === value),
      onclick: () => {
        filter = value;
        for (const b of segmented.children) b.setAttribute("aria-selected", String(b.dataset.status === filter));
        history.replaceState(null, "", `#/executors${filter ? `?status=${filter}` : ""}`);
        ctx.refreshNow();
      },
    }, label)));

  const el = h("section.page",
    h("div.page-head",
      h("div", h("h1", "Executors"),
        h("p.page-sub", "Machines that pull subtasks when they are idle. Each one runs the agent with an executor token."))),
    statsEl,
    noticeHost,
    h("div.toolbar", segmented),
    tableHost);

  async function refresh(signal) {
    const { executors } = await api("/api/v1/executors", { signal });
    const count = (s) => executors.filter((e) => e.status === s).length;
    const leases = executors.reduce((n, e) => n + e.current.length, 0);
    clear(statsEl,
      stat("Online", fmtInt(count("busy") + count("idle")), `of ${fmtInt(executors.length)} registered`, { tone: "green" }),
      stat("Busy", fmtInt(count("busy")), `${fmtInt(leases)} subtask${leases === 1 ? "" : "s"} running`, { tone: "blue" }),
      stat("Idle", fmtInt(count("idle")), "waiting for work"),
      stat("Offline or lost", fmtInt(count("offline") + count("lost")), `${fmtInt(count("lost"))} lost (work taken back)`,
        { tone: count("lost") ? "red" : undefined }));
    const quarantined = executors.filter((e) => e.trust && e.trust.quarantined_at).length;
    clear(noticeHost, quarantined
      ? h("div.banner.banner-error", { dataset: { notice: "quarantined" } },
        h("strong", `${fmtInt(quarantined)} executor${quarantined === 1 ? "" : "s"} quarantined. `),
        "Their results lost spot checks: their claims are refused and their results in open tasks run again. "
        + "An admin lifts a quarantine with: minions executor release")
      : null);
    const shown = executors.filter((e) => !filter || e.status === filter)
      .sort((a, b) => (ORDER[a.status] ?? 9) - (ORDER[b.status] ?? 9) || a.name.localeCompare(b.name));
    if (!shown.length) {
      clear(tableHost, emptyState(executors.length
        ? { icon: "⌕", title: `No ${filter} executors`, text: "Every registered executor is in another state." }
        : {
          icon: "⌁", title: "No executors yet",
          text: "Start the agent on a Mac (or any machine) with an executor token: python -m agents.macos. It registers itself and shows up here.",
        }));
      return;
    }
    clear(tableHost, h("div.table-scroll", h("table.table.executors-table",
      h("thead", h("tr", h("th", "Executor"), h("th", "Status"), h("th", "Trust"), h("th", "Hardware"), h("th", "Runs"),
        h("th", "Current work"), h("th", "Preferences"), h("th", "Last heartbeat"))),
      h("tbody", shown.map(row)))));
  }

  // The engine and precision the agent chose per model at load (the fastest within its cosine gate
  // to fp32): the backend (torch, mlx) when the agent reports it, a quantized model's quantisation,
  // and under --backend auto why it chose and what it turned down.
  function precisionLine(precision) {
    const chosen = Array.isArray(precision) ? precision.filter((p) => p && typeof p === "object") : [];
    if (!chosen.length) return null;
    const cosine = (p) => (typeof p.cosine === "number" ? p.cosine.toFixed(5) : "?");
    const engine = (p) => [p.backend, p.precision, p.quantization].filter(Boolean).join(" ") || "not served";
    // weights: how they are held for that precision (fp32 under autocast, or cast), from agents that say.
    const held = (p) => (p.weights ? `, ${p.weights === "autocast" ? "fp32 weights under autocast" : `${p.weights} weights`}` : "");
    const detail = (p) => [`${p.model}: ${engine(p)} (${p.setting || "auto"}${held(p)}), cosine to fp32 ${cosine(p)}`,
      p.why ? `  ${p.why}` : null, p.rejected ? `  not used: ${p.rejected}` : null].filter(Boolean).join("\n");
    return h("div.cell-sub.precision", { title: chosen.map(detail).join("\n") },
      chosen.map((p) => `${engine(p)} · cos ${cosine(p)}`).join(", "));
  }

  // What it loads for each model: a task's results all come from one fingerprint. An agent that
  // reports none serves each model as its own (its tasks show "unreported").
  function identityLine(e) {
    const served = (e.kinds || []).some((k) => k !== "sleep") && (e.models || []).length;
    const reported = Array.isArray(e.fingerprints) ? e.fingerprints : [];
    if (!served) return null;
    if (!reported.length) return h("div.cell-sub.muted", "model identity not reported");
    return h("div.cell-sub.truncate.mono", {
      title: reported.map((f) => `${f.model}: ${f.fingerprint}${f.precision ? ` (${f.precision})` : ""}`).join("\n"),
    }, reported.map((f) => f.fingerprint.replace(/^sha256:/, "").slice(0, 12)).join(", "));
  }

  // Spot checks (sql/schema/11_checks.sql): quarantined (with the reason), vouched (its token is trusted by an admin:
  // never checked), trusted (only a random share of its results is run again by another executor) or checked (every
  // result, until it has agreed often enough with trusted executors).
  function trustCell(e) {
    const t = e.trust;
    if (!t) return h("td.cell-trust", h("span.muted", "—"));
    const state = t.quarantined_at ? "quarantined" : t.vouched ? "vouched" : t.trusted ? "trusted" : "checked";
    const counts = h("div.cell-sub.nowrap.trust-counts",
      `${fmtInt(t.agreements)} agreed · ${fmtInt(t.disagreements)} disagreed`);
    const label = {
      quarantined: h("div.trust.trust-quarantined", { title: `quarantined ${fmtTime(t.quarantined_at)}` },
        `QUARANTINED: ${t.quarantine_reason}`),
      vouched: h("div.trust.trust-vouched", { title: `an admin vouches for ${t.owner}'s machines: never checked` },
        "vouched"),
      trusted: h("div.trust.trust-trusted", { title: "only a random share of its results is checked" }, "trusted"),
      checked: h("div.trust.trust-checked", { title: "every result is checked by another executor until it has agreed often enough" },
        "checked"),
    }[state];
    return h("td.cell-trust", { dataset: { trust: state } }, label, counts);
  }

  function row(e) {
    const hw = e.hardware || {};
    const facts = [hw.os, hw.memory_gb ? `${hw.memory_gb} GB` : null].filter(Boolean);
    const models = e.models || [];
    return h("tr", { dataset: { executor: e.name, status: e.status } },
      h("td.cell-executor",
        h("div.strong", e.name),
        h("div.cell-sub.nowrap", e.team ? `team ${e.team}` : "all teams", h("span.dot-sep", "·"),
          h("span", { title: fmtTime(e.registered_at) }, `joined ${fmtAgo(e.registered_at)}`))),
      h("td", pill(e.status)),
      trustCell(e),
      // A shared executor seen with a team's token: the server sends no hardware and only this team's
      // preferences and work (other teams' are theirs to see).
      h("td.cell-hw", e.details_hidden
        ? h("span.muted.nowrap", { title: "A shared executor: its hardware is shown to admins only." }, "not shown")
        : [h("div.nowrap", h("span.strong", hw.chip || "Unknown chip"), hw.device ? h("span.device", hw.device) : null),
          facts.length ? h("div.cell-sub", facts.join(" · ")) : null,
          precisionLine(hw.precision)]),
      h("td",
        h("div.chips", (e.kinds || []).map((k) => h("span.kind", { class: `kind-${k}` }, k))),
        models.length ? h("div.cell-sub.truncate", { title: models.join("\n") },
          models.length === 1 ? models[0] : `${models[0]} +${models.length - 1} more`) : null,
        identityLine(e)),
      h("td.cell-current", e.current.length
        ? e.current.map((c) => h("div.current",
          h("a", { href: taskHref(c) }, `${c.team}/${c.project}/${c.task_name}`),
          h("div.cell-sub", `subtask ${c.subtask_id} · attempt ${c.attempt} · running ${fmtDuration(secondsSince(c.leased_at))}`)))
        : h("span.muted", e.status === "idle" ? "waiting for work" : "—")),
      h("td", (e.preferences || []).length
        ? h("div.chips", e.preferences.map((p) => h("span.chip.chip-static",
          [p.team, p.project, p.task_name].filter(Boolean).join(" / "))))
        : h("span.muted.nowrap", e.details_hidden ? "none for your team" : "any work (FIFO)")),
      h("td", { title: fmtTime(e.last_heartbeat_at) },
        h("span", { class: heartbeatClass(e) }, fmtAgo(e.last_heartbeat_at))));
  }

  return { title: "Executors", el, refresh };
}

function heartbeatClass(e) {
  const age = secondsSince(e.last_heartbeat_at);
  if (age === null) return "muted";
  if (e.status === "lost") return "text-danger";
  return age < 60 ? "" : "muted";
}
