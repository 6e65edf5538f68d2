-- Volunteers' results are held until checked (never committed unchecked because no replica could
-- run, nor when the check wait passes: an overdue lone result stays held and its task is warned), and
-- a lease, backup or replica has an age cap (the watchdog ends one held past it, heartbeats or not,
-- and its executor, unless vouched for, counts a disagreement). Stragglers and caps measure against
-- the task's typical run, else its kind's.
ALTER TABLE subtask_checks ADD COLUMN overdue boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION minion_pair_value(p_key text, p_pairs text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT split_part(kv, '=', 2)::double precision
      FROM unnest(string_to_array(p_pairs, ',')) AS kv
     WHERE btrim(split_part(kv, '=', 1)) = p_key
     LIMIT 1
$$;

DROP FUNCTION minion_team_spot_check_share(text, text);

CREATE OR REPLACE FUNCTION minion_untrusted_backup(s subtasks, p_token uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT minion_trust_setting('trust_agreements', 0) > 0
       AND EXISTS (SELECT 1 FROM subtask_backups k
                    WHERE k.lease_token = p_token AND k.task_id = s.task_id AND k.subtask_id = s.subtask_id
                      AND NOT minion_executor_trusted(k.executor_id))
$$;

CREATE OR REPLACE FUNCTION minion_settle_stale_checks(p_wait_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    k record;
    s subtasks;
    w subtask_checks%ROWTYPE;
    tok uuid;
    n integer := 0;
    note text := format('unchecked: no replica agreed or disagreed within %s s', p_wait_s);
BEGIN
    FOR k IN SELECT c.task_id, c.subtask_id FROM subtask_checks c
              GROUP BY c.task_id, c.subtask_id
             HAVING min(c.held_at) < now() - make_interval(secs => p_wait_s) AND NOT bool_and(c.overdue)
              ORDER BY c.task_id, c.subtask_id LOOP
        SELECT * INTO s FROM subtasks
         WHERE task_id = k.task_id AND subtask_id = k.subtask_id AND state = 'checking' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF (SELECT count(*) FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id) = 1 THEN
            SELECT * INTO w FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id;
            IF NOT minion_executor_vouched(w.executor_id) THEN
                UPDATE subtask_checks SET overdue = true WHERE lease_token = w.lease_token;
                n := n + 1;
                CONTINUE;
            END IF;
        END IF;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.task_id = k.task_id AND b.subtask_id = k.subtask_id LOOP
            PERFORM minion_end_backup(tok, 'superseded', note);
        END LOOP;
        IF w.lease_token IS NOT NULL THEN
            IF NOT minion_commit_candidate(s, w, 'unchecked', note) THEN
                PERFORM minion_recheck_subtask(s, 'its vectors'' length is not the task''s');
            END IF;
        ELSE
            PERFORM minion_recheck_subtask(s, format('two results disagreed and no third came within %s s',
                                                     p_wait_s));
        END IF;
        w := NULL;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION minion_typical_run_s(p_task_id bigint, p_records integer) RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
DECLARE
    per double precision;
    n bigint;
BEGIN
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.per), count(*) INTO per, n
      FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) / greatest(coalesce(a.records, 1), 1) AS per
              FROM subtask_attempts a
             WHERE a.task_id = p_task_id AND a.outcome = 'done'
             ORDER BY a.ended_at DESC LIMIT 1000) x;
    IF n < 3 THEN
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.per), count(*) INTO per, n
          FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) / greatest(coalesce(a.records, 1), 1) AS per
                  FROM (SELECT r.task_id, r.ended_at, r.started_at, r.records FROM subtask_attempts r
                         WHERE r.outcome = 'done' ORDER BY r.ended_at DESC LIMIT 5000) a
                  JOIN tasks k ON k.id = a.task_id
                  JOIN tasks me ON me.id = p_task_id AND me.kind = k.kind AND me.model = k.model
                 LIMIT 1000) x;
    END IF;
    RETURN CASE WHEN n >= 3 THEN per * greatest(p_records, 1) END;
END $$;

