-- Leases: claim, heartbeat, complete, fail, release, reclaim. Each is one function, so an operator
-- can do from psql exactly what the services do. Tokens fence every step after the claim: a token
-- that is no longer current changes nothing (invariant 2).

-- Live leases of an executor: its leased subtasks and its straggler backups.
CREATE FUNCTION minion_lease_count(p_executor uuid) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT ((SELECT count(*) FROM subtasks WHERE lease_executor = p_executor AND state = 'leased')
          + (SELECT count(*) FROM subtask_backups WHERE executor_id = p_executor))::integer
$$;

-- A heartbeat (or a registration): the executor is alive. NOTIFYs 'heartbeats' via the trigger.
CREATE FUNCTION minion_beat(p_executor uuid) RETURNS void LANGUAGE sql AS $$
    INSERT INTO heartbeats AS h (executor_id, beat_at, seen_at) VALUES (p_executor, now(), now())
    ON CONFLICT (executor_id) DO UPDATE SET beat_at = now()
$$;

-- A claim: the executor is alive too, but this must not notify (see 010_notify.sql).
CREATE FUNCTION minion_seen(p_executor uuid) RETURNS void LANGUAGE sql AS $$
    UPDATE heartbeats SET seen_at = now() WHERE executor_id = p_executor
$$;

-- One claim within one filter (a preference tier, or the executor's whole queue): the first
-- pending subtask in claim order (priority, then FIFO) among the capabilities the executor serves.
-- Contenders take row locks with SKIP LOCKED, so they pass over each other's rows instead of
-- queueing behind them (bench/claim.py measured the paper's blocking INSERT race against this;
-- see BENCHMARKS.md). The paper's referee stays: the lease is a row of minion_subtask_acquirement,
-- whose UNIQUE key admits one live lease per subtask whatever path tries to make a second.
-- Returns the won lease token, or NULL when nothing in this filter is pending.
CREATE FUNCTION minion_claim_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                p_task_name text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    t record;
    found_one boolean := false;
    tok uuid := gen_random_uuid();
BEGIN
    IF p_team IS NULL THEN
        SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
          FROM unnest(p_caps) AS c(cap)
         CROSS JOIN LATERAL (
               SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                WHERE s.state = 'pending' AND s.capability = c.cap
                ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                  FOR UPDATE SKIP LOCKED) q
         ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
        found_one := FOUND;
    ELSIF p_project IS NULL THEN
        SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
          FROM unnest(p_caps) AS c(cap)
         CROSS JOIN LATERAL (
               SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                WHERE s.state = 'pending' AND s.team = p_team AND s.capability = c.cap
                ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                  FOR UPDATE SKIP LOCKED) q
         ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
        found_one := FOUND;
    ELSE
        -- A project or a task: through its few open task rows, each an O(log n) probe of the
        -- queue index (capability, priority and task are all known).
        FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap FROM tasks
                  WHERE team = p_team AND project = p_project
                    AND (p_task_name IS NULL OR name = p_task_name)
                    AND NOT (status IN ('completed', 'failed', 'cancelled'))
                  ORDER BY priority DESC, id LOOP
            CONTINUE WHEN NOT (t.cap = ANY (p_caps));
            SELECT s.task_id, s.subtask_id, s.team, s.project, s.task_name INTO cand FROM subtasks s
             WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority AND s.task_id = t.id
             ORDER BY s.subtask_id LIMIT 1
               FOR UPDATE SKIP LOCKED;
            found_one := FOUND;
            EXIT WHEN found_one;
        END LOOP;
    END IF;
    IF NOT found_one THEN
        RETURN NULL;
    END IF;

    INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
    VALUES (cand.team, cand.project, cand.task_name, cand.subtask_id, cand.task_id, p_executor, tok);
    UPDATE subtasks
       SET state = 'leased', lease_token = tok, lease_executor = p_executor, leased_at = now(),
           attempts = attempts + 1
     WHERE task_id = cand.task_id AND subtask_id = cand.subtask_id;
    RETURN tok;
END $$;

-- A backup of a straggler: a lease of a task with nothing left pending that has run longer than
-- p_factor times the median of the task's finished attempts (at least three of them). The oldest
-- such lease first. Returns the backup's token, or NULL.
CREATE FUNCTION minion_claim_backup(p_executor uuid, p_caps text[], p_team text, p_factor double precision)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    FOR cand IN
        WITH leased AS (
            -- Few rows: one per busy executor (partial index subtasks_leased_at).
            SELECT s.task_id, s.subtask_id, s.leased_at, s.capability, s.priority FROM subtasks s
             WHERE s.state = 'leased' AND s.capability = ANY (p_caps)
               AND (p_team IS NULL OR s.team = p_team) AND s.lease_executor <> p_executor
        ), tails AS (
            -- Tasks with nothing left pending: the only ones whose stragglers hold up the end.
            SELECT DISTINCT l.task_id FROM leased l
             WHERE NOT EXISTS (SELECT 1 FROM subtasks p
                                WHERE p.state = 'pending' AND p.capability = l.capability
                                  AND p.priority = l.priority AND p.task_id = l.task_id)
        ), thresholds AS (
            -- Once per task, over its latest 1,000 finished attempts: bounded, whatever its size.
            SELECT t.task_id, p_factor * make_interval(secs => m.median_s) AS too_long
              FROM tails t
             CROSS JOIN LATERAL (
                   SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.secs) AS median_s, count(*) AS n
                     FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) AS secs
                             FROM subtask_attempts a
                            WHERE a.task_id = t.task_id AND a.outcome = 'done'
                            ORDER BY a.ended_at DESC LIMIT 1000) x) m
             WHERE m.n >= 3
        )
        SELECT l.task_id, l.subtask_id FROM leased l JOIN thresholds th ON th.task_id = l.task_id
         WHERE now() - l.leased_at > th.too_long
           AND NOT EXISTS (SELECT 1 FROM subtask_backups b
                            WHERE b.task_id = l.task_id AND b.subtask_id = l.subtask_id)
         ORDER BY l.leased_at
         LIMIT 4
    LOOP
        -- Lock the subtask so a completion racing with us either finishes first (we skip it) or
        -- sees our backup row.
        PERFORM 1 FROM subtasks
          WHERE task_id = cand.task_id AND subtask_id = cand.subtask_id AND state = 'leased'
          FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tok := gen_random_uuid();
        INSERT INTO subtask_backups (task_id, subtask_id, lease_token, executor_id)
        VALUES (cand.task_id, cand.subtask_id, tok, p_executor)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- The claim: the executor's preferences first, in order, then its whole queue (its token's team,
