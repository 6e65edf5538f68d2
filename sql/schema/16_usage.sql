-- Accounting: every ended attempt's compute-seconds and records, charged to the team whose task it
-- ran and credited to the executor that ran it and to that executor's owner. What counts as a
-- team's use, its verification or nobody's, and how an attempt's seconds are measured:
-- minion_attempt_use, minion_attempt_seconds and the view minion_attempt_usage (leases.sql).

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
