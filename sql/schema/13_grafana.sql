-- Grafana's read side: views over the tables, named grafana_*, and a read-only role that can read
-- them and nothing else (not the tables, so never api_tokens or the store signing key). What a fleet
-- operator watches (infra/grafana/dashboards/ and the alert rules in
-- infra/grafana/provisioning/alerting/minions.yaml): the backlog, how long work waits, whether any
-- executor can take it, whether the splitter and the watchdog are doing their jobs, trust.
--
-- Every view has a `team` column, so a dashboard filters with `team IN ($team)`. Row-level views
-- (grafana_attempts, grafana_queue_wait, grafana_tasks) keep the raw timestamp columns, so a panel's
-- `$__timeFilter(ended_at)` reaches the table's index; the aggregated views summarise all history.

-- An error's kind, for grouping failures: ids and measurements out, whitespace folded, 80 chars.
-- 'executor 5f0c…-… lost: no heartbeat for 131.2 s' -> 'executor <id> lost: no heartbeat for N s'.
CREATE FUNCTION minion_error_reason(p_error text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(p_error,
               '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
               '0x[0-9a-f]+', '<addr>', 'gi'),
               '[0-9]+\.[0-9]+', 'N', 'g'),
               '\s+', ' ', 'g')), 80)
$$;

-- Every team the system knows of: from tasks, team-scoped executors and live team tokens.
CREATE VIEW grafana_teams AS
SELECT team::text AS team FROM tasks
UNION
SELECT team::text FROM executors WHERE team IS NOT NULL
UNION
SELECT team::text FROM api_tokens WHERE team IS NOT NULL AND revoked_at IS NULL;

-- One row per executor and team it serves (a shared executor: one row under every team).
CREATE VIEW grafana_executors AS
WITH settings AS (
    SELECT coalesce((SELECT value::double precision FROM minion_settings
                      WHERE key = 'lease_timeout_s'), 120) AS lease_timeout_s
), ex AS (
    SELECT e.id, e.name, e.team, e.hardware, e.kinds, e.models, e.registered_at, h.beat_at,
           l.leases,
           minion_executor_status(e.status, l.leases, h.alive_at, s.lease_timeout_s) AS status
      FROM executors e
      LEFT JOIN heartbeats h ON h.executor_id = e.id
     CROSS JOIN settings s
     -- Counted here, not by minion_lease_count(): functions run with the reader's rights, and
     -- minions_grafana may not read the tables.
     CROSS JOIN LATERAL (
           SELECT ((SELECT count(*) FROM subtasks sub WHERE sub.lease_executor = e.id AND sub.state = 'leased')
                 + (SELECT count(*) FROM subtask_backups b WHERE b.executor_id = e.id))::integer AS leases) l
)
SELECT t.team,
       ex.id AS executor_id,
       ex.name AS executor,
       CASE WHEN ex.team IS NULL THEN 'shared' ELSE 'team' END AS scope,
       coalesce(ex.hardware ->> 'device', 'unknown') AS device,
       coalesce(ex.hardware ->> 'chip', 'unknown') AS chip,
       coalesce(ex.hardware ->> 'os', 'unknown') AS os,
       ex.status,
       ex.status IN ('busy', 'idle') AS online,
       ex.leases,
       ex.beat_at AS last_heartbeat_at,
       ex.registered_at,
       array_to_string(ex.kinds, ',') AS kinds,
       array_to_string(ex.models, ',') AS models
  FROM ex
  JOIN grafana_teams t ON ex.team IS NULL OR t.team = ex.team::text;

-- Executors registered / online / busy / idle / offline / lost, per team and hardware.
CREATE VIEW grafana_executor_counts AS
SELECT team, device, chip, os,
       count(*) AS registered,
       count(*) FILTER (WHERE online) AS online,
       count(*) FILTER (WHERE status = 'busy') AS busy,
       count(*) FILTER (WHERE status = 'idle') AS idle,
       count(*) FILTER (WHERE status = 'offline') AS offline,
       count(*) FILTER (WHERE status = 'lost') AS lost
  FROM grafana_executors
 GROUP BY team, device, chip, os;