-- or every team), and only the kind:model pairs it advertised; with nothing pending and
-- p_backup_factor > 0, a backup of a straggler. Returns no row when nothing fits.
CREATE FUNCTION minion_claim(p_executor uuid, p_lease_timeout_s double precision,
                             p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (lease_token uuid, expires_at timestamptz, task_id bigint, subtask_id integer,
               attempt integer, team text, project text, task_name text, kind text, model text,
               params jsonb, input_uri text, byte_start bigint, byte_end bigint, records integer,
               output_key text, backup boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ex executors%ROWTYPE;
    pref record;
    tok uuid;
    is_backup boolean := false;
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
    IF tok IS NULL AND p_backup_factor > 0 THEN
        tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
        is_backup := tok IS NOT NULL;
    END IF;
    IF tok IS NULL THEN
        RETURN;
    END IF;

    IF is_backup THEN
        SELECT s.* INTO won FROM subtasks s JOIN subtask_backups b USING (task_id, subtask_id)
         WHERE b.lease_token = tok;
    ELSE
        SELECT * INTO won FROM subtasks s WHERE s.lease_token = tok;
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = won.task_id AND status IN ('splitting', 'queued');
    END IF;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    RETURN QUERY
    SELECT tok, now() + make_interval(secs => p_lease_timeout_s), won.task_id, won.subtask_id,
           won.attempts, won.team::text, won.project::text, won.task_name::text, t.kind, t.model,
           t.params, t.input_uri, won.byte_start, won.byte_end, won.records,
           minion_output_key(won.task_id, won.subtask_id, won.attempts, tok), is_backup
      FROM tasks t WHERE t.id = won.task_id;
END $$;

-- Heartbeat: the executor is alive; each token it names (a lease or a backup) is answered ok, lost
-- or cancelled. A heartbeat names every lease its executor holds, so a lease of this executor that
-- it leaves out, and that is older than p_grace_s (a fresh lease may not have reached it yet), is
-- one it never received (the claim's answer was lost on the wire) or forgot: ended as lost and
-- requeued, as a silent executor's would be. NULL p_grace_s: no such check.
CREATE FUNCTION minion_heartbeat(p_executor uuid, p_tokens uuid[], p_grace_s double precision DEFAULT NULL)
RETURNS TABLE (lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s subtasks;
    tok uuid;
    forgotten text := 'executor no longer names this lease in its heartbeats (it never received it, or lost it)';
BEGIN
    -- A lost executor that beats again is back; a deregistered one stays offline until it registers.
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status = 'lost';
    PERFORM minion_beat(p_executor);
    IF p_grace_s IS NOT NULL THEN
        FOR s IN SELECT * FROM subtasks sub
                  WHERE sub.lease_executor = p_executor AND sub.state = 'leased'
                    AND sub.leased_at < now() - make_interval(secs => p_grace_s)
                    AND NOT (sub.lease_token = ANY (p_tokens))
                  ORDER BY sub.task_id, sub.subtask_id FOR UPDATE LOOP
            PERFORM minion_end_attempt(s, 'lost', forgotten, true, true);
        END LOOP;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.executor_id = p_executor
                      AND b.leased_at < now() - make_interval(secs => p_grace_s)
                      AND NOT (b.lease_token = ANY (p_tokens)) LOOP
            PERFORM minion_end_backup(tok, 'lost', forgotten);
        END LOOP;
    END IF;
    RETURN QUERY
    SELECT t.tok,
           CASE WHEN s2.state = 'leased' AND s2.lease_executor = p_executor THEN 'ok'
                WHEN bs.state = 'leased' AND b.executor_id = p_executor THEN 'ok'
                WHEN s2.state = 'cancelled' THEN 'cancelled'
                ELSE 'lost' END
      FROM unnest(p_tokens) AS t(tok)
      LEFT JOIN subtasks s2 ON s2.lease_token = t.tok
      LEFT JOIN subtask_backups b ON b.lease_token = t.tok
      LEFT JOIN subtasks bs ON bs.task_id = b.task_id AND bs.subtask_id = b.subtask_id;
END $$;

-- Ends the current attempt of a leased subtask (locked by the caller): history, referee row,
-- then back to pending or failed for good. p_counts: whether the attempt counts towards
-- max_attempts (a release does not).
CREATE FUNCTION minion_end_attempt(s subtasks, p_outcome text, p_error text, p_counts boolean,
                                   p_retry boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_att integer;
    backup subtask_backups%ROWTYPE;
BEGIN
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
            p_outcome, p_error);

    -- A running backup takes over the lease: its work goes on, nothing is requeued.
    SELECT * INTO backup FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    IF FOUND THEN
        DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE subtasks
           SET lease_token = backup.lease_token, lease_executor = backup.executor_id,
               leased_at = backup.leased_at, last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE minion_subtask_acquirement SET executor_id = backup.executor_id, lease_token = backup.lease_token
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        RETURN;
    END IF;

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
END $$;

-- Ends a backup (failed, released, lost): the primary lease goes on as if nothing happened.
CREATE FUNCTION minion_end_backup(p_token uuid, p_outcome text, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b subtask_backups%ROWTYPE;
    att integer;
BEGIN
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT attempts INTO att FROM subtasks WHERE task_id = b.task_id AND subtask_id = b.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (b.task_id, b.subtask_id, att, b.executor_id, b.lease_token, b.leased_at, p_outcome, p_error);
END $$;

-- Locks the subtask a token names, as its lease or as its backup (a NULL row when neither).
CREATE FUNCTION minion_lock_subtask_of(p_token uuid) RETURNS subtasks LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
BEGIN
    SELECT * INTO s FROM subtasks WHERE lease_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        SELECT sub.* INTO s FROM subtasks sub
          JOIN subtask_backups b ON b.task_id = sub.task_id AND b.subtask_id = sub.subtask_id
         WHERE b.lease_token = p_token
           FOR UPDATE OF sub;
    END IF;
    RETURN s;
END $$;

-- What a token is for the subtask it names (locked by the caller): 'primary' or 'backup' while
-- current, else 'cancelled' or 'lost'.
CREATE FUNCTION minion_token_role(s subtasks, p_token uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.task_id IS NULL THEN 'lost'
                WHEN s.state = 'cancelled' AND s.lease_token = p_token THEN 'cancelled'
                WHEN s.state <> 'leased' THEN 'lost'
                WHEN s.lease_token = p_token THEN 'primary'
                WHEN EXISTS (SELECT 1 FROM subtask_backups b
                              WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                AND b.lease_token = p_token) THEN 'backup'
                ELSE 'lost' END
$$;

-- A live lease (or backup), for the API before it acts on it: the API token of the executor
-- holding it, and the object it must have written before it may complete. No row when the token
-- is no longer current.
CREATE FUNCTION minion_lease_info(p_token uuid, OUT owner bigint, OUT output_key text)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token)
      FROM subtasks s JOIN executors e ON e.id = s.lease_executor
     WHERE s.lease_token = p_token AND s.state = 'leased'
    UNION ALL
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token)
      FROM subtask_backups b
      JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
      JOIN executors e ON e.id = b.executor_id
     WHERE b.lease_token = p_token AND s.state = 'leased'
    LIMIT 1
$$;

-- Commit a result: 'ok', or why not ('lost', 'cancelled', 'records_mismatch'). Exactly one
-- complete per subtask can succeed (a straggler's or its backup's); a stale token changes nothing.
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    winner_executor uuid;
    winner_started timestamptz;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'lost' AND s.state = 'done' AND s.lease_token = p_token THEN
        RETURN 'ok';  -- this very lease committed already: a retried complete is answered the same
    END IF;
    IF role NOT IN ('primary', 'backup') THEN
        RETURN role;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id RETURNING * INTO b;
    IF role = 'primary' THEN
        winner_executor := s.lease_executor;
        winner_started := s.leased_at;
        IF b.lease_token IS NOT NULL THEN
            INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                          started_at, outcome)
            VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at,
                    'superseded');
        END IF;
    ELSE
        winner_executor := b.executor_id;
        winner_started := b.leased_at;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                      started_at, outcome)
        VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
                'superseded');
    END IF;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = p_token,
           output_key = minion_output_key(task_id, subtask_id, attempts, p_token)
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;

