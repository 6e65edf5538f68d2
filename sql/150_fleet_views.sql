-- What a fleet operator watches (infra/grafana/dashboards/fleet.json and the alert rules in
-- infra/grafana/provisioning/alerting/minions.yaml): the backlog, how long work waits, whether any
-- executor can take it, and whether the splitter and the watchdog are doing their jobs. Views named
-- grafana_*, read by the minions_grafana role (the grant block at the end, as in 050_views.sql).

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

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        RETURN;
    END IF;
    GRANT SELECT ON grafana_backlog, grafana_subtask_spans, grafana_service_health TO minions_grafana;
END $$;
