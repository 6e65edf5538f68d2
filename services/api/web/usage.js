// #/usage: the compute each team used and each executor (or its owner) gave, over a window back from
// now (GET /api/v1/usage). Used: a team's own work; verification: its spot checks' replicas and outvoted
// results, charged to it too; lost: nobody's (lost, released and revoked attempts).

import { api } from "./api.js";
import { clear, emptyState, fmtDuration, fmtInt, fmtPct, h, progressBar, stat } from "./dom.js";

const WINDOWS = [["1h", "1 hour"], ["24h", "24 hours"], ["7d", "7 days"], ["30d", "30 days"]];
const GIVERS = [["executor", "Executors"], ["owner", "Owners"]];
const USES = ["used_s", "verification_s", "lost_s"];
const REFRESH_MS = 10_000;  // an account over days moves slowly; no need to poll it like a running task

export function usageView(ctx) {
  let since = WINDOWS.some(([v]) => v === ctx.params.get("since")) ? ctx.params.get("since") : "7d";
  let by = GIVERS.some(([v]) => v === ctx.params.get("by")) ? ctx.params.get("by") : "executor";

  const statsEl = h("div.stats");
  const scopeEl = h("span.card-note");
  const teamsHost = h("div", h("div.loading", "Loading usage…"));
  const giversHost = h("div", h("div.loading", "Loading usage…"));

  const windows = segmented("Window", WINDOWS, () => since, (value) => { since = value; }, "since");
  const givers = segmented("Given by", GIVERS, () => by, (value) => { by = value; }, "by", "segmented-sm");

  function segmented(label, options, current, set, key, extra = "") {
    const el = h("div.segmented", { class: extra, role: "tablist", "aria-label": label },
      options.map(([value, text]) => h("button", {
        type: "button", role: "tab", dataset: { [key]: value }, "aria-selected": String(current() === value),
        onclick: () => {
          set(value);
          for (const b of el.children) b.setAttribute("aria-selected", String(b.dataset[key] === current()));
          history.replaceState(null, "", `#/usage?since=${since}&by=${by}`);
          teamsHost.classList.add("is-stale");
          giversHost.classList.add("is-stale");
          ctx.refreshNow();
        },
      }, text)));
    return el;
  }

  const el = h("section.page",
    h("div.page-head",
      h("div", h("h1", "Usage"),
        h("p.page-sub", "Compute-seconds of the attempts that ended in the window: what each team used, and what "
          + "each executor and its owner gave."))),
    h("div.toolbar", windows, scopeEl),
    statsEl,
    h("div.card.table-card", h("div.card-head", h("div", h("h2", "Used by team"),
      h("span.card-note", "verification: spot checks' replicas, charged to the team; lost: nobody's"))), teamsHost),
    h("div.card.table-card", h("div.card-head", h("div", h("h2", "Given by"),
      h("span.card-note", "owner: the label of the token an executor registered with")), givers), giversHost));

  async function refresh(signal) {
    const query = (group) => `/api/v1/usage?since=${encodeURIComponent(since)}&by=${group}`;
    const [teams, givenBy] = await Promise.all([api(query("team"), { signal }), api(query(by), { signal })]);
    const t = teams.totals;
    const charged = t.used_s + t.verification_s + t.lost_s;
    clear(scopeEl, teams.team ? `team ${teams.team}` : "every team");
    clear(statsEl,
      stat("Used", fmtDuration(t.used_s), `${fmtInt(t.records)} records`, { tone: "green" }),
      stat("Verification", fmtDuration(t.verification_s), `${fmtPct(t.verification_s, charged)} of all compute`,
        { tone: "blue" }),
      stat("Lost", fmtDuration(t.lost_s), "nobody's: executors lost, leases handed back, results revoked",
        { tone: t.lost_s ? "red" : undefined }),
      stat("Attempts", fmtInt(t.attempts), `ended since ${new Date(teams.since).toLocaleString()}`));
    clear(teamsHost, table("team", teams, [["Team", (r) => h("span.strong", r.team)]]));
    const key = by === "executor"
      ? [["Executor", (r) => h("span.strong", r.executor || "unknown")], ["Owner", (r) => r.owner || "—"]]
      : [["Owner", (r) => h("span.strong", r.owner || "unknown")]];
    clear(giversHost, table(by, givenBy, key));
    teamsHost.classList.remove("is-stale");
    giversHost.classList.remove("is-stale");
  }

  function table(group, report, key) {
    if (!report.usage.length) {
      return emptyState({ icon: "◔", title: "No attempts in this window", text: "Nothing ended since then." });
    }
    const all = USES.reduce((n, k) => n + report.totals[k], 0);
    return h("div.table-scroll", h("table.table.usage-table", { dataset: { by: group } },
      h("thead", h("tr", key.map(([title]) => h("th", title)), h("th.num", "Used"), h("th.num", "Verification"),
        h("th.num", "Lost"), h("th.num", "Records"), h("th.num", "Attempts"), h("th.col-share", "Share"))),
      h("tbody", report.usage.map((r) => h("tr", { dataset: { [group]: r[group] ?? "" } },
        key.map(([, cell]) => h("td", cell(r))),
        USES.map((k) => h("td.num", { class: `usage-${k.replace("_s", "")}` }, fmtDuration(r[k]))),
        h("td.num", fmtInt(r.records)), h("td.num", fmtInt(r.attempts)),
        h("td.col-share", shareBar(r, all)))))));
  }

  function shareBar(row, all) {
    const parts = { used: row.used_s, verification: row.verification_s, lost: row.lost_s };
    const mine = row.used_s + row.verification_s + row.lost_s;
    return h("div.share", progressBar(parts, all, { size: "sm", label: "share of the window's compute" }),
      h("span.share-pct", fmtPct(mine, all)));
  }

  return { title: "Usage", el, refresh, interval: REFRESH_MS };
}
