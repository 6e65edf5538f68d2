-- Fair share between teams: the negotiator. Every MINIONS_FAIR_SHARE_INTERVAL_S the watchdog runs
-- minion_fair_share_cycle, which folds the attempts ended since its last run into each team's
-- decayed usage, finds which teams have work pending for which capability (one index probe a pair,
-- however long the queue), and writes each contended capability's round of turns: each team gets
-- turns in proportion to its weight (team_shares.weight, default 1), spread evenly through the round
-- (smooth weighted round robin), the team with the least weighted recent usage first. A claim reads
-- one turn (minion_claim_batch): a team alone in the queue has no turns and the claim is as it was.
-- It also wakes long-polling claims of capped teams that have room again, and notes starving tasks.

INSERT INTO fair_share_state DEFAULT VALUES;

-- A team's usage as of now, decayed with half-life p_half_life_s from usage_at.
CREATE FUNCTION minion_decayed(p_usage double precision, p_at timestamptz, p_half_life_s double precision)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT p_usage * exp(ln(0.5) * greatest(extract(epoch FROM now() - p_at), 0) / p_half_life_s)
$$;

-- The (team, capability) pairs that have pending work: a skip scan of subtasks_pending_team, one
-- probe a pair.
CREATE FUNCTION minion_pending_pairs() RETURNS TABLE (team text, capability text) LANGUAGE sql STABLE AS $$
    WITH RECURSIVE pairs AS (
        (SELECT s.team::text AS team, s.capability FROM subtasks s WHERE s.state = 'pending'
          ORDER BY s.team, s.capability LIMIT 1)
        UNION ALL
        SELECT n.team, n.capability FROM pairs p, LATERAL (
            SELECT s.team::text AS team, s.capability FROM subtasks s
             WHERE s.state = 'pending' AND (s.team, s.capability) > (p.team::minion_name, p.capability)
             ORDER BY s.team, s.capability LIMIT 1) n
    )
    SELECT team, capability FROM pairs
$$;

