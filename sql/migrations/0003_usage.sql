-- Accounting: each ended attempt's use (the team's, its verification's, nobody's) and
-- compute-seconds, by team, executor and owner (minion_usage), and the Grafana views of usage and
-- of teams' weights.

-- What an ended attempt's compute was to the pool, for accounting (minion_usage, grafana_usage):
-- 'used': the team's own work, whatever became of it: a result committed (done, unchecked) or held
--   for a check (candidate), its subtask's failure (failed), a run its cancel stopped (cancelled), a
--   straggler's copy that the other run beat (superseded);
-- 'verification': what its spot checks cost it: a replica that agreed, a result on the losing side
--   of a quorum or of none (outvoted);
-- 'lost': nobody's use: an executor that went silent (lost) or handed its lease back (released), a
--   result thrown away because its executor was quarantined (revoked).
-- NULL for an outcome it does not know: a new outcome must be given a place here.
CREATE FUNCTION minion_attempt_use(p_outcome text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_outcome IN ('done', 'unchecked', 'candidate', 'failed', 'cancelled', 'superseded') THEN 'used'
        WHEN p_outcome IN ('agreed', 'outvoted') THEN 'verification'
        WHEN p_outcome IN ('lost', 'released', 'revoked') THEN 'lost'
    END
$$;

-- An ended attempt's compute-seconds: what its executor reported with its result (every attempt
-- that returned one: done, unchecked, candidate, agreed, outvoted, revoked), else the lease's wall
-- time, from lease to end (an attempt that ended without a result reports none: failed, lost,
-- released, cancelled, superseded; a lost one's includes the wait until the watchdog noticed).
CREATE FUNCTION minion_attempt_seconds(p_seconds double precision, p_started timestamptz, p_ended timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_seconds, greatest(extract(epoch FROM p_ended - p_started)::double precision, 0))
$$;

-- Every ended attempt as accounting counts it: the team whose task it ran, the executor that ran
-- it and that executor's owner (the label of the API token it registered with; 'token <id>' for an
-- unlabelled one), its use and compute-seconds. Read by time (`ended_at`, indexed).
CREATE VIEW minion_attempt_usage AS
SELECT a.ended_at,
       a.task_id,
       t.team::text AS team,
       a.executor_id,
       e.name AS executor,
       coalesce(nullif(k.label, ''), 'token ' || k.id) AS owner,
       a.outcome,
       minion_attempt_use(a.outcome) AS use,
       minion_attempt_seconds(a.seconds, a.started_at, a.ended_at) AS seconds,
       a.records
  FROM subtask_attempts a
  JOIN tasks t ON t.id = a.task_id
  LEFT JOIN executors e ON e.id = a.executor_id
  LEFT JOIN api_tokens k ON k.id = e.token_id;

-- Usage of the attempts that ended at p_since or later, of team p_team (NULL: every team), one row
-- per team, per executor or per owner (p_by 'team', 'executor' or 'owner'; any other value: no
-- rows). A row names what it is grouped by and leaves the rest NULL (an executor's row names its
-- owner too; an attempt of no known executor is one row with NULLs). used_s, verification_s,
-- lost_s: compute-seconds by use; records: those of the used attempts (what the team got back);
-- attempts: every attempt counted. Most compute first. An SQL function simple enough to be inlined,
-- so a caller's p_since reaches the index on ended_at.
CREATE FUNCTION minion_usage(p_since timestamptz, p_team text, p_by text)
RETURNS TABLE (team text, executor_id uuid, executor text, owner text, used_s double precision,
               verification_s double precision, lost_s double precision, records bigint, attempts bigint)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_by = 'team' THEN u.team END,
           CASE WHEN p_by = 'executor' THEN u.executor_id END,
           CASE WHEN p_by = 'executor' THEN u.executor END,
           CASE WHEN p_by IN ('executor', 'owner') THEN u.owner END,
           coalesce(sum(u.seconds) FILTER (WHERE u.use = 'used'), 0),
           coalesce(sum(u.seconds) FILTER (WHERE u.use = 'verification'), 0),
           coalesce(sum(u.seconds) FILTER (WHERE u.use = 'lost'), 0),
           coalesce(sum(u.records) FILTER (WHERE u.use = 'used'), 0),
           count(*)
      FROM minion_attempt_usage u
     WHERE u.ended_at >= p_since
       AND (p_team IS NULL OR u.team = p_team)
       AND p_by IN ('team', 'executor', 'owner')
     GROUP BY 1, 2, 3, 4
     ORDER BY sum(u.seconds) DESC, 1, 3, 4, 2
$$;

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

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        GRANT SELECT ON grafana_usage, grafana_team_weights TO minions_grafana;
        GRANT EXECUTE ON FUNCTION minion_attempt_use(text),
                                  minion_attempt_seconds(double precision, timestamptz, timestamptz)
           TO minions_grafana;
    END IF;
END $$;
