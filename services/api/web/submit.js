// #/submit: the task form. Records are pasted as JSONL or uploaded as a .jsonl file (stored with
// POST /api/v1/inputs, then submitted by uri). The server's 422 `fields` land next to their fields.

import { api, meta, taskPath } from "./api.js";
import { clear, fmtBytes, fmtInt, h, toast } from "./dom.js";

// How the form presents each kind. Which kinds exist and their default subtask sizes come from the
// server (GET /api/v1/meta); a kind this file does not know yet is offered by its name.
const PRESENTATION = {
  embedding: {
    label: "Embedding", blurb: "Vectors for text, on the executor's GPU.",
    model: "sentence-transformers/all-MiniLM-L6-v2",
    params: '{"normalize": true, "max_length": 256}',
    example: '{"id": "a1", "text": "The quick brown fox"}\n{"id": "a2", "text": "jumps over the lazy dog"}',
    models: ["sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5", "intfloat/e5-base-v2"],
  },
  completion: {
    label: "Completion", blurb: "LLM completions through the executor's Ollama.",
    model: "llama3.2:1b",
    params: '{"temperature": 0.2, "max_tokens": 256}',
    example: '{"id": "q1", "prompt": "Name three prime numbers."}\n{"id": "q2", "messages": [{"role": "user", "content": "Say hi"}]}',
    models: ["llama3.2:1b", "llama3.2:3b", "qwen2.5:7b"],
  },
  sleep: {
    label: "Sleep", blurb: "Synthetic load: each record sleeps ms. For drills and capacity tests.",
    model: "sleep", params: "{}",
    example: '{"id": "r1", "ms": 200}\n{"id": "r2", "ms": 200}',
    models: ["sleep"],
  },
};

/** Each kind the server knows, with its presentation and its default subtask size. */
function kinds() {
  return Object.fromEntries(Object.entries(meta.kinds).map(([kind, known]) => [kind, {
    label: kind, blurb: "", model: "", params: "{}", example: "", models: [],
    ...PRESENTATION[kind], size: known.default_subtask_size,
  }]));
}
const LAST_SCOPE = "minions.lastScope";

function defaultName(kind) {
  const d = new Date();
  const pad = (n) => String(n).padStart(2, "0");
  return `${kind}-${d.getFullYear()}${pad(d.getMonth() + 1)}${pad(d.getDate())}-${pad(d.getHours())}${pad(d.getMinutes())}${pad(d.getSeconds())}`;
}

