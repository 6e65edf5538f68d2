-- Results checked by shape at complete: an embedding task's vectors all have one
-- length, fixed by the first result committed in the task.
--
-- The API checks each output line's shape (services/api/output_check.py): within one output every
-- vector has the same length, which complete passes here as p_dimension. Across outputs the task
-- row holds it: the first complete that commits vectors fixes tasks.embedding_dimension, and every
-- later one must match it, or is refused ('dimension_mismatch': the API's 422 output_mismatch)
-- with nothing changed, its lease still live. Fixed in the complete's own transaction, after the
-- lease is known current, so only a committed result fixes it, and two concurrent first completes
-- with different lengths cannot both commit: the second waits for the first's row lock, then sees
-- its value. After the first, each embedding complete reads the task row by its key (no lock).

ALTER TABLE tasks ADD COLUMN embedding_dimension integer CHECK (embedding_dimension > 0);

-- Whether task p_task_id's vectors may have p_dimension elements: fixed by the first caller
-- (the caller has locked one of the task's subtasks, as every complete does: the lock order is
-- subtasks, then the task).
CREATE FUNCTION minion_pin_dimension(p_task_id bigint, p_dimension integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    pinned integer;
BEGIN
    SELECT embedding_dimension INTO pinned FROM tasks WHERE id = p_task_id;
    IF pinned IS NULL THEN
        UPDATE tasks SET embedding_dimension = p_dimension WHERE id = p_task_id AND embedding_dimension IS NULL;
        IF FOUND THEN
            RETURN true;
        END IF;
        -- A concurrent first complete fixed it meanwhile (this statement waited for its commit).
        SELECT embedding_dimension INTO pinned FROM tasks WHERE id = p_task_id;
    END IF;
    RETURN pinned = p_dimension;
END $$;

-- (Replaces 290's: p_dimension, the length of the output's vectors, pinned for the task before
-- anything is committed; nothing else changes.)
DROP FUNCTION minion_complete(uuid, integer, double precision, text, bytea, bigint, bytea);
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL,
                                p_dimension integer DEFAULT NULL)
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
    IF p_dimension IS NOT NULL AND NOT minion_pin_dimension(s.task_id, p_dimension) THEN
        RETURN 'dimension_mismatch';
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
    PERFORM minion_drop_referee_row(s.lease_token);
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;

-- (Replaces 230's: each lease's vector length, or NULL, beside its kept bytes.)
DROP FUNCTION minion_complete_batch(uuid[], integer[], double precision[], text[], bytea[], bigint[], bytea[]);
CREATE FUNCTION minion_complete_batch(p_tokens uuid[], p_records integer[], p_seconds double precision[],
                                      p_result_keys text[], p_sha256s bytea[], p_bytes bigint[],
                                      p_result_data bytea[] DEFAULT NULL, p_dimensions integer[] DEFAULT NULL)
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_complete(p_tokens[i], p_records[i], p_seconds[i], p_result_keys[i], p_sha256s[i],
                                   p_bytes[i], p_result_data[i], p_dimensions[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;
