-- `minions retry`: a failed task's failed subtasks run again (POST /api/v1/tasks/{team}/{project}/{name}/retry).

-- Retry: a failed task's failed subtasks back to the queue, each with a fresh budget of the task's
-- max_attempts (their attempts count from zero again; the history keeps every earlier attempt, each
-- with its own lease token, which output keys carry, so no new output can overwrite an old one).
-- Committed results stay; the task is running (queued if nothing was ever claimed) until its
-- subtasks close again, and the requeue trigger wakes the executors. Returns the verdict and how
-- many subtasks went back: 'retried', 'missing', 'not_failed' (the task's status) or
-- 'nothing_to_retry' (a task that failed with no failed subtask: its input could not be split).
CREATE FUNCTION minion_retry_task(p_task_id bigint, OUT verdict text, OUT subtasks integer)
LANGUAGE plpgsql AS $$
DECLARE
    task_status text;
BEGIN
    subtasks := 0;
    -- Lock order everywhere: subtasks (by id), then the task.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state = 'failed' ORDER BY subtask_id FOR UPDATE;
    SELECT status INTO task_status FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        verdict := 'missing';
        RETURN;
    END IF;
    IF task_status <> 'failed' THEN
        verdict := 'not_failed';
        RETURN;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE subtasks
       SET state = 'pending', attempts = 0, lease_token = NULL, lease_executor = NULL, leased_at = NULL,
           done_at = NULL, check_token = NULL
     WHERE task_id = p_task_id AND state = 'failed';
    GET DIAGNOSTICS subtasks = ROW_COUNT;
    IF subtasks = 0 THEN
        verdict := 'nothing_to_retry';
        RETURN;
    END IF;
    UPDATE tasks
       SET status = CASE WHEN started_at IS NULL THEN 'queued' ELSE 'running' END,
           finished_at = NULL, error = NULL,
           open_subtasks = open_subtasks + subtasks,
           failed_subtasks = failed_subtasks - subtasks
     WHERE id = p_task_id;
    verdict := 'retried';
END $$;
