-- Trusted machines and volunteers: every token has an owner (whom it was issued to;
-- itself by default) and an executor token may be vouched for by an admin (trusted). Quorums count
-- owners; a vouched executor's results are never checked and its replica settles a check; volunteers
-- earn trust only by agreeing with a trusted executor; a vouched executor is never quarantined by votes.
ALTER TABLE api_tokens
    ADD COLUMN owner text CHECK (owner IS NULL OR (length(owner) BETWEEN 1 AND 200 AND owner !~ '^token:')),
    ADD COLUMN trusted boolean NOT NULL DEFAULT false;


CREATE OR REPLACE VIEW minion_tokens AS
SELECT id, prefix, role, team::text AS team, label, created_at, expires_at, revoked_at,
       CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
            WHEN expires_at IS NOT NULL AND expires_at <= now() THEN 'expired'
            ELSE 'active' END AS status,
       coalesce(owner, 'token:' || id) AS owner, trusted
  FROM api_tokens;

CREATE OR REPLACE FUNCTION minion_token_owner(p_token_id bigint) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(t.owner, 'token:' || t.id) FROM api_tokens t WHERE t.id = p_token_id
$$;

DROP FUNCTION minion_create_token(bytea, text, text, text, text, double precision);

CREATE FUNCTION minion_create_token(p_hash bytea, p_prefix text, p_role text, p_team text, p_label text,
                                    p_expires_in_s double precision, p_owner text, p_trusted boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    made bigint;
BEGIN
    IF coalesce(p_trusted, false) AND p_role <> 'executor' THEN
        RAISE EXCEPTION 'only an executor token is trusted' USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO api_tokens (token_hash, prefix, role, team, label, expires_at, owner, trusted)
    VALUES (p_hash, p_prefix, p_role, p_team, coalesce(p_label, ''),
            now() + make_interval(secs => p_expires_in_s),   -- NULL seconds: NULL, never expires
            p_owner, coalesce(p_trusted, false))
    ON CONFLICT (token_hash) DO NOTHING
    RETURNING id INTO made;
    RETURN made;
END $$;

CREATE OR REPLACE FUNCTION minion_executor_owner(p_executor uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT minion_token_owner(e.token_id) FROM executors e WHERE e.id = p_executor
$$;

CREATE OR REPLACE FUNCTION minion_executor_vouched(p_executor uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT t.trusted FROM executors e JOIN api_tokens t ON t.id = e.token_id
                      WHERE e.id = p_executor), false)
$$;

CREATE OR REPLACE FUNCTION minion_executor_trusted(p_executor uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT minion_executor_vouched(p_executor)
        OR coalesce((SELECT e.trusted FROM executors e WHERE e.id = p_executor), false)
$$;

DROP FUNCTION minion_replica_executors(text, text, text, uuid[]);

CREATE FUNCTION minion_replica_executors(p_cap text, p_team text, p_fp text, p_not uuid[])
RETURNS TABLE (id uuid, token_id bigint, vouched boolean) LANGUAGE sql STABLE AS $$
    SELECT e.id, e.token_id, t.trusted FROM executors e JOIN heartbeats h ON h.executor_id = e.id
      JOIN api_tokens t ON t.id = e.token_id
     WHERE e.status = 'online' AND e.quarantined_at IS NULL AND p_cap = ANY (e.capabilities)
       AND NOT (e.id = ANY (p_not))
       AND coalesce(t.owner, 'token:' || t.id) <> ALL (ARRAY(SELECT minion_executor_owner(x) FROM unnest(p_not) x))
       AND (e.team IS NULL OR e.team = p_team)
       AND h.alive_at > now() - make_interval(secs => minion_lease_timeout_s())
       AND (p_fp IS NULL OR p_cap = 'sleep:*' OR minion_executor_fingerprint(e.id, p_cap) = p_fp)
$$;

CREATE OR REPLACE FUNCTION minion_replica_allowed(p_executor uuid, p_token_id bigint, p_task_id bigint, p_subtask_id integer,
                                       p_cap text, p_team text, p_fp text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH held AS (SELECT c.executor_id FROM subtask_checks c
                   WHERE c.task_id = p_task_id AND c.subtask_id = p_subtask_id)
    SELECT minion_token_owner(p_token_id) <> ALL (ARRAY(SELECT minion_executor_owner(executor_id) FROM held))
       AND (minion_executor_vouched(p_executor)
            OR NOT EXISTS (SELECT 1 FROM minion_replica_executors(p_cap, p_team, p_fp,
                                                                   ARRAY(SELECT executor_id FROM held)) o
                            WHERE o.vouched))
$$;

CREATE OR REPLACE FUNCTION minion_executors_voted(p_agreed uuid[], p_outvoted uuid[], p_task_id bigint, p_subtask_id integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e executors%ROWTYPE;
BEGIN
    PERFORM 1 FROM executors WHERE id = ANY (p_agreed || p_outvoted) ORDER BY id FOR UPDATE;
    FOR e IN UPDATE executors SET agreements = agreements + 1
              WHERE id = ANY (p_agreed) AND quarantined_at IS NULL RETURNING * LOOP
        IF NOT e.trusted AND minion_executor_earns_trust(e.id, e.agreements) THEN
            UPDATE executors SET trusted = true WHERE id = e.id;
        END IF;
    END LOOP;
    UPDATE executors SET disagreements = disagreements + 1, trusted = false, agreements = 0
     WHERE id = ANY (p_outvoted);
    -- A vouched executor is never quarantined by votes (none of its results is checked, and its own
    -- vote settles a check: no quorum can outvote it); an admin's word put it there.
    UPDATE executors
       SET quarantined_at = now(), quarantine_settled = false,
           quarantine_reason = format('outvoted %s times by other executors'' results (last: task %s, subtask %s)',
                                      disagreements, p_task_id, p_subtask_id)
     WHERE id = ANY (p_outvoted) AND quarantined_at IS NULL AND NOT minion_executor_vouched(id)
       AND disagreements >= minion_trust_setting('quarantine_after', 2);
END $$;

CREATE OR REPLACE FUNCTION minion_check_vote(p_token uuid, p_records integer, p_seconds double precision,
                                  p_result_key text, p_sha256 bytea, p_bytes bigint, p_result_data bytea,
                                  p_dimension integer, p_agrees_with smallint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    w subtask_checks%ROWTYPE;
    l subtask_checks%ROWTYPE;
    n integer;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role <> 'replica' THEN
        RETURN CASE WHEN role = 'held' THEN 'repeat' ELSE role END;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    SELECT count(*) INTO n FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;

    IF p_agrees_with IS NOT NULL THEN
        SELECT * INTO w FROM subtask_checks
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = p_agrees_with;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'subtask %/% has no candidate of round %', s.task_id, s.subtask_id, p_agrees_with
                USING ERRCODE = 'check_violation';
        END IF;
        SELECT * INTO l FROM subtask_checks
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round <> p_agrees_with;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'agreed',
                p_records, p_seconds);
        -- The quorum stands whatever happens to the result: the loser is blamed. Trust is earned only
        -- by agreeing with a trusted executor (vouched, or trusted so already): two strangers agreeing
        -- earn nothing. A completion replica was shown the held results to verify their proofs (it
        -- could echo them without work), so its agreement earns it nothing: trust comes from one's own
        -- results agreed with.
        PERFORM minion_executors_voted(CASE WHEN minion_executor_trusted(b.executor_id) THEN ARRAY[w.executor_id]
                                            ELSE '{}'::uuid[] END
                                       || CASE WHEN s.capability LIKE 'completion:%'
                                                    OR NOT minion_executor_trusted(w.executor_id) THEN '{}'::uuid[]
                                               ELSE ARRAY[b.executor_id] END,
                                       CASE WHEN l.lease_token IS NULL THEN '{}'::uuid[] ELSE ARRAY[l.executor_id] END,
                                       s.task_id, s.subtask_id);
        IF l.lease_token IS NOT NULL THEN
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'its result was outvoted 2 to 1'
             WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = l.lease_token
               AND outcome = 'candidate';
            DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = l.round;
        END IF;
        IF NOT minion_commit_candidate(s, w, 'done', NULL) THEN
            -- The agreed vectors' length is not the one a committed result fixed (a liar's, revoked
            -- when its quarantine is settled): the subtask runs again.
            PERFORM minion_recheck_subtask(s, 'the agreed vectors'' length is not the task''s');
        END IF;
        RETURN 'agreed';
    END IF;

    IF minion_executor_vouched(b.executor_id) THEN
        -- The trusted voice: a vouched replica that agrees with no candidate settles the check with
        -- its own result; every candidate is outvoted (and blamed).
        PERFORM minion_executors_voted('{}'::uuid[],
                                       ARRAY(SELECT c.executor_id FROM subtask_checks c
                                              WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id),
                                       s.task_id, s.subtask_id);
        UPDATE subtask_attempts a SET outcome = 'outvoted', error = 'a trusted executor''s result differs'
          FROM subtask_checks c
         WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
           AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id AND a.lease_token = c.lease_token
           AND a.outcome = 'candidate';
        DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        VALUES (s.task_id, s.subtask_id, 1, p_token, b.executor_id, s.attempts,
                minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
                p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, b.leased_at)
        RETURNING * INTO w;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'candidate',
                p_records, p_seconds);
        IF NOT minion_commit_candidate(s, w, 'done', NULL) THEN
            PERFORM minion_recheck_subtask(s, 'the trusted executor''s vectors'' length is not the task''s');
        END IF;
        RETURN 'settled';
    END IF;

    IF n = 1 THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        SELECT s.task_id, s.subtask_id, 3 - c.round, p_token, b.executor_id, s.attempts,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
               p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, b.leased_at
          FROM subtask_checks c WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'candidate',
                p_records, p_seconds);
        RETURN 'disputed';  -- still checking, no replica: offered to a third executor
    END IF;

    -- Three different answers: no majority, no one to blame. Run it again.
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'outvoted',
            'no two results agreed', p_records, p_seconds);
    PERFORM minion_recheck_subtask(s, 'no two results agreed');
    RETURN 'no_quorum';
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
                                   ELSE coalesce(minion_team_spot_check_share(s.team::text, team_shares), share) END
               AND (minion_checkable(t.kind, t.params) OR minion_executor_proves(p_executor, s.capability))
               AND EXISTS (SELECT 1 FROM minion_replica_executors(s.capability, s.team::text, t.fingerprint,
                                                                  ARRAY[p_executor]));
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