-- One negotiation (see the header). p_round: turns in a round (more: finer shares); p_starving_s: how
-- long a task may wait with work pending and no lease while executors that could serve it are busy
-- elsewhere before it is noted as starving. Returns the capabilities given turns, or NULL when
-- another watchdog's negotiation holds the lock.
CREATE FUNCTION minion_fair_share_cycle(p_half_life_s double precision, p_round integer,
                                        p_starving_s double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    -- Attempts of transactions still committing are folded at the next run: their ended_at is their
    -- transaction's start, so a margin behind now() lets them land first.
    upto timestamptz := now() - interval '2 seconds';
    since timestamptz;
    cap text;
    pair_teams text[];
    pair_caps text[];
    teams text[];
    weights double precision[];
    current double precision[];
    total double precision;
    best integer;
    round_teams text[];
    given integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(-707102) THEN
        RETURN NULL;
    END IF;
    SELECT folded_to INTO since FROM fair_share_state;
    IF upto > since THEN
        INSERT INTO team_usage AS u (team, usage, usage_at)
        SELECT s.team::text,
               sum(minion_decayed(minion_attempt_seconds(a.seconds, a.started_at, a.ended_at), a.ended_at,
                                  p_half_life_s)), now()
          FROM subtask_attempts a JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
         WHERE a.ended_at > since AND a.ended_at <= upto
           AND minion_attempt_use(a.outcome) IN ('used', 'verification')  -- as the account charges it
         GROUP BY s.team
        ON CONFLICT (team) DO UPDATE
           SET usage = minion_decayed(u.usage, u.usage_at, p_half_life_s) + excluded.usage, usage_at = now();
        UPDATE fair_share_state SET folded_to = upto;
    END IF;

    SELECT coalesce(array_agg(p.team), '{}'), coalesce(array_agg(p.capability), '{}')
      INTO pair_teams, pair_caps FROM minion_pending_pairs() p;
    DELETE FROM fair_share_turns;
    FOR cap IN SELECT p.capability FROM unnest(pair_teams, pair_caps) AS p(team, capability)
                 LEFT JOIN team_shares c ON c.team = p.team
                GROUP BY p.capability
               HAVING count(*) > 1 OR bool_or(c.max_leases > 0)
                ORDER BY 1 LOOP
        SELECT array_agg(x.team ORDER BY x.key, x.team), array_agg(x.weight ORDER BY x.key, x.team)
          INTO teams, weights
          FROM (SELECT p.team, coalesce(c.weight, 1) AS weight,
                       minion_decayed(coalesce(u.usage, 0), coalesce(u.usage_at, now()), p_half_life_s)
                       / coalesce(c.weight, 1) AS key
                  FROM unnest(pair_teams, pair_caps) AS p(team, capability)
                  LEFT JOIN team_usage u ON u.team = p.team
                  LEFT JOIN team_shares c ON c.team = p.team
                 WHERE p.capability = cap) x;
        total := (SELECT sum(w) FROM unnest(weights) AS w);
        current := array_fill(0::double precision, ARRAY[cardinality(teams)]);
        round_teams := '{}';
        -- Smooth weighted round robin: each turn every team gains its weight, the richest takes the
        -- turn (the earlier in usage order on a tie) and pays the total.
        FOR turn IN 0 .. p_round - 1 LOOP
            best := 1;
            FOR i IN 1 .. cardinality(teams) LOOP
                current[i] := current[i] + weights[i];
                IF current[i] > current[best] THEN
                    best := i;
                END IF;
            END LOOP;
            current[best] := current[best] - total;
            round_teams := round_teams || teams[best];
        END LOOP;
        INSERT INTO fair_share_turns (capability, turn, turns, team)
        SELECT cap, r.n - 1, p_round, r.team FROM unnest(round_teams) WITH ORDINALITY AS r(team, n);
        given := given + 1;
    END LOOP;

    -- A capped team frees room as its leases end, which nothing announces: wake the claims waiting
    -- for its capabilities while it has room and work.
    FOR cap IN SELECT DISTINCT p.capability FROM unnest(pair_teams, pair_caps) AS p(team, capability)
                 JOIN team_shares c ON c.team = p.team
                WHERE c.max_leases > 0
                  AND c.max_leases > minion_team_leases_in_flight(c.team) LOOP
        PERFORM pg_notify('subtasks', cap);
    END LOOP;

    -- Starvation: an open task with work pending and nothing in flight, waiting longer than
    -- p_starving_s since its last result (or its submission), while an executor that could serve
    -- it (online, of its capability, its team or shared, not quarantined) holds other leases.
    DELETE FROM task_starvation w
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = w.task_id AND s.state = 'pending')
        OR EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = w.task_id AND s.state IN ('leased', 'checking'));
    INSERT INTO task_starvation (task_id, since)
    SELECT t.id, x.since
      FROM tasks t
      JOIN (SELECT DISTINCT p.team FROM unnest(pair_teams) AS p(team)) pt ON pt.team = t.team
      CROSS JOIN LATERAL (
          SELECT greatest(t.created_at, (SELECT a.ended_at FROM subtask_attempts a
                                          WHERE a.task_id = t.id AND a.outcome = 'done'
                                          ORDER BY a.ended_at DESC LIMIT 1)) AS since) x
     WHERE t.split_done AND t.status IN ('splitting', 'queued', 'running')
       AND NOT EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = t.id AND s.state IN ('leased', 'checking'))
       AND EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = t.id AND s.state = 'pending')
       AND x.since < now() - make_interval(secs => p_starving_s)
       AND EXISTS (SELECT 1 FROM executors e
                    WHERE e.status = 'online' AND e.quarantined_at IS NULL
                      AND minion_capability(t.kind, t.model) = ANY (e.capabilities)
                      AND (e.team IS NULL OR e.team = t.team)
                      AND EXISTS (SELECT 1 FROM subtasks l WHERE l.lease_executor = e.id AND l.state = 'leased'))
    ON CONFLICT (task_id) DO NOTHING;
    RETURN given;
END $$;

-- Tasks noted as starving (minion_fair_share_cycle): waiting with work pending while executors that
-- could serve them run other work. The alert rule minions-starving reads it.
CREATE VIEW grafana_starving_tasks AS
SELECT t.team::text AS team, t.project::text AS project, t.name::text AS task_name, t.id AS task_id,
       minion_capability(t.kind, t.model) AS capability, w.since,
       extract(epoch FROM now() - w.since)::float8 AS waiting_s
  FROM task_starvation w JOIN tasks t ON t.id = w.task_id;
