-- The batched executor protocol, one statement per step (issue 11): the claim takes up to p_max
-- subtasks and checks the executor against the caller's API token in the same call; the heartbeat
-- does its ownership check in its call too. New functions beside 030's (which stay, unchanged, for
-- psql and older API processes during a rolling upgrade). The lease timeout is the cluster's
-- (minion_lease_timeout_s(), 155), never a parameter.

-- Why an executor may not act, or NULL when it may: p_token_id is the caller's API token (NULL: an
-- admin, who may act for any executor).
CREATE FUNCTION minion_executor_refusal(ex executors, p_token_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ex.id IS NULL THEN 'not_found'
                WHEN p_token_id IS NOT NULL AND ex.token_id IS DISTINCT FROM p_token_id THEN 'not_your_executor'
                END
$$;

-- The claim of up to p_max subtasks: for each, the executor's preferences first, in order, then
-- its whole queue (minion_claim_in, as minion_claim does); with nothing pending and
-- p_backup_factor > 0, one backup of a straggler. Never waits: what is pending now.
-- Rows: one per lease won (verdict 'leased'); else one row whose verdict says why none:
-- 'empty' (nothing fits now: `capabilities` says what to wait for), 'not_found',
-- 'not_your_executor', 'deregistered'. `owner`: the API token of the executor (for later fencing of
-- who may complete).
CREATE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
                                   p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (verdict text, capabilities text[], owner bigint, lease_token uuid, expires_at timestamptz,
               task_id bigint, subtask_id integer, attempt integer, team text, project text,
               task_name text, kind text, model text, params jsonb, input_uri text, byte_start bigint,
               byte_end bigint, records integer, output_key text, backup boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    won uuid[] := '{}';  -- the leases won, in claim order
    backup_tok uuid;
    busy bigint;
    ex executors%ROWTYPE;
    pref record;
    tok uuid;
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := minion_executor_refusal(ex, p_token_id);
    IF verdict IS NULL AND ex.status = 'offline' THEN
        verdict := 'deregistered';
    END IF;
    IF verdict IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- Each claim tries the preferences in order, then the executor's whole queue (its token's team,
    -- or every team): the last filter, after every position.
    WHILE cardinality(won) < greatest(p_max, 1) LOOP
        tok := NULL;
        FOR pref IN (SELECT p.position, p.team, p.project, p.task_name FROM executor_preferences p
                      WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                     UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                     ORDER BY 1 LOOP
            tok := minion_claim_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name);
            EXIT WHEN tok IS NOT NULL;
        END LOOP;
        EXIT WHEN tok IS NULL;
        won := won || tok;
    END LOOP;
    IF cardinality(won) = 0 AND p_backup_factor > 0 THEN
        backup_tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
    END IF;
    IF cardinality(won) = 0 AND backup_tok IS NULL THEN
        verdict := 'empty';
        capabilities := ex.capabilities;
        RETURN NEXT;
        RETURN;
    END IF;

    -- One transaction stamps every lease with the same now(): a microsecond apart instead, so that
    -- the attempts' history (started_at) shows the order they were claimed in (preferences first).
    IF cardinality(won) > 1 THEN
        UPDATE subtasks s SET leased_at = s.leased_at + (array_position(won, s.lease_token) - 1) * interval '1 microsecond'
         WHERE s.lease_token = ANY (won);
    END IF;
    -- In task order, so two claimers never wait on each other's task rows in opposite orders.
    FOR busy IN SELECT DISTINCT s.task_id FROM subtasks s WHERE s.lease_token = ANY (won) ORDER BY 1 LOOP
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = busy AND status IN ('splitting', 'queued');
    END LOOP;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    IF backup_tok IS NOT NULL THEN
        RETURN QUERY
        SELECT 'leased', ex.capabilities, ex.token_id, backup_tok,
               now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
               s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
               s.byte_start, s.byte_end, s.records,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, backup_tok), true
          FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
          JOIN tasks t ON t.id = s.task_id
         WHERE b.lease_token = backup_tok;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'leased', ex.capabilities, ex.token_id, s.lease_token,
           now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
           s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
           s.byte_start, s.byte_end, s.records,
           minion_output_key(s.task_id, s.subtask_id, s.attempts, s.lease_token), false
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = ANY (won) AND s.state = 'leased'
     ORDER BY array_position(won, s.lease_token);
END $$;

-- The heartbeat with its ownership check in the same call: one row (lease_token NULL) whose
-- verdict is 'ok' or why not ('not_found', 'not_your_executor'), then, when 'ok', minion_heartbeat's
-- rows with the cluster's lease timeout as the grace for leases it does not name.
CREATE FUNCTION minion_heartbeat_as(p_executor uuid, p_token_id bigint, p_tokens uuid[])
RETURNS TABLE (verdict text, lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ex executors%ROWTYPE;
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := coalesce(minion_executor_refusal(ex, p_token_id), 'ok');
    RETURN NEXT;
    IF verdict <> 'ok' THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ok', h.lease_token, h.state
                   FROM minion_heartbeat(p_executor, p_tokens, minion_lease_timeout_s()) h;
END $$;

-- Batched complete, fail and release: each lease exactly as its own minion_complete /
-- minion_fail / minion_release would take it (same fencing, same verdicts), all in one statement.
-- The API passes them ordered by (task, subtask), so two batches lock rows in one order.
-- Rows: each token with its verdict, in the order given.
CREATE FUNCTION minion_complete_batch(p_tokens uuid[], p_records integer[], p_seconds double precision[],
                                      p_result_keys text[], p_sha256s bytea[], p_bytes bigint[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_complete(p_tokens[i], p_records[i], p_seconds[i], p_result_keys[i], p_sha256s[i],
                                   p_bytes[i]);
        RETURN NEXT;
    END LOOP;
END $$;

CREATE FUNCTION minion_fail_batch(p_tokens uuid[], p_errors text[], p_retryable boolean[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_fail(p_tokens[i], p_errors[i], p_retryable[i]);
        RETURN NEXT;
    END LOOP;
END $$;

CREATE FUNCTION minion_release_batch(p_tokens uuid[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_release(p_tokens[i]);
        RETURN NEXT;
    END LOOP;
END $$;
