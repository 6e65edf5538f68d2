-- Spot checks and trust (sql/400) in Grafana: who disagrees, who is quarantined and why, and what
-- the checks concluded over time (infra/grafana/dashboards/minions.json, row "Spot checks and
-- trust"). Views named grafana_*, read by the minions_grafana role (the grant block at the end, as
-- in 050_views.sql).
--
-- The outcomes of a check's attempts (subtask_attempts.outcome, sql/400): candidate (a result held
-- for a check: once it commits agreed it reads 'done', so these are results still held), agreed (a
-- replica that matched), outvoted (the losing side of a quorum, or of none), revoked (a committed
-- result of an executor quarantined later, run again) and unchecked (a held result committed because
-- no check finished in time). Both views count the last 24 h of them by ended_at (a revocation keeps
-- the revoked attempt's ended_at: it counts when that result was made).
--
-- Cost: the attempts of checks are a small share of all attempts (the spot-check share, and the
-- leases of executors still earning trust), so they get a partial index of their own, and both views
-- read only it: neither scans the done attempts of the hot path. The index's only cost to a commit
-- is its predicate, tested on each inserted attempt.

CREATE INDEX subtask_attempts_spot_checked ON subtask_attempts (ended_at)
 WHERE outcome IN ('candidate', 'agreed', 'outvoted', 'revoked', 'unchecked');

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

-- As 050_views.sql's grant block: the read-only role reads the views, nothing else.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        GRANT SELECT ON grafana_executor_trust, grafana_spot_check_outcomes TO minions_grafana;
    END IF;
END $$;