-- Ends the lease a token names, as primary or backup: 'ok', or 'lost' / 'cancelled' when the
-- token is no longer current. p_counts, p_retry: see minion_end_attempt (a backup just ends).
CREATE FUNCTION minion_end_lease(p_token uuid, p_outcome text, p_error text, p_counts boolean,
                                 p_retry boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'primary' THEN
        PERFORM minion_end_attempt(s, p_outcome, p_error, p_counts, p_retry);
    ELSIF role = 'backup' THEN
        PERFORM minion_end_backup(p_token, p_outcome, p_error);
    ELSE
        RETURN role;
    END IF;
    RETURN 'ok';
END $$;

-- A failed attempt: requeued while attempts remain and the error is retryable, else failed for
-- good with this error. Returns 'ok', 'lost' or 'cancelled'.
CREATE FUNCTION minion_fail(p_token uuid, p_error text, p_retryable boolean)
RETURNS text LANGUAGE sql AS $$
    SELECT minion_end_lease(p_token, 'failed', p_error, true, p_retryable)
$$;

-- The executor hands the subtask back (owner came back, shutdown): requeued at once, the attempt
-- does not count.
CREATE FUNCTION minion_release(p_token uuid) RETURNS text LANGUAGE sql AS $$
    SELECT minion_end_lease(p_token, 'released', NULL, false, true)
$$;

-- Ends every lease and backup an executor holds, in a fixed order (no deadlocks between two
-- callers). Returns how many.
CREATE FUNCTION minion_end_executor_leases(p_executor uuid, p_outcome text, p_error text, p_counts boolean)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    tok uuid;
    n integer := 0;
BEGIN
    FOR s IN SELECT * FROM subtasks
              WHERE lease_executor = p_executor AND state = 'leased'
              ORDER BY task_id, subtask_id FOR UPDATE LOOP
        PERFORM minion_end_attempt(s, p_outcome, p_error, p_counts, true);
        n := n + 1;
    END LOOP;
    FOR tok IN SELECT b.lease_token FROM subtask_backups b WHERE b.executor_id = p_executor LOOP
        PERFORM minion_end_backup(tok, p_outcome, p_error);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- The watchdog's step: if the executor has really been silent for the lease timeout (checked here,
-- under a row lock, so a heartbeat racing with us wins or loses cleanly), mark it lost and return
-- its subtasks to the queue, or fail those out of attempts. Returns how many subtasks it took back.
CREATE FUNCTION minion_reclaim_executor(p_executor uuid, p_lease_timeout_s double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    silent_s double precision;
BEGIN
    SELECT extract(epoch FROM now() - alive_at) INTO silent_s FROM heartbeats
     WHERE executor_id = p_executor AND alive_at < now() - make_interval(secs => p_lease_timeout_s)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    n := minion_end_executor_leases(p_executor, 'lost',
        format('executor %s lost: no heartbeat for %s s', p_executor, round(silent_s::numeric, 1)), true);
    IF n > 0 THEN
        UPDATE executors SET status = 'lost' WHERE id = p_executor;
    END IF;
    RETURN n;
END $$;

-- Executors that hold a lease or a backup (the only ones the watchdog watches).
CREATE FUNCTION minion_lease_holders() RETURNS TABLE (executor_id uuid) LANGUAGE sql STABLE AS $$
    SELECT lease_executor FROM subtasks WHERE state = 'leased'
    UNION
    SELECT executor_id FROM subtask_backups
$$;

-- The sweep: every silent lease holder, in one call. Returns the subtasks taken back.
CREATE FUNCTION minion_reclaim_expired(p_lease_timeout_s double precision)
RETURNS integer LANGUAGE sql AS $$
    SELECT coalesce(sum(minion_reclaim_executor(h.executor_id, p_lease_timeout_s)), 0)::integer
      FROM heartbeats h
     WHERE h.alive_at < now() - make_interval(secs => p_lease_timeout_s)
       AND h.executor_id IN (SELECT executor_id FROM minion_lease_holders())
$$;

-- Deregister: hand back every lease, then go offline.
CREATE FUNCTION minion_deregister(p_executor uuid) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    n := minion_end_executor_leases(p_executor, 'released', NULL, false);
    UPDATE executors SET status = 'offline' WHERE id = p_executor;
    RETURN n;
END $$;