export function submitView(ctx) {
  const remembered = JSON.parse(localStorage.getItem(LAST_SCOPE) || "{}");
  const byKind = kinds();
  let kind = byKind[ctx.params.get("kind")] ? ctx.params.get("kind") : Object.keys(byKind)[0];
  let source = "paste";
  let file = null;
  let modelTouched = false;
  let nameTouched = false;
  const errors = new Map(); // field -> element showing its error

  // ---- fields ----
  const field = (name, label, control, { help, wide, optional } = {}) => {
    const error = h("p.field-error", { id: `${name}-error`, role: "alert", hidden: true });
    errors.set(name, { error, control });
    if (control.matches?.("input, textarea, select")) {
      control.id ||= `f-${name}`;
      control.setAttribute("aria-describedby", `${name}-error`);
    }
    return h("div.field", { class: wide ? "field-wide" : "", dataset: { field: name } },
      h("label", { for: control.id || undefined }, label, optional ? h("span.optional", "optional") : null),
      control, error, help ? h("p.help", help) : null);
  };
  const text = (name, attrs = {}) => h("input.input", { type: "text", name, spellcheck: "false", autocomplete: "off", ...attrs });

  const team = text("team", { value: remembered.team || "", placeholder: "search", required: true });
  const project = text("project", { value: remembered.project || "", placeholder: "ranker", required: true });
  const name = text("name", { value: defaultName(kind), required: true, oninput: () => { nameTouched = true; } });
  const model = text("model", { list: "model-list", oninput: () => { modelTouched = true; } });
  const modelList = h("datalist#model-list");
  const subtaskSize = h("input.input", { type: "number", name: "subtask_size", min: "1", step: "1", inputmode: "numeric" });
  const priority = h("input.input", { type: "number", name: "priority", value: "0", step: "1", min: "-1000", max: "1000" });
  const params = h("textarea.input.mono", { name: "params", rows: "3", spellcheck: "false" });
  const records = h("textarea.input.mono.records", { name: "records", rows: "9", spellcheck: "false", wrap: "off",
    oninput: () => updateCount() });
  const recordsCount = h("span.records-count");
  const fileInput = h("input.visually-hidden#records-file", { type: "file", accept: ".jsonl,.ndjson,.json,application/x-ndjson",
    onchange: () => setFile(fileInput.files[0] || null) });
  const fileName = h("div.drop-text");

  const kindCards = h("div.kind-cards", { role: "radiogroup", "aria-label": "Kind" },
    Object.entries(byKind).map(([value, k]) => h("label.kind-card", { dataset: { kind: value } },
      h("input", { type: "radio", name: "kind", value, checked: value === kind, onchange: () => setKind(value) }),
      h("span.kind-card-title", h("span.kind", { class: `kind-${value}` }, value)),
      h("span.kind-card-blurb", k.blurb))));

  const tabs = h("div.segmented.segmented-sm", { role: "tablist", "aria-label": "How to provide records" },
    h("button", { type: "button", role: "tab", dataset: { source: "paste" }, onclick: () => setSource("paste") }, "Paste JSONL"),
    h("button", { type: "button", role: "tab", dataset: { source: "upload" }, onclick: () => setSource("upload") }, "Upload .jsonl file"));
  const pastePane = h("div.pane", records,
    h("div.pane-foot", recordsCount,
      h("button.link", { type: "button", onclick: () => { records.value = byKind[kind].example; updateCount(); records.focus(); } }, "Insert example")));
  const drop = h("label.dropzone", { for: "records-file" },
    h("div.drop-icon", { "aria-hidden": "true" }, "⇪"), fileName,
    h("div.drop-hint", "JSON lines, one record per line. Large files are stored by the server, then split."));
  for (const type of ["dragenter", "dragover"]) drop.addEventListener(type, (e) => { e.preventDefault(); drop.classList.add("drag"); });
  for (const type of ["dragleave", "drop"]) drop.addEventListener(type, (e) => { e.preventDefault(); drop.classList.remove("drag"); });
  drop.addEventListener("drop", (e) => { if (e.dataTransfer.files[0]) setFile(e.dataTransfer.files[0]); });
  const uploadPane = h("div.pane", fileInput, drop);
  const recordsControl = h("div.records-control", tabs, pastePane, uploadPane);

  const banner = h("div.banner.banner-error", { role: "alert", hidden: true });
  const submitBtn = h("button.btn.btn-primary", { type: "submit" }, "Submit task");

  const form = h("form.form.card.form-card", { novalidate: true, onsubmit: submit },
    h("div.form-section",
      h("div.form-section-head", h("h2", "Where it belongs"), h("p", "Team, project and name identify the task; the name is unique within its project.")),
      h("div.grid-3",
        field("team", "Team", team),
        field("project", "Project", project),
        field("name", "Task name", name, { help: "Letters, digits, . _ - (up to 64)." }))),
    h("div.form-section",
      h("div.form-section-head", h("h2", "What to run")),
      field("kind", "Kind", kindCards, { wide: true }),
      h("div.grid-3",
        field("model", "Model", model),
        field("subtask_size", "Subtask size", subtaskSize, { help: "Records per subtask.", optional: true }),
        field("priority", "Priority", priority, { help: "Higher runs first (−1000…1000); a user's at most the team's cap (0 unless an admin set it).", optional: true })),
      field("params", "Parameters (JSON)", params, { wide: true, optional: true })),
    h("div.form-section",
      h("div.form-section-head", h("h2", "Records")),
      field("records", "Input records", recordsControl, { wide: true })),
    h("div.form-actions", banner, h("div.form-buttons",
      h("a.btn.btn-ghost", { href: "#/tasks" }, "Cancel"), submitBtn)),
    modelList);

  const el = h("section.page.page-narrow",
    h("nav.crumbs", h("a", { href: "#/tasks" }, "Tasks"), h("span.sep", "/"), h("span", "New task")),
    h("div.page-head", h("div", h("h1", "Submit a task"),
      h("p.page-sub", "Split into subtasks and run by whichever executors are idle."))),
    form);

  // ---- behaviour ----
  function setKind(value) {
    const previous = byKind[kind];
    kind = value;
    const k = byKind[kind];
    if (!modelTouched || model.value === previous.model || !model.value) {
      model.value = k.model;
      modelTouched = false;
    }
    model.readOnly = kind === "sleep";
    clear(modelList, k.models.map((m) => h("option", { value: m })));
    subtaskSize.placeholder = String(k.size);
    params.placeholder = k.params;
    records.placeholder = `${k.example}\n…`;
    if (!nameTouched) name.value = defaultName(kind);
    for (const card of kindCards.children) card.classList.toggle("selected", card.dataset.kind === kind);
  }

  function setSource(value) {
    source = value;
    for (const b of tabs.children) b.setAttribute("aria-selected", String(b.dataset.source === value));
    pastePane.hidden = value !== "paste";
    uploadPane.hidden = value !== "upload";
  }

  function setFile(f) {
    file = f;
    clear(fileName, f
      ? [h("strong", f.name), h("span.muted", ` · ${fmtBytes(f.size)}`)]
      : [h("strong", "Choose a .jsonl file"), h("span.muted", " or drop it here")]);
    drop.classList.toggle("has-file", !!f);
  }

  function updateCount() {
    const n = records.value.split("\n").filter((l) => l.trim()).length;
    recordsCount.textContent = n ? `${fmtInt(n)} record${n === 1 ? "" : "s"}` : "One JSON object per line";
  }

  function clearErrors() {
    banner.hidden = true;
    for (const { error } of errors.values()) {
      error.hidden = true;
      error.textContent = "";
    }
    for (const el of form.querySelectorAll(".invalid")) {
      el.classList.remove("invalid");
      el.removeAttribute("aria-invalid");
    }
  }

  function showError(fieldName, message) {
    const entry = errors.get(fieldName);
    if (!entry) return false;
    entry.error.textContent = entry.error.textContent ? `${entry.error.textContent}\n${message}` : message;
    entry.error.hidden = false;
    const target = fieldName === "records" ? (source === "paste" ? records : drop) : entry.control;
    target.classList.add("invalid");
    target.setAttribute("aria-invalid", "true");
    return true;
  }

  /** "input.records[3]" -> the records field, naming the line; "params.x" -> params; etc. */
  function placeServerErrors(fields, lineOf) {
    const unplaced = [];
    for (const [key, message] of Object.entries(fields)) {
      let target = key;
      let text = message;
      const rec = key.match(/^input\.records\[(\d+)\](.*)$/);
      if (rec) {
        target = "records";
        const line = lineOf ? lineOf[Number(rec[1])] : Number(rec[1]) + 1;
        text = `Line ${line}: ${message}`;
      } else if (key === "input" || key.startsWith("input.")) {
        target = "records";
      } else if (key.startsWith("params.")) {
        target = "params";
        text = `${key.slice(7)}: ${message}`;
      }
      if (!showError(target, text)) unplaced.push(`${key}: ${message}`);
    }
    return unplaced;
  }

  function parseRecords() {
    const list = [];
    const lineOf = [];
    const problems = [];
    records.value.split("\n").forEach((line, i) => {
      if (!line.trim()) return;
      try {
        list.push(JSON.parse(line));
        lineOf.push(i + 1);
      } catch {
        problems.push(`Line ${i + 1}: not valid JSON`);
      }
    });
    return { list, lineOf, problems };
  }

  async function submit(event) {
    event.preventDefault();
    clearErrors();
    const body = {
      team: team.value.trim(), project: project.value.trim(), name: name.value.trim(), kind,
      model: model.value.trim(),
    };
    let ok = true;
    if (params.value.trim()) {
      try {
        body.params = JSON.parse(params.value);
      } catch (err) {
        showError("params", `Not valid JSON: ${err.message}`);
        ok = false;
      }
    }
    if (subtaskSize.value.trim()) body.subtask_size = Number(subtaskSize.value);
    if (priority.value.trim()) body.priority = Number(priority.value);
    let lineOf = null;
    if (source === "paste") {
      const parsed = parseRecords();
      if (parsed.problems.length) {
        showError("records", parsed.problems.slice(0, 5).join("\n") + (parsed.problems.length > 5 ? `\n…and ${parsed.problems.length - 5} more` : ""));
        ok = false;
      } else if (!parsed.list.length) {
        showError("records", "Paste at least one record (one JSON object per line), or upload a file.");
        ok = false;
      }
      body.input = { records: parsed.list };
      lineOf = parsed.lineOf;
    } else if (!file) {
      showError("records", "Choose a .jsonl file to upload.");
      ok = false;
    }
    if (!ok) {
      focusFirstError();
      return;
    }
    submitBtn.disabled = true;
    try {
      if (source === "upload") {
        submitBtn.textContent = `Uploading ${fmtBytes(file.size)}…`;
        const stored = await api("/api/v1/inputs", { method: "POST", body: file, headers: { "Content-Type": "application/x-ndjson" } });
        body.input = { uri: stored.uri };
      }
      submitBtn.textContent = "Submitting…";
      const task = await api("/api/v1/tasks", { method: "POST", body });
      localStorage.setItem(LAST_SCOPE, JSON.stringify({ team: body.team, project: body.project }));
      toast(`Task ${task.name} submitted`, "success");
      ctx.navigate(`#/tasks/${encodeURIComponent(task.team)}/${encodeURIComponent(task.project)}/${encodeURIComponent(task.name)}`);
    } catch (err) {
      let unplaced = [];
      if (err.status === 422 && err.fields) {
        unplaced = placeServerErrors(err.fields, lineOf);
      } else if (err.status === 409) {
        showError("name", "A task with this name already exists in this project, with a different definition.");
        try {
          await api(taskPath(body.team, body.project, body.name));
        } catch { /* not visible: keep the message */ }
      } else if (err.status === 403 && err.code === "priority_above_cap") {
        // A user's priority above the team's cap: the message names the cap.
        showError("priority", err.message);
      } else if (err.status === 403) {
        showError("team", err.message);
      } else {
        unplaced = [err.message];
      }
      const count = [...errors.values()].filter((e) => !e.error.hidden).length;
      clear(banner, h("strong", count ? `Please fix ${count === 1 ? "the highlighted field" : `${count} highlighted fields`}.` : "The task was not submitted."),
        unplaced.length ? h("ul", unplaced.map((m) => h("li", m))) : null);
      banner.hidden = false;
      focusFirstError();
    } finally {
      submitBtn.disabled = false;
      submitBtn.textContent = "Submit task";
    }
  }

  function focusFirstError() {
    const first = form.querySelector(".invalid");
    if (first) {
      first.scrollIntoView({ block: "center", behavior: "smooth" });
      if (first.focus) first.focus({ preventScroll: true });
    }
  }

  setKind(kind);
  setSource(source);
  setFile(null);
  updateCount();
  setTimeout(() => (team.value ? name : team).focus(), 0);

  return { title: "Submit a task", el };
}
