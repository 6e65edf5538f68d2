-- Leases: claim, heartbeat, complete, fail, release, reclaim. Each is one function, so an operator
-- can do from psql exactly what the services do. Tokens fence every step after the claim: a token
-- that is no longer current changes nothing (invariant 2).

-- Keep an executor's heartbeat row counting its live leases (the watchdog tracks only holders).
-- Touching the row also NOTIFYs 'heartbeats'.
CREATE FUNCTION minion_touch_heartbeat(p_executor uuid, p_beat boolean) RETURNS void LANGUAGE sql AS $$
    INSERT INTO heartbeats AS h (executor_id, beat_at, leases)
    VALUES (p_executor, now(),
            (SELECT count(*) FROM subtasks WHERE lease_executor = p_executor AND state = 'leased'))
    ON CONFLICT (executor_id) DO UPDATE
        SET beat_at = CASE WHEN p_beat THEN now() ELSE h.beat_at END,
            leases = excluded.leases
$$;

-- One claim attempt within one filter (a preference tier, or the executor's whole queue).
-- Finds the head task in claim order (priority, then FIFO), then races for one of its first few
-- pending subtasks, chosen at random so that contenders do not all aim at the same row: the
-- paper's INSERT ... ON CONFLICT DO NOTHING on minion_subtask_acquirement picks exactly one winner.
-- Returns the won lease token, or NULL when nothing in this filter is pending.
CREATE FUNCTION minion_claim_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                p_task_name text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    head record;
    candidates integer[];
    sid integer;
    tok uuid;
BEGIN
    FOR round IN 1..64 LOOP
        IF p_team IS NULL THEN
            SELECT q.capability, q.priority, q.task_id INTO head
              FROM unnest(p_caps) AS c(cap)
             CROSS JOIN LATERAL (
                   SELECT s.capability, s.priority, s.task_id FROM subtasks s
                    WHERE s.state = 'pending' AND s.capability = c.cap
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1) q
             ORDER BY q.priority DESC, q.task_id LIMIT 1;
        ELSE
            SELECT q.capability, q.priority, q.task_id INTO head
              FROM unnest(p_caps) AS c(cap)
             CROSS JOIN LATERAL (
                   SELECT s.capability, s.priority, s.task_id FROM subtasks s
                    WHERE s.state = 'pending' AND s.team = p_team AND s.capability = c.cap
                      AND (p_project IS NULL OR s.project = p_project)
                      AND (p_task_name IS NULL OR s.task_name = p_task_name)
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1) q
             ORDER BY q.priority DESC, q.task_id LIMIT 1;
        END IF;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;

        SELECT array_agg(x.subtask_id ORDER BY random()) INTO candidates
          FROM (SELECT s.subtask_id FROM subtasks s
                 WHERE s.state = 'pending' AND s.capability = head.capability
                   AND s.priority = head.priority AND s.task_id = head.task_id
                 ORDER BY s.subtask_id LIMIT 8) x;

        FOREACH sid IN ARRAY coalesce(candidates, '{}') LOOP
            tok := gen_random_uuid();
            INSERT INTO minion_subtask_acquirement
                   (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
            SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, tok
              FROM subtasks s
             WHERE s.task_id = head.task_id AND s.subtask_id = sid AND s.state = 'pending'
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                -- Won the referee. The guard on state covers a winner that finished the subtask
                -- between our snapshot and our insert.
                UPDATE subtasks
                   SET state = 'leased', lease_token = tok, lease_executor = p_executor,
                       leased_at = now(), attempts = attempts + 1
                 WHERE task_id = head.task_id AND subtask_id = sid AND state = 'pending';
                IF FOUND THEN
                    RETURN tok;
                END IF;
                DELETE FROM minion_subtask_acquirement WHERE lease_token = tok;
            END IF;
        END LOOP;
        -- Every candidate went to someone else: look again (each round sees a fresh snapshot).
    END LOOP;
    RETURN NULL;
END $$;

-- The claim: the executor's preferences first, in order, then its whole queue (its token's team,
-- or every team), and only the kind:model pairs it advertised. Returns no row when nothing fits.
CREATE FUNCTION minion_claim(p_executor uuid, p_lease_timeout_s double precision)
RETURNS TABLE (lease_token uuid, expires_at timestamptz, task_id bigint, subtask_id integer,
               attempt integer, team text, project text, task_name text, kind text, model text,
               params jsonb, input_uri text, byte_start bigint, byte_end bigint, records integer,
               output_key text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ex executors%ROWTYPE;
    pref record;
    tok uuid;
    won subtasks%ROWTYPE;
BEGIN
    SELECT * INTO ex FROM executors WHERE id = p_executor;
    IF NOT FOUND OR ex.status = 'offline' THEN
        RETURN;
    END IF;
    FOR pref IN SELECT p.team, p.project, p.task_name FROM executor_preferences p
                 WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 ORDER BY p.position LOOP
        tok := minion_claim_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name);
        EXIT WHEN tok IS NOT NULL;
    END LOOP;
    IF tok IS NULL THEN
        tok := minion_claim_in(p_executor, ex.capabilities, ex.team, NULL, NULL);
    END IF;
    IF tok IS NULL THEN
        RETURN;
    END IF;

    SELECT * INTO won FROM subtasks s WHERE s.lease_token = tok;
    UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
     WHERE id = won.task_id AND status IN ('splitting', 'queued');
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_touch_heartbeat(p_executor, true);

    RETURN QUERY
    SELECT tok, now() + make_interval(secs => p_lease_timeout_s), won.task_id, won.subtask_id,
           won.attempts, won.team::text, won.project::text, won.task_name::text, t.kind, t.model,
           t.params, t.input_uri, won.byte_start, won.byte_end, won.records,
           minion_output_key(won.task_id, won.subtask_id, won.attempts, tok)
      FROM tasks t WHERE t.id = won.task_id;
END $$;

-- Heartbeat: the executor is alive; each token it names is answered ok, lost or cancelled.
CREATE FUNCTION minion_heartbeat(p_executor uuid, p_tokens uuid[])
RETURNS TABLE (lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_touch_heartbeat(p_executor, true);
    RETURN QUERY
    SELECT t.tok,
           CASE WHEN s.state = 'leased' AND s.lease_executor = p_executor THEN 'ok'
                WHEN s.state = 'cancelled' THEN 'cancelled'
                ELSE 'lost' END
      FROM unnest(p_tokens) AS t(tok)
      LEFT JOIN subtasks s ON s.lease_token = t.tok;
END $$;

-- Ends the current attempt of a leased subtask (locked by the caller): history, referee row,
-- then back to pending or failed for good. p_counts: whether the attempt counts towards
-- max_attempts (a release does not).
CREATE FUNCTION minion_end_attempt(s subtasks, p_outcome text, p_error text, p_counts boolean,
                                   p_retry boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_att integer;
BEGIN
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
            p_outcome, p_error);
    DELETE FROM minion_subtask_acquirement WHERE lease_token = s.lease_token;
    SELECT max_attempts INTO max_att FROM tasks WHERE id = s.task_id;

    IF p_retry AND (NOT p_counts OR s.attempts < max_att) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, lease_executor = NULL, leased_at = NULL,
               attempts = attempts - (NOT p_counts)::int,
               last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    ELSE
        UPDATE subtasks
           SET state = 'failed', lease_executor = NULL, done_at = now(),
               last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_subtask_closed(s.task_id, true,
            format('subtask %s failed after %s attempt(s): %s', s.subtask_id, s.attempts,
                   coalesce(p_error, s.last_error)));
    END IF;
    PERFORM minion_touch_heartbeat(s.lease_executor, false);
END $$;

-- Whether a token, looked up (and locked) by its caller, is current: 'ok', 'lost' or 'cancelled'.
CREATE FUNCTION minion_lease_verdict(p_found boolean, p_state text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN NOT p_found THEN 'lost'
                WHEN p_state = 'leased' THEN 'ok'
                WHEN p_state = 'cancelled' THEN 'cancelled'
                ELSE 'lost' END
$$;

-- Commit a result: 'ok', or why not ('lost', 'cancelled', 'records_mismatch'). Exactly one
-- complete per subtask can succeed; a stale token changes nothing.
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    verdict text;
BEGIN
    SELECT * INTO s FROM subtasks WHERE lease_token = p_token FOR UPDATE;
    verdict := minion_lease_verdict(FOUND, s.state);
    IF verdict <> 'ok' THEN
        RETURN verdict;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL,
           output_key = minion_output_key(task_id, subtask_id, attempts, lease_token)
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    DELETE FROM minion_subtask_acquirement WHERE lease_token = p_token;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, p_token, s.leased_at, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false);
    PERFORM minion_touch_heartbeat(s.lease_executor, false);
    RETURN 'ok';
END $$;

-- A failed attempt: requeued while attempts remain and the error is retryable, else failed for
-- good with this error. Returns 'ok', 'lost' or 'cancelled'.
CREATE FUNCTION minion_fail(p_token uuid, p_error text, p_retryable boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    verdict text;
BEGIN
    SELECT * INTO s FROM subtasks WHERE lease_token = p_token FOR UPDATE;
    verdict := minion_lease_verdict(FOUND, s.state);
    IF verdict <> 'ok' THEN
        RETURN verdict;
    END IF;
    PERFORM minion_end_attempt(s, 'failed', p_error, true, p_retryable);
    RETURN 'ok';
END $$;

-- The executor hands the subtask back (owner came back, shutdown): requeued at once, the attempt
-- does not count.
CREATE FUNCTION minion_release(p_token uuid) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    verdict text;
BEGIN
    SELECT * INTO s FROM subtasks WHERE lease_token = p_token FOR UPDATE;
    verdict := minion_lease_verdict(FOUND, s.state);
    IF verdict <> 'ok' THEN
        RETURN verdict;
    END IF;
    PERFORM minion_end_attempt(s, 'released', NULL, false, true);
    RETURN 'ok';
END $$;

-- The watchdog's step: if the executor has really been silent for the lease timeout (checked here,
-- under a row lock, so a heartbeat racing with us wins or loses cleanly), mark it lost and return
-- its subtasks to the queue, or fail those out of attempts. Returns how many subtasks it took back.
CREATE FUNCTION minion_reclaim_executor(p_executor uuid, p_lease_timeout_s double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    n integer := 0;
    silent_s double precision;
BEGIN
    SELECT extract(epoch FROM now() - beat_at) INTO silent_s FROM heartbeats
     WHERE executor_id = p_executor AND beat_at < now() - make_interval(secs => p_lease_timeout_s)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    FOR s IN SELECT * FROM subtasks
              WHERE lease_executor = p_executor AND state = 'leased'
              ORDER BY task_id, subtask_id FOR UPDATE LOOP
        PERFORM minion_end_attempt(s, 'lost',
            format('executor %s lost: no heartbeat for %s s', p_executor, round(silent_s::numeric, 1)),
            true, true);
        n := n + 1;
    END LOOP;
    IF n > 0 THEN
        UPDATE executors SET status = 'lost' WHERE id = p_executor;
    END IF;
    RETURN n;
END $$;

-- The sweep: every silent lease holder, in one call. Returns the subtasks taken back.
CREATE FUNCTION minion_reclaim_expired(p_lease_timeout_s double precision)
RETURNS integer LANGUAGE sql AS $$
    SELECT coalesce(sum(minion_reclaim_executor(h.executor_id, p_lease_timeout_s)), 0)::integer
      FROM heartbeats h
     WHERE h.leases > 0 AND h.beat_at < now() - make_interval(secs => p_lease_timeout_s)
$$;

-- Deregister: hand back every lease, then go offline.
CREATE FUNCTION minion_deregister(p_executor uuid) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    n integer := 0;
BEGIN
    FOR s IN SELECT * FROM subtasks WHERE lease_executor = p_executor AND state = 'leased'
              ORDER BY task_id, subtask_id FOR UPDATE LOOP
        PERFORM minion_end_attempt(s, 'released', NULL, false, true);
        n := n + 1;
    END LOOP;
    UPDATE executors SET status = 'offline' WHERE id = p_executor;
    RETURN n;
END $$;
