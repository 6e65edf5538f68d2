-- Retention: finished tasks older than the retention age (MINIONS_RETENTION_DAYS) are deleted: their
-- subtasks and attempt history first, a batch per call and so per transaction (a 100,000-subtask
-- task never becomes one long delete holding its rows, or one burst of WAL that a standby lags
-- behind), then the task row itself through minion_delete_task, which re-checks that it is
-- finished. The lease and backup rows of those subtasks go with them by cascade. Their input and
-- result objects become garbage, which the store's collector frees (as after `minions delete`).
-- Running and recently finished tasks are never touched. Tasks an OpenAI batch points at are left
-- to that adapter (openai_batches.task_id is not ON DELETE CASCADE).

-- One batch: up to p_batch subtasks of the oldest expired task, or that task's row once it has no
-- subtask left. No row: nothing is older than p_older_than (the job is done).
CREATE FUNCTION minion_retention_step(p_older_than interval, p_batch integer)
RETURNS TABLE (task_id bigint, subtasks_deleted integer, attempts_deleted integer, task_deleted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t bigint;
    ids integer[];
BEGIN
    IF p_batch < 1 OR p_older_than < interval '0' THEN
        RAISE EXCEPTION 'retention: batch must be >= 1 and age >= 0 (got %, %)', p_batch, p_older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT k.id INTO t FROM tasks k
     WHERE k.finished_at < now() - p_older_than
       AND NOT EXISTS (SELECT 1 FROM openai_batches b WHERE b.task_id = k.id)
     ORDER BY k.finished_at, k.id LIMIT 1;
    IF t IS NULL THEN
        RETURN;
    END IF;
    task_id := t;
    subtasks_deleted := 0;
    attempts_deleted := 0;
    task_deleted := false;
    -- Lock order everywhere: subtasks (by id), then the task.
    SELECT array_agg(s.subtask_id ORDER BY s.subtask_id) INTO ids
      FROM (SELECT subtask_id FROM subtasks WHERE subtasks.task_id = t
             ORDER BY subtask_id LIMIT p_batch FOR UPDATE) s;
    IF ids IS NOT NULL THEN
        DELETE FROM subtask_attempts a WHERE a.task_id = t AND a.subtask_id = ANY (ids);
        GET DIAGNOSTICS attempts_deleted = ROW_COUNT;
        DELETE FROM subtasks s WHERE s.task_id = t AND s.subtask_id = ANY (ids);
        GET DIAGNOSTICS subtasks_deleted = ROW_COUNT;
    END IF;
    IF coalesce(cardinality(ids), 0) < p_batch THEN
        task_deleted := minion_delete_task(t) = 'deleted';
        IF NOT task_deleted AND ids IS NULL THEN
            RETURN;  -- no longer finished (cannot happen today): not ours, and not a step either
        END IF;
    END IF;
    RETURN NEXT;
END $$;
