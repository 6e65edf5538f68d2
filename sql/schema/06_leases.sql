-- Leases: claim, heartbeat, complete, fail, release, reclaim. Each is one function, so an operator
-- can do from psql exactly what the services do. Tokens fence every step after the claim: a token
-- that is no longer current changes nothing (invariant 2). The batched steps (minion_claim_batch,
-- minion_complete_batch, minion_fail_batch, minion_release_batch, minion_heartbeat_as) are what the
-- API runs: one statement per step, the caller's API token checked in the same call.

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

-- A claim: the executor is alive too, but this must not notify (see notify.sql).
CREATE FUNCTION minion_seen(p_executor uuid) RETURNS void LANGUAGE sql AS $$
    UPDATE heartbeats SET seen_at = now() WHERE executor_id = p_executor
$$;

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

-- Ends the current attempt of a leased subtask (locked by the caller): history, referee row,
-- then back to pending or failed for good. p_counts: whether the attempt counts towards
-- max_attempts (a release does not).
--
-- A volunteer's word alone never fails a subtask for good while checks are on
-- (minions.trust_agreements > 0): its non-retryable failure is retried, and of one owner's failed or
-- lost attempts of a subtask only the first counts towards max_attempts. One hostile executor failed
-- any task it could claim with one non-retryable failure, or with three leases it dropped from its
-- heartbeats; now it takes as many owners as max_attempts (or a vouched executor's word).
CREATE FUNCTION minion_end_attempt(s subtasks, p_outcome text, p_error text, p_counts boolean,
                                   p_retry boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_att integer;
    backup subtask_backups%ROWTYPE;
    counts boolean := p_counts;
    retry boolean := p_retry;
BEGIN
    IF (counts OR NOT retry) AND p_outcome IN ('failed', 'lost') AND minion_trust_setting('trust_agreements', 0) > 0
       AND NOT minion_executor_vouched(s.lease_executor) THEN
        retry := true;
        counts := counts AND NOT EXISTS (
            SELECT 1 FROM subtask_attempts a
             WHERE a.task_id = s.task_id AND a.subtask_id = s.subtask_id AND a.outcome IN ('failed', 'lost')
               AND minion_executor_owner(a.executor_id) = minion_executor_owner(s.lease_executor));
    END IF;
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

    IF retry AND (NOT counts OR s.attempts < max_att) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, lease_executor = NULL, leased_at = NULL,
               attempts = attempts - (NOT counts)::int,
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

-- Ends the lease a token names, as primary or backup: 'ok', or 'lost' / 'cancelled' when the
-- token is no longer current. p_counts, p_retry: see minion_end_attempt (a backup just ends). A held
-- candidate's token ends nothing; a replica ends as a backup, which re-offers its subtask.
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
    ELSIF role IN ('backup', 'replica') THEN
        PERFORM minion_end_backup(p_token, p_outcome, p_error);
    ELSIF role = 'held' THEN
        RETURN 'lost';
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

-- The watchdog's reclaims at the cluster's lease timeout. The two-argument versions take an explicit
-- timeout (tests, an operator's manual reclaim); these delegate to them.
CREATE FUNCTION minion_reclaim_executor(p_executor uuid) RETURNS integer LANGUAGE sql AS $$
    SELECT minion_reclaim_executor(p_executor, minion_lease_timeout_s())
$$;

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

CREATE FUNCTION minion_reclaim_expired() RETURNS integer LANGUAGE sql AS $$
    SELECT minion_reclaim_expired(minion_lease_timeout_s())
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

-- Why an executor may not act, or NULL when it may: p_token_id is the caller's API token (NULL: an
-- admin, who may act for any executor).
CREATE FUNCTION minion_executor_refusal(ex executors, p_token_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ex.id IS NULL THEN 'not_found'
                WHEN p_token_id IS NOT NULL AND ex.token_id IS DISTINCT FROM p_token_id THEN 'not_your_executor'
                END
$$;

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

CREATE FUNCTION minion_release_batch(p_tokens uuid[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_release(p_tokens[i]);
        RETURN NEXT;
    END LOOP;
END $$;

-- Whether this transaction is inside a batch that decides its tasks' ends itself, at its end
-- (minion_settle_after_batch): a transaction-local setting, so an error, a rollback or the
-- transaction's end clears it.
CREATE FUNCTION minion_settle_deferred() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('minions.settle_deferred', true), '') = 'on'
$$;

-- The tasks of a batch's tokens (leases and backups), in task order: read before the batch ends them
-- (a subtask's task never changes).
CREATE FUNCTION minion_tasks_of_tokens(p_tokens uuid[]) RETURNS bigint[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT x.task_id ORDER BY x.task_id), '{}')
      FROM (SELECT s.task_id FROM subtasks s WHERE s.lease_token = ANY (p_tokens)
            UNION ALL
            SELECT b.task_id FROM subtask_backups b WHERE b.lease_token = ANY (p_tokens)) x
$$;

-- Starts a batch whose closes defer their task's end (see minion_task_try_settle).
CREATE FUNCTION minion_defer_settle() RETURNS void LANGUAGE sql AS $$
    SELECT set_config('minions.settle_deferred', 'on', true)
$$;

-- Ends it: each task of the batch decided once, in task order (as a close would, after its last one).
CREATE FUNCTION minion_settle_after_batch(p_task_ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tid bigint;
BEGIN
    PERFORM set_config('minions.settle_deferred', '', true);
    FOREACH tid IN ARRAY p_task_ids LOOP
        PERFORM minion_task_try_settle(tid);
    END LOOP;
END $$;

CREATE FUNCTION minion_fail_batch(p_tokens uuid[], p_errors text[], p_retryable boolean[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_fail(p_tokens[i], p_errors[i], p_retryable[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;

CREATE FUNCTION minion_drop_referee_row(p_token uuid) RETURNS void
LANGUAGE sql SET enable_seqscan = off AS $$
    DELETE FROM minion_subtask_acquirement WHERE lease_token = p_token
$$;

-- One claim within one filter (a preference tier, or the executor's whole queue): the first
-- pending subtask in claim order (priority, then FIFO) among the capabilities the executor serves.
-- Contenders take row locks with SKIP LOCKED, so they pass over each other's rows instead of
-- queueing behind them (bench/claim.py measures the paper's blocking INSERT race against this).
-- The paper's referee stays: the lease is a row of minion_subtask_acquirement, whose UNIQUE key
-- admits one live lease per subtask whatever path tries to make a second. Each capability's probe
-- passes over tasks pinned to another fingerprint, and the subtask found is taken only once its
-- task is pinned to this executor's (minion_claim_pin_tasks).
-- Returns the won lease token, or NULL when nothing in this filter is pending.
CREATE FUNCTION minion_claim_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                           p_task_name text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    t record;
    found_one boolean := false;
    tok uuid := gen_random_uuid();
    fps text[] := ARRAY(SELECT minion_executor_fingerprint(p_executor, c) FROM unnest(p_caps) AS c);
    vouched boolean := minion_executor_vouched(p_executor);  -- may take tasks placed on trusted executors
BEGIN
    -- A second probe only after a lost pin race (the task is pinned to another fingerprint now).
    FOR pass IN 1 .. 2 LOOP
        found_one := false;
        IF p_team IS NULL THEN
            SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
              FROM unnest(p_caps, fps) AS c(cap, fp)
             CROSS JOIN LATERAL (
                   SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                    WHERE s.state = 'pending' AND s.capability = c.cap
                      AND (c.fp IS NULL
                           OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), c.fp) = c.fp)
                      AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSIF p_project IS NULL THEN
            SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
              FROM unnest(p_caps, fps) AS c(cap, fp)
             CROSS JOIN LATERAL (
                   SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                    WHERE s.state = 'pending' AND s.team = p_team AND s.capability = c.cap
                      AND (c.fp IS NULL
                           OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), c.fp) = c.fp)
                      AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSE
            -- A project or a task: through its few open task rows, each an O(log n) probe of the
            -- queue index (capability, priority and task are all known).
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint, placement FROM tasks
                      WHERE team = p_team AND project = p_project
                        AND (p_task_name IS NULL OR name = p_task_name)
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY priority DESC, id LOOP
                CONTINUE WHEN NOT (t.cap = ANY (p_caps));
                CONTINUE WHEN t.placement = 'trusted' AND NOT vouched;
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
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
        EXIT WHEN cardinality(minion_claim_pin_tasks(p_executor, ARRAY[cand.task_id])) = 0;
        found_one := false;
    END LOOP;
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

-- A second run of a subtask in state p_state (a straggler's backup, a checking subtask's replica)
-- for p_executor: its backup row, taken under the subtask's lock, so a completion racing with it
-- either finishes first (skipped) or sees the row. Its token, or NULL when the subtask moved on or
-- another executor took its second run first.
CREATE FUNCTION minion_take_second_run(p_task_id bigint, p_subtask_id integer, p_state text, p_executor uuid)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    tok uuid := gen_random_uuid();
BEGIN
    PERFORM 1 FROM subtasks
      WHERE task_id = p_task_id AND subtask_id = p_subtask_id AND state = p_state
      FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO subtask_backups (task_id, subtask_id, lease_token, executor_id)
    VALUES (p_task_id, p_subtask_id, tok, p_executor)
    ON CONFLICT DO NOTHING;
    RETURN CASE WHEN FOUND THEN tok END;
END $$;

-- How long a subtask of p_records records of task p_task_id usually runs (wall time, lease to
-- commit): the median per record over the task's latest 1,000 finished attempts, at least 3 of them;
-- else over those of its kind and model among the latest 1,000 attempts to end anywhere (a bounded
-- look, whatever the history's size: a task's first stragglers and hangers are measured against its
-- kind's pace, not waited on); NULL when neither has 3.
CREATE FUNCTION minion_typical_run_s(p_task_id bigint, p_records integer) RETURNS double precision
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
                         WHERE r.outcome = 'done' ORDER BY r.ended_at DESC LIMIT 1000) a
                  JOIN tasks k ON k.id = a.task_id
                  JOIN tasks me ON me.id = p_task_id AND me.kind = k.kind AND me.model = k.model) x;
    END IF;
    RETURN CASE WHEN n >= 3 THEN per * greatest(p_records, 1) END;
END $$;

-- A backup of a straggler: a lease of a task with nothing left pending that has run longer than
-- p_factor times a typical run of its size (minion_typical_run_s: the task's, else its kind's),
-- taken only by an executor of the task's fingerprint (a backed-up task has leases, so it is
-- pinned). The oldest such lease first. Returns the backup's token, or NULL.
CREATE FUNCTION minion_claim_backup(p_executor uuid, p_caps text[], p_team text, p_factor double precision)
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
               AND (minion_executor_vouched(p_executor)
                    OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
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

-- The age a lease (or a backup, or a replica) of kind p_kind and p_records records may reach,
-- heartbeats or not: p_factor times a typical run of its size (p_per_record_s: minion_typical_run_s
-- of one record, read once per task), at least p_floor_s, at most the kind's ceiling in p_ceilings
-- ('kind=seconds,...'; '*' for the others), which is also the age when nothing is measured yet.
CREATE FUNCTION minion_lease_age_cap(p_per_record_s double precision, p_kind text, p_records integer,
                                     p_factor double precision, p_floor_s double precision, p_ceilings text)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(c.ceiling, greatest(p_floor_s, coalesce(p_factor * p_per_record_s * greatest(p_records, 1),
                                                         c.ceiling)))
      FROM (SELECT coalesce(minion_pair_value(p_kind, p_ceilings),
                            minion_pair_value('*', p_ceilings), 3600) AS ceiling) c
$$;

-- Leases, backups and replicas held past their age cap (minion_lease_age_cap), heartbeats or not:
-- a hanger that claims and beats without finishing held a task open for 15 minutes, and a hanging
-- replica held its check until the check wait. Each is ended as lost (a lease's subtask back to the
-- queue, its attempt not counted against the task; a replica's offered to another executor), and
-- its executor, unless vouched for, loses its earned trust and counts a disagreement (quarantined
-- at p_quarantine_after, as a quorum's loser is: a hanger re-claiming what it let go would
-- otherwise stall it for ever). Returns how many were ended.
CREATE FUNCTION minion_end_overage_leases(p_factor double precision, p_floor_s double precision, p_ceilings text,
                                          p_quarantine_after integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    o record;
    n integer := 0;
    why text;
    blamed uuid[] := '{}';
BEGIN
    -- Only what is older than the floor is looked at (few rows, by the leased_at index): a cap is never
    -- less. A task's typical run is read once, whatever its leases.
    FOR o IN WITH held AS (
                 SELECT s.lease_token AS tok, s.lease_executor AS executor_id, s.leased_at, s.task_id, s.subtask_id,
                        s.records
                   FROM subtasks s
                  WHERE s.state = 'leased' AND s.leased_at < now() - make_interval(secs => p_floor_s)
                 UNION ALL
                 SELECT b.lease_token, b.executor_id, b.leased_at, b.task_id, b.subtask_id, s.records
                   FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
                  WHERE b.leased_at < now() - make_interval(secs => p_floor_s)
             ), typical AS (
                 SELECT t.id, t.kind, minion_typical_run_s(t.id, 1) AS per_record
                   FROM tasks t WHERE t.id IN (SELECT DISTINCT task_id FROM held)
             )
             SELECT h.*, c.cap FROM held h JOIN typical y ON y.id = h.task_id
             CROSS JOIN LATERAL (SELECT minion_lease_age_cap(y.per_record, y.kind, h.records, p_factor, p_floor_s,
                                                             p_ceilings) AS cap) c
              WHERE h.leased_at < now() - make_interval(secs => least(c.cap, 1e9))
              ORDER BY h.task_id, h.subtask_id LOOP
        why := format('held past its age cap (%s s) without a result', round(o.cap::numeric));
        IF minion_end_lease(o.tok, 'lost', why, false, true) <> 'ok' THEN
            CONTINUE;  -- ended meanwhile
        END IF;
        n := n + 1;
        IF NOT minion_executor_vouched(o.executor_id) THEN
            blamed := blamed || o.executor_id;
        END IF;
    END LOOP;
    -- The executors last, locked in id order: a vote locks its subtask, then its voters; locking one
    -- here between two subtasks would be the other order.
    PERFORM 1 FROM executors WHERE id = ANY (blamed) ORDER BY id FOR UPDATE;
    FOR o IN SELECT x.id, count(*) AS times FROM unnest(blamed) AS x(id) GROUP BY x.id ORDER BY x.id LOOP
        UPDATE executors SET disagreements = disagreements + o.times, agreements = 0, trusted = false
         WHERE id = o.id;
        UPDATE executors
           SET quarantined_at = now(), quarantine_settled = false,
               quarantine_reason = format('let %s leases or replicas pass their age cap or lost quorums (last: %s)',
                                          disagreements, why)
         WHERE id = o.id AND quarantined_at IS NULL AND disagreements >= p_quarantine_after;
    END LOOP;
    RETURN n;
END $$;

-- Up to p_n pending subtasks in one filter (minion_claim_in's filters: the whole queue, a team, a
-- project or a task), in claim order, leased to p_executor. p_first: how many the batch holds already
-- (their leased_at come first, a microsecond apart, so the attempts' history shows the claim order).
-- An executor of one capability (the common case: one kind and model) gets its p_n in one probe of
-- the queue index. With several, it takes one subtask at a time, the best head among them, as
-- minion_claim_in does: probing each capability for p_n at once would keep up to p_n rows of every
-- capability locked, untaken, until the claim commits, hidden from the claimers that serve only that
-- capability (who would wait out their long poll with work pending). The project-or-task lookup is two
-- gated branches, which a generic plan can resolve. The probes pass over tasks pinned to another
-- fingerprint, and the rows found are taken only once their tasks are pinned to this executor's, with
-- a second probe after a lost pin race.
-- p_excluded: teams the whole queue passes over (those at their lease cap; a team's own probe never
-- gets them). Returns the new lease tokens, in claim order ('{}' when nothing in the filter is pending).
CREATE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                                p_task_name text, p_n integer, p_first integer,
                                                p_excluded text[] DEFAULT '{}')
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    caps text[] := ARRAY(SELECT DISTINCT c FROM unnest(p_caps) AS c);
    fp text;  -- the executor's fingerprint for caps[1] (the queue's and a team's probe)
    task_ids bigint[];
    subtask_ids integer[];
    more_tasks bigint[];
    more_subtasks integer[];
    refused bigint[];
    to_pin bigint[];  -- the tasks of the rows found that have a model (sleep is never pinned)
    t record;
    cap text;
    tok uuid;
    toks uuid[] := '{}';
    taken uuid[];
    vouched boolean;  -- may take tasks placed on trusted executors (read once a probe needs it)
BEGIN
    IF p_n < 1 THEN
        RETURN '{}';
    END IF;
    IF p_team IS NULL AND cardinality(p_excluded) > 0 AND cardinality(caps) > 1 THEN
        -- Teams left out of the whole queue (at their lease cap): one capability at a time, each
        -- probe with the exclusion (rare: only while some team has a cap).
        FOREACH cap IN ARRAY caps LOOP
            EXIT WHEN cardinality(toks) >= p_n;
            toks := toks || minion_claim_some_in(p_executor, ARRAY[cap], NULL, NULL, NULL, p_n - cardinality(toks),
                                                 p_first + cardinality(toks), p_excluded);
        END LOOP;
        RETURN toks;
    END IF;
    IF p_project IS NULL AND cardinality(caps) <> 1 THEN
        FOR k IN 1 .. p_n LOOP
            tok := minion_claim_in(p_executor, caps, p_team, NULL, NULL);
            EXIT WHEN tok IS NULL;
            toks := toks || tok;
        END LOOP;
        IF p_first > 0 OR cardinality(toks) > 1 THEN  -- minion_claim_in stamps now(): shifted here
            UPDATE subtasks s
               SET leased_at = s.leased_at + (p_first + array_position(toks, s.lease_token) - 1) * interval '1 microsecond'
             WHERE s.lease_token = ANY (toks);
        END IF;
        RETURN toks;
    END IF;
    IF p_project IS NULL THEN
        fp := minion_executor_fingerprint(p_executor, caps[1]);
    END IF;
    vouched := minion_executor_vouched(p_executor);
    -- A second probe only after a lost pin race.
    FOR pass IN 1 .. 2 LOOP
        task_ids := '{}';
        subtask_ids := '{}';
        refused := '{}';
        to_pin := '{}';
        -- The whole queue and a team's queue are two statements, not one with `p_team IS NULL OR`: each
        -- keeps its own partial index (subtasks_pending_queue, subtasks_pending_team) in a cached plan.
        IF p_project IS NULL AND p_team IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                       AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                       AND NOT (s.team::text = ANY (p_excluded))
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSIF p_project IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                       AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSE
            -- A project or a task: its few open task rows in claim order, each an O(log n) probe of the
            -- queue index for what is still wanted (as minion_claim_in). One capability per task, so
            -- nothing is locked that is not taken.
            -- A whole project and a task by name are two branches, not one `p_task_name IS NULL OR`
            -- condition: in one generic plan (above) that condition could not use the task's name, and
            -- every claim would read all of the project's tasks. Only one branch runs: the first is gated
            -- on the name being NULL, the second finds nothing when it is.
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint, placement FROM tasks
                      WHERE p_task_name IS NULL AND team = p_team AND project = p_project
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                     UNION ALL
                     SELECT id, priority, minion_capability(kind, model), fingerprint, placement FROM tasks
                      WHERE team = p_team AND project = p_project AND name = p_task_name
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY 2 DESC, 1 LOOP
                EXIT WHEN cardinality(task_ids) + cardinality(toks) >= p_n;
                CONTINUE WHEN NOT (t.cap = ANY (caps));
                CONTINUE WHEN t.placement = 'trusted' AND NOT vouched;
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
                SELECT coalesce(array_agg(q.task_id ORDER BY q.subtask_id), '{}'),
                       coalesce(array_agg(q.subtask_id ORDER BY q.subtask_id), '{}')
                  INTO more_tasks, more_subtasks
                  FROM (SELECT s.task_id, s.subtask_id FROM subtasks s
                         WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority
                           AND s.task_id = t.id
                         ORDER BY s.subtask_id LIMIT p_n - cardinality(task_ids) - cardinality(toks)
                           FOR UPDATE SKIP LOCKED) q;
                task_ids := task_ids || more_tasks;
                subtask_ids := subtask_ids || more_subtasks;
                IF t.cap <> 'sleep:*' AND cardinality(more_tasks) > 0 THEN
                    to_pin := to_pin || t.id;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN cardinality(task_ids) = 0;

        IF fp IS NOT NULL THEN
            to_pin := ARRAY(SELECT DISTINCT x FROM unnest(task_ids) AS x);
        END IF;
        IF cardinality(to_pin) > 0 THEN
            refused := minion_claim_pin_tasks(p_executor, to_pin);
            IF cardinality(refused) > 0 THEN  -- its rows stay locked until the claim commits, untaken
                SELECT coalesce(array_agg(w.task_id ORDER BY w.n), '{}'),
                       coalesce(array_agg(w.subtask_id ORDER BY w.n), '{}')
                  INTO task_ids, subtask_ids
                  FROM unnest(task_ids, subtask_ids) WITH ORDINALITY AS w(task_id, subtask_id, n)
                 WHERE NOT (w.task_id = ANY (refused));
            END IF;
        END IF;

        IF cardinality(task_ids) > 0 THEN
            taken := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(task_ids)));
            INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
            SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, w.tok
              FROM unnest(task_ids, subtask_ids, taken) AS w(task_id, subtask_id, tok)
              JOIN subtasks s ON s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            UPDATE subtasks s
               SET state = 'leased', lease_token = w.tok, lease_executor = p_executor,
                   leased_at = now() + (p_first + cardinality(toks) + w.n - 1) * interval '1 microsecond',
                   attempts = s.attempts + 1
              FROM unnest(task_ids, subtask_ids, taken) WITH ORDINALITY AS w(task_id, subtask_id, tok, n)
             WHERE s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            toks := toks || taken;
        END IF;
        EXIT WHEN cardinality(refused) = 0 OR cardinality(toks) >= p_n;
    END LOOP;
    RETURN toks;
END $$;

-- The tasks among p_task_ids that p_executor may not serve: pinned to another fingerprint, or pinned
-- by a concurrent claim before this one could. The others not pinned yet are pinned to its
-- fingerprint for their capability, if an admin vouched for it (sql/schema/11_checks.sql): a
-- volunteer's fingerprint, made up or not, pins nothing (a made-up one claimed a task's
-- first lease, pinned it, and committed 300 random vectors that no other executor could check). A
-- volunteer, and an executor with no reported fingerprint for the task's model ('unknown:<id>'),
-- may take a task no one pinned and leave it unpinned. Sleep tasks are never pinned.
CREATE FUNCTION minion_claim_pin_tasks(p_executor uuid, p_task_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    now_pinned text;
    refused bigint[] := '{}';
    vouched boolean;
BEGIN
    FOR t IN SELECT k.id, k.fingerprint AS pinned,
                    minion_executor_fingerprint(p_executor, minion_capability(k.kind, k.model)) AS mine
               FROM tasks k WHERE k.id = ANY (p_task_ids) AND k.kind <> 'sleep'
              ORDER BY k.id LOOP
        IF t.pinned IS NULL THEN
            CONTINUE WHEN t.mine LIKE 'unknown:%';
            vouched := coalesce(vouched, minion_executor_vouched(p_executor));
            CONTINUE WHEN NOT vouched;
            UPDATE tasks SET fingerprint = t.mine WHERE id = t.id AND fingerprint IS NULL;
            IF NOT FOUND THEN
                SELECT k.fingerprint INTO now_pinned FROM tasks k WHERE k.id = t.id;
                IF now_pinned IS DISTINCT FROM t.mine THEN
                    refused := refused || t.id;
                END IF;
            END IF;
        ELSIF t.pinned <> t.mine THEN
            refused := refused || t.id;
        END IF;
    END LOOP;
    RETURN refused;
END $$;

-- Open tasks pinned by a lease (not by their submission) that hold nothing from it: no subtask in a
-- state other than pending, failed or cancelled. Their pin is cleared; the count is returned. The
-- pin is cleared under the task row's lock and only if still unused, so a claim pinning or leasing
-- meanwhile either commits first (then a subtask is leased: kept) or waits for this.
CREATE FUNCTION minion_unpin_idle_tasks() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.id FROM tasks k
              WHERE k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision
                AND k.status IN ('queued', 'running')
              ORDER BY k.id LOOP
        UPDATE tasks k SET fingerprint = NULL
         WHERE k.id = t.id AND k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision
           AND NOT EXISTS (SELECT 1 FROM subtasks s
                            WHERE s.task_id = t.id AND s.state NOT IN ('pending', 'failed', 'cancelled'));
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- Open tasks pinned by a lease (not by `name@revision`) to a fingerprint that no vouched executor
-- online within p_after_s reports (not quarantined; a volunteer's report, made up or not, keeps no
-- pin: none made it), while work of theirs waits (pending or held for a
-- check): a pin whose machine went away would strand the task for ever beside executors of another
-- build. The pin is released (the next vouched executor's lease pins the task again) and noted on the
-- task (its `pin_released` warning: the results it keeps may come from another build than the rest),
-- and every result a volunteer (an executor not vouched for) committed under it runs again: the
-- pinning executor's word stood for them. Returns the tasks released.
CREATE FUNCTION minion_release_orphan_pins(p_after_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    t record;
    d record;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.id, k.fingerprint FROM tasks k
              WHERE k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision AND k.kind <> 'sleep'
                AND k.status IN ('queued', 'running')
                AND EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = k.id AND s.state IN ('pending', 'checking'))
                AND NOT EXISTS (SELECT 1 FROM executor_fingerprints f
                                  JOIN executors e ON e.id = f.executor_id
                                  JOIN api_tokens a ON a.id = e.token_id AND a.trusted  -- only a vouched one pins
                                  JOIN heartbeats h ON h.executor_id = f.executor_id
                                 WHERE f.capability = minion_capability(k.kind, k.model)
                                   AND f.fingerprint = k.fingerprint AND e.quarantined_at IS NULL
                                   AND h.alive_at > now() - make_interval(secs => p_after_s))
              ORDER BY k.id LOOP
        -- Subtasks first, then the task: the lock order of every function that ends an attempt.
        FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
                   FROM subtasks s JOIN subtask_attempts a ON a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                                                         AND a.lease_token = s.lease_token
                  WHERE s.task_id = t.id AND s.state = 'done' AND a.outcome IN ('done', 'unchecked')
                    AND NOT minion_executor_vouched(a.executor_id)
                  ORDER BY s.subtask_id
                    FOR UPDATE OF s LOOP
            PERFORM 1 FROM tasks WHERE id = t.id AND status IN ('queued', 'running') FOR UPDATE;
            EXIT WHEN NOT FOUND;
            PERFORM minion_revoke_result(d.task_id, d.subtask_id, d.records, d.lease_token,
                                         'its result was a volunteer''s under a model pin released',
                                         format('model pin %s released: no executor reported it for %s s',
                                                t.fingerprint, p_after_s));
        END LOOP;
        UPDATE tasks SET fingerprint = NULL, pin_released_at = now(), pin_released_fingerprint = t.fingerprint
         WHERE id = t.id AND fingerprint = t.fingerprint AND status IN ('queued', 'running');
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- A token as the subtask it names sees it (locked by the caller): 'primary' or 'backup' while
-- current; 'replica' (a backup of a checking subtask); 'held' (a candidate awaiting its check);
-- else 'cancelled' or 'lost'.
CREATE FUNCTION minion_token_role(s subtasks, p_token uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.task_id IS NULL THEN 'lost'
                WHEN s.state = 'cancelled' AND s.lease_token = p_token THEN 'cancelled'
                WHEN s.state = 'checking' THEN
                    CASE WHEN EXISTS (SELECT 1 FROM subtask_backups b
                                       WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                         AND b.lease_token = p_token) THEN 'replica'
                         WHEN EXISTS (SELECT 1 FROM subtask_checks c WHERE c.lease_token = p_token) THEN 'held'
                         ELSE 'lost' END
                WHEN s.state <> 'leased' THEN 'lost'
                WHEN s.lease_token = p_token THEN 'primary'
                WHEN EXISTS (SELECT 1 FROM subtask_backups b
                              WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                AND b.lease_token = p_token) THEN 'backup'
                ELSE 'lost' END
$$;

-- A live lease (a backup, or a replica while its subtask is checking), for the API before it acts
-- on it: the API token of the executor holding it, the object it must have written before it may
-- complete, and the input range it reads. No row when the token is no longer current.
CREATE FUNCTION minion_lease_info(p_token uuid, OUT owner bigint, OUT output_key text, OUT task_id bigint,
                                             OUT subtask_id integer, OUT attempt integer, OUT kind text,
                                             OUT input_uri text, OUT byte_start bigint, OUT byte_end bigint,
                                             OUT records integer)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtasks s JOIN executors e ON e.id = s.lease_executor JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = p_token AND s.state = 'leased'
    UNION ALL
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtask_backups b
      JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
      JOIN executors e ON e.id = b.executor_id
      JOIN tasks t ON t.id = s.task_id
     WHERE b.lease_token = p_token AND s.state IN ('leased', 'checking')
    LIMIT 1
$$;

-- Heartbeat: the executor is alive; each token it names (a lease, a backup or a spot check's
-- replica) is answered ok, lost or cancelled. A heartbeat names every lease its executor holds, so a
-- lease of this executor that it leaves out, and that is older than p_grace_s (a fresh lease may not
-- have reached it yet), is one it never received (the claim's answer was lost on the wire) or forgot:
-- ended as lost and requeued, as a silent executor's would be. NULL p_grace_s: no such check.
CREATE FUNCTION minion_heartbeat(p_executor uuid, p_tokens uuid[], p_grace_s double precision DEFAULT NULL)
RETURNS TABLE (lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s subtasks;
    tok uuid;
    forgotten text := 'executor no longer names this lease in its heartbeats (it never received it, or lost it)';
BEGIN
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
                WHEN bs.state IN ('leased', 'checking') AND b.executor_id = p_executor THEN 'ok'
                WHEN s2.state = 'cancelled' THEN 'cancelled'
                ELSE 'lost' END
      FROM unnest(p_tokens) AS t(tok)
      LEFT JOIN subtasks s2 ON s2.lease_token = t.tok
      LEFT JOIN subtask_backups b ON b.lease_token = t.tok
      LEFT JOIN subtasks bs ON bs.task_id = b.task_id AND bs.subtask_id = b.subtask_id;
END $$;

-- Ends a backup or a replica (failed, released, lost): the primary lease goes on as if nothing
-- happened. The subtask is locked before its backup row is deleted, the order every function that
-- ends a lease or votes takes (subtask, then its rows): the other order deadlocks with a vote.
CREATE FUNCTION minion_end_backup(p_token uuid, p_outcome text, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b subtask_backups%ROWTYPE;
    att integer;
BEGIN
    PERFORM 1 FROM subtasks s JOIN subtask_backups k ON k.task_id = s.task_id AND k.subtask_id = s.subtask_id
      WHERE k.lease_token = p_token FOR UPDATE OF s;
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT attempts INTO att FROM subtasks WHERE task_id = b.task_id AND subtask_id = b.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (b.task_id, b.subtask_id, att, b.executor_id, b.lease_token, b.leased_at, p_outcome, p_error);
END $$;

-- The leases team p_team holds now: its open tasks' subtasks in flight (leased or checking).
CREATE FUNCTION minion_team_leases_in_flight(p_team text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM tasks t JOIN subtasks s ON s.task_id = t.id
     WHERE t.team = p_team AND NOT (t.status IN ('completed', 'failed', 'cancelled'))
       AND s.state IN ('leased', 'checking')
$$;

-- The leases team p_team may still take now under its lease cap (team_shares.max_leases): the cap
-- less its leases in flight (leased or checking). Takes the team's cap lock until the transaction
-- ends, so two claims cannot both fill the last room. Only claims of teams with a cap call it.
CREATE FUNCTION minion_team_lease_room(p_team text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    cap integer;
BEGIN
    SELECT max_leases INTO cap FROM team_shares WHERE team = p_team;
    IF coalesce(cap, 0) <= 0 THEN
        RETURN 2147483647;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('minion_team_leases:' || p_team, 0));
    RETURN cap - minion_team_leases_in_flight(p_team);
END $$;

-- The claim of up to p_max subtasks. Rows: one per lease won (verdict 'leased'); else one row whose
-- verdict says why none: 'empty' (nothing fits now: `capabilities` says what to wait for),
-- 'not_found', 'not_your_executor', 'deregistered', 'quarantined'. `owner`: the API token of the
-- executor (for later fencing of who may complete). Never waits: what is pending now.
--
-- In order: a spot check's replica wanted of the executor's capabilities (one at most a claim,
-- answered as a lease like any: `backup` false); each preference tier, then the team whose turn it
-- is when several teams share the executor's queue (fair_share_turns, teams.sql: no row is written
-- per claim, a shared sequence picks the turn), then the whole queue, asked once for what is still
-- wanted (minion_claim_some_in; a team with a lease cap only up to its room, never from the whole
-- queue); with nothing pending and p_backup_factor > 0,
-- one backup of a straggler. The leases won that are chosen for a check are marked (check_token) in
-- one UPDATE, only when the share may choose any: none of a vouched executor (11_checks.sql), all of
-- an executor not trusted, else each with its team's share (minions.spot_check_team_shares) or
-- minions.spot_check_share; only checkable ones (minion_checkable, or a sampled completion with
-- proofs: minion_executor_proves), whether or not an executor of another owner could replicate one now
-- (a volunteer's result is held until one can: it never commits unchecked).
--
-- Tasks of the leases won are read in the lookup that lists them, and only those still 'splitting' or
-- 'queued' are marked running (an UPDATE that changes nothing still opens the table's indexes and
-- triggers); the answer's rows are found by the lease-token index (every won token is a lease this
-- transaction holds locked).
--
-- Plans: PostgreSQL plans a PL/pgSQL statement with parameters at each of its first five runs, then
-- keeps a generic plan unless its estimate is worse than the custom plans' average. The claim's
-- statements over arrays and limits are estimated at 10 elements or a tenth of the queue without
-- their values, and at 1 with them, so the generic estimate always lost and five of them were planned
-- again at every claim (~0.9 ms a claim). force_generic_plan keeps one plan per statement and
-- connection, in the custom plans' shape. A plan made while subtasks is small (a fresh database)
-- would scan the table where an index finds the row, and keep that shape until the statistics change;
-- every statement here is a lookup by key or an ordered probe of the queue's indexes, so
-- enable_seqscan = off holds for the whole call (the functions it calls included).
CREATE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
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