-- One row per task; phase: active (submitted, splitting, queued, running), completed, failed,
-- cancelled. Counters read through the progress slots, so they are live while the task runs.
CREATE VIEW grafana_tasks AS
SELECT t.team::text AS team,
       t.project::text AS project,
       t.name::text AS task_name,
       t.id AS task_id,
       t.kind,
       t.model,
       t.status,
       CASE WHEN t.status IN ('submitted', 'splitting', 'queued', 'running') THEN 'active'
            ELSE t.status END AS phase,
       t.priority,
       t.split_records AS records,
       -- Scalar subqueries, not a join or minion_task_slot_sums: a view reads its tables with its
       -- owner's rights (a function it calls runs with the reader's, and minions_grafana reads
       -- views only), and the view stays a simple one, so writing to it is refused for want of
       -- the privilege.
       (t.open_subtasks - (SELECT coalesce(sum(s.closed), 0) FROM task_progress_slots s
                            WHERE s.task_id = t.id))::integer AS open_subtasks,
       (t.failed_subtasks + (SELECT coalesce(sum(s.failed), 0) FROM task_progress_slots s
                              WHERE s.task_id = t.id))::integer AS failed_subtasks,
       t.created_at,
       t.started_at,
       t.finished_at,
       t.error
  FROM tasks t;

CREATE VIEW grafana_tasks_by_status AS
SELECT team, phase, status, count(*) AS tasks, sum(records) AS records
  FROM grafana_tasks
 GROUP BY team, phase, status;

-- Inference kinds and models: tasks and records (split, and done) per team.
CREATE VIEW grafana_kinds_models AS
SELECT t.team::text AS team, t.kind, t.model,
       count(*) AS tasks,
       count(*) FILTER (WHERE t.status IN ('submitted', 'splitting', 'queued', 'running')) AS active_tasks,
       sum(t.split_records) AS records,
       coalesce(sum(d.records_done), 0) AS records_done
  FROM tasks t
  LEFT JOIN (SELECT task_id, sum(records) AS records_done FROM subtasks
              WHERE state = 'done' GROUP BY task_id) d ON d.task_id = t.id
 GROUP BY t.team, t.kind, t.model;

-- One row per ended attempt, with its task and executor. duration_s: lease to end (wall clock, with
-- downloads and uploads); compute_s: what the executor reported (done attempts only); reason: the
-- normalised error of an attempt that did not end done.
CREATE VIEW grafana_attempts AS
SELECT a.ended_at,
       a.started_at,
       t.team::text AS team,
       t.project::text AS project,
       t.name::text AS task_name,
       a.task_id,
       a.subtask_id,
       a.attempt,
       t.kind,
       t.model,
       a.outcome,
       a.executor_id,
       coalesce(e.name, 'unknown') AS executor,
       coalesce(e.hardware ->> 'device', 'unknown') AS device,
       coalesce(e.hardware ->> 'chip', 'unknown') AS chip,
       coalesce(e.hardware ->> 'os', 'unknown') AS os,
       a.records,
       a.seconds AS compute_s,
       extract(epoch FROM a.ended_at - a.started_at)::double precision AS duration_s,
       a.error,
       CASE WHEN a.outcome <> 'done' THEN minion_error_reason(coalesce(a.error, a.outcome)) END AS reason
  FROM subtask_attempts a
  JOIN tasks t ON t.id = a.task_id
  LEFT JOIN executors e ON e.id = a.executor_id;

-- Records committed per minute, per team, kind and model.
CREATE VIEW grafana_records_per_minute AS
SELECT date_trunc('minute', ended_at) AS "time", team, kind, model,
       sum(records) AS records, count(*) AS subtasks
  FROM grafana_attempts
 WHERE outcome = 'done'
 GROUP BY 1, team, kind, model;

