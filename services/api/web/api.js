// The API client: the bearer token (kept in localStorage) and one error shape for every failure.

const TOKEN_KEY = "minions.token";

export const auth = {
  get token() {
    return localStorage.getItem(TOKEN_KEY);
  },
  set(token) {
    localStorage.setItem(TOKEN_KEY, token);
  },
  clear() {
    localStorage.removeItem(TOKEN_KEY);
  },
};

/** An API failure: `status` 0 means the server could not be reached. */
export class ApiError extends Error {
  constructor(status, code, message, fields = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.fields = fields;
  }
}

export const UNAUTHORIZED_EVENT = "minions:unauthorized";

/**
 * Calls the API. `body`: a plain object is sent as JSON; a Blob/File/string is sent as it is
 * (set its Content-Type in `headers`). Returns the parsed JSON (null for 204), or the Response
 * itself with `raw: true` (for streams and downloads).
 */
export async function api(path, { method = "GET", body, headers = {}, signal, raw = false, token } = {}) {
  const hdrs = { Accept: "application/json", ...headers };
  const bearer = token ?? auth.token;
  if (bearer) hdrs.Authorization = `Bearer ${bearer}`;
  let payload = body;
  if (body !== undefined && body !== null && !(body instanceof Blob) && typeof body !== "string") {
    hdrs["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers: hdrs, body: payload, signal, cache: "no-store" });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "unreachable", "Cannot reach the Minions API. Retrying…");
  }
  if (!resp.ok) {
    let code = "http_error";
    let message = `${resp.status} ${resp.statusText}`;
    let fields = null;
    try {
      const data = await resp.json();
      if (data && data.error) {
        code = data.error.code || code;
        message = data.error.message || message;
        fields = data.error.fields || null;
      }
    } catch {
      /* not JSON: keep the status line */
    }
    const error = new ApiError(resp.status, code, message, fields);
    if (resp.status === 401 && token === undefined) {
      window.dispatchEvent(new CustomEvent(UNAUTHORIZED_EVENT, { detail: error }));
    }
    throw error;
  }
  if (raw) return resp;
  if (resp.status === 204) return null;
  return resp.json();
}

/**
 * What the server knows (GET /api/v1/meta): the kinds with their params and default subtask sizes,
 * the task statuses, the subtask states and the attempt outcomes (minions/kinds.py), so the UI
 * restates none of them. Loaded once after
 * sign-in, before the first view is drawn; views read it as it is.
 */
export let meta = null;
let metaLoading = null;

export function loadMeta() {
  metaLoading ??= api("/api/v1/meta").then((m) => { meta = m; }).finally(() => { metaLoading = null; });
  return metaLoading;
}

/** Whether a task has ended (it changes no more). */
export const isFinished = (status) => meta.finished_task_statuses.includes(status);

/** Whether a task is not split yet (it has no subtasks to show). */
export const isUnsplit = (status) => meta.unsplit_task_statuses.includes(status);

/** Whether an attempt (an entry of a subtask's history) is a retry or a failure: its work did not stand. */
export const isProblemAttempt = (attempt) => meta.problem_attempt_outcomes.includes(attempt.outcome);

/**
 * A task's subtask counts as the parts of its progress bar: done first, then each other state the
 * server lists, in its order; pending subtasks are the bar's empty rest.
 */
export const progressParts = (counts) => Object.fromEntries(
  ["done", ...meta.subtask_states.filter((state) => state !== "done" && state !== "pending")]
    .map((state) => [state, counts[state] || 0]));

export const taskPath = (team, project, name) =>
  `/api/v1/tasks/${encodeURIComponent(team)}/${encodeURIComponent(project)}/${encodeURIComponent(name)}`;
