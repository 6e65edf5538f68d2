-- The per-subtask steps, leaner where it pays (issue 11; `pg_stat_user_functions` of a batched drain
-- showed where the time went, BENCHMARKS.md "Drain, third round"):
--
-- 1. A batched claim took its N subtasks one minion_claim_in at a time: N probes of the queue index,
--    each stepping again over the entries its predecessors had just left behind, then a second
--    UPDATE of every won row to shift its leased_at by a microsecond (a third row version per
--    subtask, with its index entries). Now each filter (preference tier) is probed once for as many
--    as are still wanted, and the won rows are stamped leased, leased_at shifted, in one UPDATE
--    (for an executor of one capability; one of several still takes them one at a time, see below).
-- 2. A batched complete or fail decided each task's end after every close it made. Only the last
--    close of a task in the batch can end it (an earlier one sees the later leases of the same
--    batch still open), so the batch now decides once per task, after its last close, in task
--    order: the decision that used to be the batch's last, the others were waste.
-- 3. Every close of a big task summed the task's progress slots (a row per connection) before it
--    probed for a pending subtask, the answer nearly every close gets ("one is pending: a later
--    closer decides"). The probe now comes first; the sum only at a task's tail.
--
-- The single-lease entry points (minion_claim, minion_complete, minion_fail, …) are unchanged; the
-- one they share with batches and replace here (minion_task_try_settle) makes the same decisions.
-- Each lease of a batch is still taken or ended exactly as a single call would: same fencing, same
-- referee row (minion_subtask_acquirement), same verdicts.

-- Up to p_n pending subtasks in one filter (minion_claim_in's filters: the whole queue, a team, a
-- project or a task), in claim order, leased to p_executor. p_first: how many the batch holds already
-- (their leased_at come first, a microsecond apart, so the attempts' history shows the claim order).
-- An executor of one capability (the common case: one kind and model) gets its p_n in one probe of
-- the queue index. With several, it takes one subtask at a time, the best head among them, as
-- minion_claim_in does: probing each capability for p_n at once would keep up to p_n rows of every
-- capability locked, untaken, until the claim commits, hidden from the claimers that serve only that
-- capability (who would wait out their long poll with work pending).
-- Returns the new lease tokens, in claim order ('{}' when nothing in the filter is pending).
CREATE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                     p_task_name text, p_n integer, p_first integer)
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    caps text[] := ARRAY(SELECT DISTINCT c FROM unnest(p_caps) AS c);
    task_ids bigint[] := '{}';
    subtask_ids integer[] := '{}';
    more_tasks bigint[];
    more_subtasks integer[];
    t record;
    tok uuid;
    toks uuid[] := '{}';
BEGIN
    IF p_n < 1 THEN
        RETURN '{}';
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
    -- The whole queue and a team's queue are two statements, not one with `p_team IS NULL OR`: each
    -- keeps its own partial index (subtasks_pending_queue, subtasks_pending_team) in a cached plan.
    IF p_project IS NULL AND p_team IS NULL THEN
        SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
               coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
          INTO task_ids, subtask_ids
          FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                 WHERE s.state = 'pending' AND s.capability = caps[1]
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n
                   FOR UPDATE SKIP LOCKED) q;
    ELSIF p_project IS NULL THEN
        SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
               coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
          INTO task_ids, subtask_ids
          FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                 WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n
                   FOR UPDATE SKIP LOCKED) q;
    ELSE
        -- A project or a task: its few open task rows in claim order, each an O(log n) probe of the
        -- queue index for what is still wanted (as minion_claim_in). One capability per task, so
        -- nothing is locked that is not taken.
        FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap FROM tasks
                  WHERE team = p_team AND project = p_project
                    AND (p_task_name IS NULL OR name = p_task_name)
                    AND NOT (status IN ('completed', 'failed', 'cancelled'))
                  ORDER BY priority DESC, id LOOP
            EXIT WHEN cardinality(task_ids) >= p_n;
            CONTINUE WHEN NOT (t.cap = ANY (caps));
            SELECT coalesce(array_agg(q.task_id ORDER BY q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.subtask_id), '{}')
              INTO more_tasks, more_subtasks
              FROM (SELECT s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority
                       AND s.task_id = t.id
                     ORDER BY s.subtask_id LIMIT p_n - cardinality(task_ids)
                       FOR UPDATE SKIP LOCKED) q;
            task_ids := task_ids || more_tasks;
            subtask_ids := subtask_ids || more_subtasks;
        END LOOP;
    END IF;
    IF cardinality(task_ids) = 0 THEN
        RETURN '{}';
    END IF;

    toks := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(task_ids)));
    INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
    SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, w.tok
      FROM unnest(task_ids, subtask_ids, toks) AS w(task_id, subtask_id, tok)
      JOIN subtasks s ON s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
    UPDATE subtasks s
       SET state = 'leased', lease_token = w.tok, lease_executor = p_executor,
           leased_at = now() + (p_first + w.n - 1) * interval '1 microsecond', attempts = s.attempts + 1
      FROM unnest(task_ids, subtask_ids, toks) WITH ORDINALITY AS w(task_id, subtask_id, tok, n)
     WHERE s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
    RETURN toks;