-- Queue wait per task: submission to first lease. A task still waiting counts with its wait so far
-- (waiting = true, waited_until = now), so a stuck queue shows up rather than hiding.
CREATE VIEW grafana_queue_wait AS
SELECT w.team, w.project, w.task_name, w.task_id, w.kind, w.model, w.created_at, w.first_lease_at,
       w.first_lease_at IS NULL AS waiting,
       coalesce(w.first_lease_at, now()) AS waited_until,
       extract(epoch FROM coalesce(w.first_lease_at, now()) - w.created_at)::double precision AS wait_s
  FROM (SELECT t.team::text AS team, t.project::text AS project, t.name::text AS task_name,
               t.id AS task_id, t.kind, t.model, t.created_at, t.status,
               coalesce(t.started_at,
                        (SELECT min(a.started_at) FROM subtask_attempts a WHERE a.task_id = t.id))
                   AS first_lease_at
          FROM tasks t) w
 WHERE w.first_lease_at IS NOT NULL
    OR w.status IN ('submitted', 'splitting', 'queued', 'running');

CREATE VIEW grafana_queue_wait_percentiles AS
SELECT team, kind, model,
       count(*) AS tasks,
       count(*) FILTER (WHERE waiting) AS waiting,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s) AS p95_s,
       max(wait_s) AS max_s
  FROM grafana_queue_wait
 GROUP BY team, kind, model;

-- Done subtasks' durations, p50/p95, by model and by hardware.
CREATE VIEW grafana_subtask_duration_by_model AS
SELECT team, kind, model,
       count(*) AS subtasks,
       sum(records) AS records,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_s) AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_s) AS p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY compute_s) AS p50_compute_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY compute_s) AS p95_compute_s,
       sum(records) / nullif(sum(compute_s), 0) AS records_per_compute_s
  FROM grafana_attempts
 WHERE outcome = 'done'
 GROUP BY team, kind, model;

CREATE VIEW grafana_subtask_duration_by_hardware AS
SELECT team, device, chip, os,
       count(*) AS subtasks,
       sum(records) AS records,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_s) AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_s) AS p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY compute_s) AS p50_compute_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY compute_s) AS p95_compute_s,
       sum(records) / nullif(sum(compute_s), 0) AS records_per_compute_s
  FROM grafana_attempts
 WHERE outcome = 'done'
 GROUP BY team, device, chip, os;

-- Failed and lost attempts by normalised reason.
CREATE VIEW grafana_failures_by_reason AS
SELECT team, outcome, reason,
       count(*) AS failures,
       count(DISTINCT task_id) AS tasks,
       count(DISTINCT executor_id) AS executors,
       min(ended_at) AS first_at,
       max(ended_at) AS last_at
  FROM grafana_attempts
 WHERE outcome IN ('failed', 'lost')
 GROUP BY team, outcome, reason;

-- What each executor contributed to each team (the team of the tasks it ran).
CREATE VIEW grafana_top_executors AS
SELECT team, executor_id, executor, device, chip, os,
       count(*) FILTER (WHERE outcome = 'done') AS subtasks_done,
       coalesce(sum(records) FILTER (WHERE outcome = 'done'), 0) AS records_done,
       coalesce(sum(compute_s) FILTER (WHERE outcome = 'done'), 0) AS compute_s,
       count(*) FILTER (WHERE outcome IN ('failed', 'lost')) AS failures,
       max(ended_at) FILTER (WHERE outcome = 'done') AS last_done_at
  FROM grafana_attempts
 GROUP BY team, executor_id, executor, device, chip, os;

-- Per executor and model, what its agent chose at load and reported with its hardware: the precision,
-- its cosine to fp32, and the engine (backend: torch or mlx; torch for agents that predate the choice).
CREATE VIEW grafana_executor_precision AS
SELECT ge.team,
       ge.executor_id,
       ge.executor,
       ge.device,
       ge.chip,
       ge.status,
       ge.online,
       p.value ->> 'model' AS model,
       coalesce(p.value ->> 'precision', 'unknown') AS precision,
       CASE WHEN jsonb_typeof(p.value -> 'cosine') = 'number'
            THEN (p.value ->> 'cosine')::double precision END AS cosine,
       coalesce(p.value ->> 'setting', 'auto') AS setting,
       coalesce(p.value ->> 'backend', 'torch') AS backend
  FROM grafana_executors ge
  JOIN executors e ON e.id = ge.executor_id
 CROSS JOIN LATERAL jsonb_array_elements(
           CASE WHEN jsonb_typeof(e.hardware -> 'precision') = 'array' THEN e.hardware -> 'precision'
                ELSE '[]'::jsonb END) AS p(value)
 WHERE jsonb_typeof(p.value) = 'object';

