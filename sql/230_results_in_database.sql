-- Small results kept in the database (issue 11: the per-subtask path).
--
-- A verified result was always copied to its own object (results/…, sql/070): a file, an fsync and a
-- rename on the local store, a PUT on S3, for every subtask, however small. For an inline output of
-- at most MINIONS_RESULT_IN_DATABASE_BYTES the API now records the verified bytes in the subtask's
-- row instead, in the complete's own transaction: one durable write (the commit) where there were
-- two, and no object to collect later. Larger outputs keep their result objects, as before.
--
-- What the schema holds to: a result lives in one place (an object or the row, never both); bytes
-- kept here match the SHA-256 and size recorded for them (checked by PostgreSQL at every write, so
-- no writer can record bytes other than those it verified). Once a completed task's results are
-- compacted into parts (sql/210), its rows' bytes are dropped after the grace period, as its
-- per-subtask objects become garbage then (minion_gc_kept_results): results are served from the
-- parts, and the database keeps them no longer than the store would.

-- NOT VALID: the rows already there hold 070's constraint, which implies this one, so a scan of a big
-- table under the migration's lock would prove nothing; every row written from now on is checked.
ALTER TABLE subtasks
    ADD COLUMN result_data bytea,
    DROP CONSTRAINT subtasks_result_complete,
    ADD CONSTRAINT subtasks_result_complete CHECK (
        (result_sha256 IS NULL) = (result_bytes IS NULL)
        AND (result_key IS NULL OR result_sha256 IS NOT NULL)
        AND (result_data IS NULL OR (result_key IS NULL AND result_sha256 IS NOT NULL
                                     AND length(result_data) = result_bytes
                                     AND sha256(result_data) = result_sha256))) NOT VALID;

-- (Replaces 070's: p_result_data, the verified bytes when they are kept in the row; p_result_key is
-- then NULL, and p_sha256 and p_bytes describe the bytes as before. A result recorded with its bytes
-- in neither place would be lost: refused. The row allows that shape only for the bytes the garbage
-- collector dropped after compaction.)
DROP FUNCTION minion_complete(uuid, integer, double precision, text, bytea, bigint);
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    winner_executor uuid;
    winner_started timestamptz;
BEGIN
    IF p_sha256 IS NOT NULL AND p_result_key IS NULL AND p_result_data IS NULL THEN
        RAISE EXCEPTION 'a committed result needs its bytes: a result key or the bytes themselves'
            USING ERRCODE = 'check_violation';
    END IF;
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'lost' AND s.state = 'done' AND s.lease_token = p_token THEN
        RETURN 'repeat';  -- this very lease committed already: a retried complete is answered the same
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
           output_key = minion_output_key(task_id, subtask_id, attempts, p_token),
           result_key = p_result_key, result_sha256 = p_sha256, result_bytes = p_bytes,
           result_data = p_result_data
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;

-- (Replaces 220's: each lease's kept bytes, or NULL, beside its result key.)
DROP FUNCTION minion_complete_batch(uuid[], integer[], double precision[], text[], bytea[], bigint[]);
CREATE FUNCTION minion_complete_batch(p_tokens uuid[], p_records integer[], p_seconds double precision[],
                                      p_result_keys text[], p_sha256s bytea[], p_bytes bigint[],
                                      p_result_data bytea[] DEFAULT NULL)
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_complete(p_tokens[i], p_records[i], p_seconds[i], p_result_keys[i], p_sha256s[i],
                                   p_bytes[i], p_result_data[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;

-- Bytes kept in the rows of a task whose results were compacted into parts (sql/210) are dropped by
-- the garbage collector once the task has been compacted for the grace period, as its per-subtask
-- objects are: from compaction on its results are served from the parts, and a reader that began
-- before has had the grace to finish. Their SHA-256 and size stay, the record of what was committed.
-- kept_results_from: the next subtask id to look at (batches walk the task once, by subtask id, and
-- a task with nothing kept takes one call, however many subtasks it has).
ALTER TABLE compacted_tasks
    ADD COLUMN kept_results_dropped boolean NOT NULL DEFAULT false,
    ADD COLUMN kept_results_from integer NOT NULL DEFAULT 0;
-- Tasks compacted before this migration had no kept bytes.
UPDATE compacted_tasks SET kept_results_dropped = true;

-- Drop the kept bytes of the next p_limit subtasks (by id) that have some, of one such task: (task,
-- rows, bytes), no row when no task is due. p_dry_run: what would be dropped, task by task, nothing changed.
CREATE FUNCTION minion_gc_kept_results(p_grace_s double precision, p_dry_run boolean, p_limit integer)
RETURNS TABLE (task_id bigint, subtasks bigint, bytes bigint) LANGUAGE plpgsql AS $$
DECLARE
    due bigint;
    from_id integer;
    last_id integer;
BEGIN
    IF p_dry_run THEN
        RETURN QUERY
            SELECT c.task_id, count(s.subtask_id), coalesce(sum(s.result_bytes), 0)::bigint
              FROM compacted_tasks c JOIN subtasks s ON s.task_id = c.task_id AND s.result_data IS NOT NULL
             WHERE NOT c.kept_results_dropped AND c.compacted_at < now() - make_interval(secs => p_grace_s)
             GROUP BY c.task_id;
        RETURN;
    END IF;
    SELECT c.task_id, c.kept_results_from INTO due, from_id FROM compacted_tasks c
     WHERE NOT c.kept_results_dropped AND c.compacted_at < now() - make_interval(secs => p_grace_s)
     ORDER BY c.compacted_at LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    task_id := due;
    WITH pick AS (
        SELECT v.subtask_id FROM subtasks v
         WHERE v.task_id = due AND v.subtask_id >= from_id AND v.result_data IS NOT NULL
         ORDER BY v.subtask_id LIMIT p_limit),
    dropped AS (
        UPDATE subtasks s SET result_data = NULL FROM pick
         WHERE s.task_id = due AND s.subtask_id = pick.subtask_id
        RETURNING s.subtask_id, s.result_bytes)
    SELECT count(*), coalesce(sum(d.result_bytes), 0)::bigint, max(d.subtask_id)
      INTO subtasks, bytes, last_id FROM dropped d;
    -- Done when the walk found fewer than it could take, or nothing kept lies past its last row (the
    -- probe stops at the next kept row, where the next call starts: the task is still walked once).
    UPDATE compacted_tasks c
       SET kept_results_from = coalesce(last_id + 1, from_id),
           kept_results_dropped = subtasks < p_limit
                                  OR NOT EXISTS (SELECT 1 FROM subtasks v
                                                  WHERE v.task_id = due AND v.subtask_id > last_id
                                                    AND v.result_data IS NOT NULL)
     WHERE c.task_id = due;
    RETURN NEXT;
END $$;