END $$;

-- (Replaces 170's: each preference tier, then the whole queue, asked once for what is still wanted.
-- Same verdicts; the same subtasks in the same order as 170's one-at-a-time loop.)
CREATE OR REPLACE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
                                              p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (verdict text, capabilities text[], owner bigint, lease_token uuid, expires_at timestamptz,
               task_id bigint, subtask_id integer, attempt integer, team text, project text,
               task_name text, kind text, model text, params jsonb, input_uri text, byte_start bigint,
               byte_end bigint, records integer, output_key text, backup boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    wanted integer := greatest(p_max, 1);
    won uuid[] := '{}';  -- the leases won, in claim order
    backup_tok uuid;
    busy bigint;
    ex executors%ROWTYPE;
    pref record;
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
    -- The preferences in order, then the executor's whole queue (its token's team, or every team):
    -- the last filter, after every position.
    FOR pref IN (SELECT p.position, p.team, p.project, p.task_name FROM executor_preferences p
                  WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                 ORDER BY 1 LOOP
        won := won || minion_claim_some_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name,
                                           wanted - cardinality(won), cardinality(won));
        EXIT WHEN cardinality(won) >= wanted;
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

-- (Replace 170's: one decision per task, after the batch's closes.)
CREATE OR REPLACE FUNCTION minion_complete_batch(p_tokens uuid[], p_records integer[], p_seconds double precision[],
                                                 p_result_keys text[], p_sha256s bytea[], p_bytes bigint[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_complete(p_tokens[i], p_records[i], p_seconds[i], p_result_keys[i], p_sha256s[i],
                                   p_bytes[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;

CREATE OR REPLACE FUNCTION minion_fail_batch(p_tokens uuid[], p_errors text[], p_retryable boolean[])
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

-- (Replaces 180's: inside a batch the batch decides, once per task after its last close; the pending
-- probe comes first, the slots' sum only when nothing is pending. A pending subtask is open, so the
-- sum could not have said "all closed": the same decisions, cheaper.)
CREATE OR REPLACE FUNCTION minion_task_try_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    IF minion_settle_deferred() THEN
        RETURN;  -- minion_settle_after_batch decides
    END IF;
    SELECT split_done, status, kind, model, priority, open_subtasks INTO t FROM tasks WHERE id = p_task_id;
    IF NOT FOUND OR NOT t.split_done OR t.status NOT IN ('splitting', 'queued', 'running') THEN
        RETURN;  -- not split yet: minion_finish_split decides
    END IF;
    -- One probe of the queue index (capability, priority and task known).
    PERFORM 1 FROM subtasks s
      WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
        AND s.priority = t.priority AND s.task_id = p_task_id
      LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    IF t.open_subtasks - (minion_task_slot_sums(p_task_id)).closed <= 0 THEN
        PERFORM minion_task_settle(p_task_id);
        RETURN;
    END IF;
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state = 'leased'
      LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('tasks', p_task_id::text);
END $$;