-- Per team and capability (kind:model, as claims match it): queued work, how old the oldest of it
-- is, and how many online executors could claim it (a shared executor serves every team, a team's
-- own executor only its team). A subtask has no creation time of its own: its task's `created_at`
-- is when it became due (splitting follows within seconds).
CREATE VIEW grafana_backlog AS
WITH settings AS (
    SELECT coalesce((SELECT value::double precision FROM minion_settings
                      WHERE key = 'lease_timeout_s'), 120) AS lease_timeout_s
), queued AS (
    SELECT s.team::text AS team, t.kind, t.model, s.capability,
           count(*) FILTER (WHERE s.state = 'pending')::integer AS pending,
           count(*) FILTER (WHERE s.state = 'leased')::integer AS leased,
           min(t.created_at) FILTER (WHERE s.state = 'pending') AS oldest_pending_since
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.state IN ('pending', 'leased')
     GROUP BY s.team, t.kind, t.model, s.capability
), online AS (
    SELECT e.team::text AS team, e.capabilities
      FROM executors e
      LEFT JOIN heartbeats h ON h.executor_id = e.id
     CROSS JOIN settings st
     -- Leases do not matter here (busy and idle are both online): counted as 0.
     WHERE minion_executor_status(e.status, 0, h.alive_at, st.lease_timeout_s) IN ('busy', 'idle')
)
SELECT q.team, q.kind, q.model, q.capability, q.pending, q.leased, q.oldest_pending_since,
       coalesce(extract(epoch FROM now() - q.oldest_pending_since), 0)::double precision AS oldest_pending_age_s,
       (SELECT count(*) FROM online o
         WHERE q.capability = ANY (o.capabilities) AND (o.team IS NULL OR o.team = q.team))::integer
           AS online_executors
  FROM queued q;

-- One row per subtask with the span it was outstanding (due, until done, failed or cancelled;
-- NULL while still pending or leased): the backlog at any past moment is the spans covering it.
CREATE VIEW grafana_subtask_spans AS
SELECT s.team::text AS team, t.kind, t.model, t.created_at AS due_at,
       CASE WHEN s.state IN ('pending', 'leased') THEN NULL
            ELSE coalesce(s.done_at, t.finished_at, t.created_at) END AS ended_at
  FROM subtasks s JOIN tasks t ON t.id = s.task_id;

-- The splitter and the watchdog, judged by their work: tasks submitted and still unsplit, and
-- leases whose executor has been silent past the lease timeout (the watchdog reclaims those within
-- a second or two; one still there a minute later means no watchdog is running).
CREATE VIEW grafana_service_health AS
WITH settings AS (
    SELECT coalesce((SELECT value::double precision FROM minion_settings
                      WHERE key = 'lease_timeout_s'), 120) AS lease_timeout_s
)
SELECT (SELECT count(*) FROM tasks WHERE status = 'submitted')::integer AS unsplit_tasks,
       coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM tasks WHERE status = 'submitted'), 0)
           ::double precision AS oldest_unsplit_age_s,
       (SELECT count(*) FROM subtasks s LEFT JOIN heartbeats h ON h.executor_id = s.lease_executor
         WHERE s.state = 'leased'
           AND coalesce(h.alive_at, s.leased_at) < now() - make_interval(secs => st.lease_timeout_s))::integer
           AS overdue_leases,
       coalesce((SELECT extract(epoch FROM now() - min(coalesce(h.alive_at, s.leased_at)))
                   FROM subtasks s LEFT JOIN heartbeats h ON h.executor_id = s.lease_executor
                  WHERE s.state = 'leased'), 0)::double precision - st.lease_timeout_s AS most_overdue_s
  FROM settings st;