CREATE OR REPLACE FUNCTION minion_claim_backup(p_executor uuid, p_caps text[], p_team text, p_factor double precision)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    FOR cand IN
        WITH leased AS (
            -- Few rows: one per busy executor (partial index subtasks_leased_at).
            SELECT s.task_id, s.subtask_id, s.leased_at, s.capability, s.priority, s.records FROM subtasks s
             WHERE s.state = 'leased' AND s.capability = ANY (p_caps)
               AND (p_team IS NULL OR s.team = p_team) AND s.lease_executor <> p_executor
               AND (s.capability = 'sleep:*'
                    OR (SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id)
                       = minion_executor_fingerprint(p_executor, s.capability))
        ), tails AS (
            -- Tasks with nothing left pending: the only ones whose stragglers hold up the end.
            SELECT DISTINCT l.task_id FROM leased l
             WHERE NOT EXISTS (SELECT 1 FROM subtasks p
                                WHERE p.state = 'pending' AND p.capability = l.capability
                                  AND p.priority = l.priority AND p.task_id = l.task_id)
        ), thresholds AS (
            -- Once per task: a typical record's run (the task's size per subtask varies at its end).
            SELECT t.task_id, minion_typical_run_s(t.task_id, 1) AS per_record FROM tails t
        )
        SELECT l.task_id, l.subtask_id FROM leased l JOIN thresholds th ON th.task_id = l.task_id
         WHERE th.per_record IS NOT NULL
           AND now() - l.leased_at > p_factor * make_interval(secs => th.per_record * greatest(l.records, 1))
           AND NOT EXISTS (SELECT 1 FROM subtask_backups b
                            WHERE b.task_id = l.task_id AND b.subtask_id = l.subtask_id)
         ORDER BY l.leased_at
         LIMIT 4
    LOOP
        tok := minion_take_second_run(cand.task_id, cand.subtask_id, 'leased', p_executor);
        IF tok IS NOT NULL THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION minion_lease_age_cap(p_task_id bigint, p_kind text, p_records integer, p_factor double precision,
                                     p_floor_s double precision, p_ceilings text) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT least(c.ceiling, greatest(p_floor_s, coalesce(p_factor * minion_typical_run_s(p_task_id, p_records),
                                                         c.ceiling)))
      FROM (SELECT coalesce(minion_pair_value(p_kind, p_ceilings),
                            minion_pair_value('*', p_ceilings), 3600) AS ceiling) c
$$;

CREATE OR REPLACE FUNCTION minion_end_overage_leases(p_factor double precision, p_floor_s double precision, p_ceilings text,
                                          p_quarantine_after integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    o record;
    n integer := 0;
    why text;
BEGIN
    -- Only what is older than the floor is looked at (few rows, by the leased_at index): a cap is never less.
    FOR o IN WITH held AS (
                 SELECT s.lease_token AS tok, s.lease_executor AS executor_id, s.leased_at, s.task_id, s.subtask_id,
                        s.records
                   FROM subtasks s
                  WHERE s.state = 'leased' AND s.leased_at < now() - make_interval(secs => p_floor_s)
                 UNION ALL
                 SELECT b.lease_token, b.executor_id, b.leased_at, b.task_id, b.subtask_id, s.records
                   FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
                  WHERE b.leased_at < now() - make_interval(secs => p_floor_s)
             )
             SELECT h.*, c.cap FROM held h JOIN tasks t ON t.id = h.task_id
             CROSS JOIN LATERAL (SELECT minion_lease_age_cap(h.task_id, t.kind, h.records, p_factor, p_floor_s,
                                                             p_ceilings) AS cap) c
              WHERE h.leased_at < now() - make_interval(secs => least(c.cap, 1e9))
              ORDER BY h.task_id, h.subtask_id LOOP
        why := format('held past its age cap (%s s) without a result', round(o.cap::numeric));
        IF minion_end_lease(o.tok, 'lost', why, false, true) <> 'ok' THEN
            CONTINUE;  -- ended meanwhile
        END IF;
        n := n + 1;
        CONTINUE WHEN minion_executor_vouched(o.executor_id);
        PERFORM 1 FROM executors WHERE id = o.executor_id FOR UPDATE;
        UPDATE executors SET disagreements = disagreements + 1, agreements = 0, trusted = false
         WHERE id = o.executor_id;
        UPDATE executors
           SET quarantined_at = now(), quarantine_settled = false,
               quarantine_reason = format('let %s leases or replicas pass their age cap or lost quorums (last: task %s, '
                                          'subtask %s, %s)', disagreements, o.task_id, o.subtask_id, why)
         WHERE id = o.executor_id AND quarantined_at IS NULL
           AND disagreements >= p_quarantine_after;
    END LOOP;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
                                              p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (verdict text, capabilities text[], owner bigint, lease_token uuid, expires_at timestamptz,
               task_id bigint, subtask_id integer, attempt integer, team text, project text,
               task_name text, kind text, model text, params jsonb, input_uri text, byte_start bigint,
               byte_end bigint, records integer, output_key text, backup boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    wanted integer := greatest(p_max, 1);
    won uuid[] := '{}';  -- the leases won, in claim order
    backup_tok uuid;
    replica_tok uuid;
    share double precision;
    vouched boolean;
    team_shares text;
    starting bigint;
    ex executors%ROWTYPE;
    pref record;
    fair text[] := '{}';  -- the teams whose turn it is (fair_share_turns), for the executor's capabilities
    capped text[];        -- teams with a lease cap: never taken from the whole queue
    rooms integer[];      -- the leases each of them may still take now (NULL: not read yet)
    k integer;
    n integer;
    got uuid[];
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := minion_executor_refusal(ex, p_token_id);
    IF verdict IS NULL AND ex.status = 'offline' THEN
        verdict := 'deregistered';
    END IF;
    IF verdict IS NULL AND ex.quarantined_at IS NOT NULL THEN
        verdict := 'quarantined';
    END IF;
    IF verdict IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    replica_tok := minion_claim_replica(p_executor, ex.token_id, ex.capabilities, ex.team);
    IF replica_tok IS NOT NULL THEN
        wanted := wanted - 1;
    END IF;
    IF ex.team IS NULL AND EXISTS (SELECT 1 FROM fair_share_turns f WHERE f.capability = ANY (ex.capabilities)) THEN
        k := nextval('minion_fair_share_cursor') % 2147483647;
        fair := ARRAY(SELECT f.team FROM fair_share_turns f
                       WHERE f.capability = ANY (ex.capabilities) AND f.turn = k % f.turns
                       ORDER BY f.capability);
    END IF;
    capped := ARRAY(SELECT c.team::text FROM team_shares c WHERE c.max_leases > 0 ORDER BY c.team);
    rooms := array_fill(NULL::integer, ARRAY[cardinality(capped)]);  -- each read when first needed
    -- Preferences first (an owner's choice beats fairness), then the team whose turn it is, then the
    -- whole queue (the executor's team's, if it has one). A team with a lease cap takes at most its room.
    FOR pref IN (SELECT p.position, p.team::text AS team, p.project, p.task_name FROM executor_preferences p
                  WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 UNION ALL SELECT 2147483000 + f.n, f.team, NULL, NULL FROM unnest(fair) WITH ORDINALITY AS f(team, n)
                 UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                 ORDER BY 1 LOOP
        EXIT WHEN cardinality(won) >= wanted;
        n := wanted - cardinality(won);
        k := array_position(capped, pref.team);
        IF k IS NOT NULL THEN
            rooms[k] := coalesce(rooms[k], minion_team_lease_room(pref.team));
            n := least(n, rooms[k]);
            CONTINUE WHEN n <= 0;
        END IF;
        got := minion_claim_some_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name, n,
                                    cardinality(won), CASE WHEN pref.team IS NULL THEN capped ELSE '{}' END);
        IF k IS NOT NULL THEN
            rooms[k] := rooms[k] - cardinality(got);
        END IF;
        won := won || got;
    END LOOP;
    IF cardinality(won) = 0 AND replica_tok IS NULL AND p_backup_factor > 0 THEN
        backup_tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
    END IF;
    IF cardinality(won) = 0 AND backup_tok IS NULL AND replica_tok IS NULL THEN
        verdict := 'empty';
        capabilities := ex.capabilities;
        RETURN NEXT;
        RETURN;
    END IF;

    IF cardinality(won) > 0 THEN
        -- A vouched executor's results are never checked (volunteers' replicas could frame it).
        vouched := minion_executor_vouched(p_executor);
        share := CASE WHEN vouched THEN 0
                      WHEN ex.trusted OR minion_trust_setting('trust_agreements', 0) <= 0
                      THEN minion_trust_setting('spot_check_share', 0) ELSE 1 END;
        team_shares := CASE WHEN share < 1 AND NOT vouched
                            THEN nullif(current_setting('minions.spot_check_team_shares', true), '') END;
        IF share > 0 OR team_shares IS NOT NULL THEN
            UPDATE subtasks s SET check_token = s.lease_token
              FROM tasks t
             WHERE s.lease_token = ANY (won) AND t.id = s.task_id
               AND random() < CASE WHEN share >= 1 THEN 2
                                   ELSE coalesce(minion_pair_value(s.team::text, team_shares), share) END
               AND (minion_checkable(t.kind, t.params) OR minion_executor_proves(p_executor, s.capability));
        END IF;
    END IF;

    FOR starting IN SELECT DISTINCT t.id FROM subtasks s JOIN tasks t ON t.id = s.task_id
                     WHERE s.lease_token = ANY (won) AND t.status IN ('splitting', 'queued')
                     ORDER BY 1 LOOP
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = starting AND status IN ('splitting', 'queued');
    END LOOP;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    IF backup_tok IS NOT NULL OR replica_tok IS NOT NULL THEN
        RETURN QUERY
        SELECT 'leased', ex.capabilities, ex.token_id, b.lease_token,
               now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
               s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
               s.byte_start, s.byte_end, s.records,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, b.lease_token), replica_tok IS NULL
          FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
          JOIN tasks t ON t.id = s.task_id
         WHERE b.lease_token = coalesce(replica_tok, backup_tok);
    END IF;
    RETURN QUERY
    SELECT 'leased', ex.capabilities, ex.token_id, s.lease_token,
           now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
           s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
           s.byte_start, s.byte_end, s.records,
           minion_output_key(s.task_id, s.subtask_id, s.attempts, s.lease_token), false
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = ANY (won)
     ORDER BY array_position(won, s.lease_token);
END $$;