-- One row per executor and team it serves (a shared executor: one row under every team, as in
-- grafana_executors); its trust and its counts are the executor's own, over every team's tasks, so a
-- panel over several teams takes one row per executor_id. owner: its token's label ('' reads NULL).
CREATE VIEW grafana_executor_trust AS
WITH recent AS (
    SELECT a.executor_id,
           count(*) FILTER (WHERE a.outcome = 'agreed')::integer AS agreed_24h,
           count(*) FILTER (WHERE a.outcome = 'outvoted')::integer AS outvoted_24h,
           count(*) FILTER (WHERE a.outcome = 'revoked')::integer AS revoked_24h,
           count(*) FILTER (WHERE a.outcome = 'unchecked')::integer AS unchecked_24h,
           count(*) FILTER (WHERE a.outcome = 'candidate')::integer AS candidate_24h
      FROM subtask_attempts a
     WHERE a.outcome IN ('candidate', 'agreed', 'outvoted', 'revoked', 'unchecked')
       AND a.ended_at >= now() - interval '24 hours'
       AND a.executor_id IS NOT NULL
     GROUP BY a.executor_id
)
SELECT t.team,
       e.id AS executor_id,
       e.name AS executor,
       CASE WHEN e.team IS NULL THEN 'shared' ELSE 'team' END AS scope,
       nullif(k.label, '') AS owner,
       e.agreements,
       e.disagreements,
       e.trusted,
       e.quarantined_at IS NOT NULL AS quarantined,
       e.quarantined_at,
       e.quarantine_reason,
       CASE WHEN e.quarantined_at IS NOT NULL THEN 'quarantined'
            WHEN e.trusted THEN 'trusted'
            ELSE 'checked' END AS trust,
       coalesce(r.agreed_24h, 0) AS agreed_24h,
       coalesce(r.outvoted_24h, 0) AS outvoted_24h,
       coalesce(r.revoked_24h, 0) AS revoked_24h,
       coalesce(r.unchecked_24h, 0) AS unchecked_24h,
       coalesce(r.candidate_24h, 0) AS candidate_24h
  FROM executors e
  JOIN api_tokens k ON k.id = e.token_id
  LEFT JOIN recent r ON r.executor_id = e.id
  JOIN grafana_teams t ON e.team IS NULL OR t.team = e.team::text;

-- The attempts of checks per minute, per team (of the task) and outcome, over the last 24 h: a time
-- series (`$__timeFilter("time")`).
CREATE VIEW grafana_spot_check_outcomes AS
SELECT date_trunc('minute', a.ended_at) AS "time",
       t.team::text AS team,
       a.outcome,
       count(*)::integer AS attempts
  FROM subtask_attempts a
  JOIN tasks t ON t.id = a.task_id
 WHERE a.outcome IN ('candidate', 'agreed', 'outvoted', 'revoked', 'unchecked')
   AND a.ended_at >= now() - interval '24 hours'
 GROUP BY 1, t.team, a.outcome;

-- Accounting (minion_attempt_usage, leases.sql): one row per ended attempt, its team (whose task
-- it ran), executor and owner (its token's label), its use ('used', 'verification' or 'lost': nobody's)
-- and compute-seconds. Row-level: `$__timeFilter(ended_at)` reaches the table's index.
CREATE VIEW grafana_usage AS
SELECT u.ended_at,
       u.team,
       u.task_id,
       u.executor_id,
       coalesce(u.executor, 'unknown') AS executor,
       coalesce(u.owner, 'unknown') AS owner,
       u.outcome,
       u.use,
       u.seconds,
       u.records
  FROM minion_attempt_usage u;

-- Each team's share of the pool as an admin set it (team_shares; a team with no row: weight 1, no
-- priority above 0, no lease cap), for the panels that set usage against weight.
CREATE VIEW grafana_team_weights AS
SELECT g.team,
       coalesce(s.weight, 1) AS weight,
       coalesce(s.priority_cap, 0) AS priority_cap,
       coalesce(s.max_leases, 0) AS max_leases
  FROM grafana_teams g
  LEFT JOIN team_shares s ON s.team = g.team;
