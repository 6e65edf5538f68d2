-- The task-progress functions as shipped at commit b1943b0 (sql/020_tasks.sql), kept as data for
-- bench/drain.py's baseline arm: applied over the current schema in a scratch database, they bring
-- back the hot task row (every close updates the task's row). Never a migration.

-- A task whose last open subtask closed, and whose split is finished, ends here.
CREATE OR REPLACE FUNCTION minion_task_settle(p_task_id bigint) RETURNS void LANGUAGE sql AS $$
    UPDATE tasks
       SET status = CASE WHEN failed_subtasks > 0 THEN 'failed' ELSE 'completed' END,
           finished_at = now()
     WHERE id = p_task_id
       AND split_done AND open_subtasks = 0
       AND status IN ('splitting', 'queued', 'running')
$$;

-- A subtask left the open states (done, or failed for good). Locks the task row briefly, which is
-- what makes "the last one closes the task" race-free.
CREATE OR REPLACE FUNCTION minion_subtask_closed(p_task_id bigint, p_failed boolean, p_error text DEFAULT NULL,
                                      p_records integer DEFAULT 0)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks
       SET open_subtasks = open_subtasks - 1,
           failed_subtasks = failed_subtasks + p_failed::int,
           records_done = records_done + CASE WHEN p_failed THEN 0 ELSE p_records END,
           error = CASE WHEN p_failed AND error IS NULL THEN p_error ELSE error END
     WHERE id = p_task_id;
    PERFORM minion_task_settle(p_task_id);
END $$;

CREATE OR REPLACE FUNCTION minion_finish_split(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks
       SET split_done = true,
           status = CASE WHEN status = 'splitting' THEN 'queued' ELSE status END
     WHERE id = p_task_id AND NOT split_done AND status IN ('splitting', 'queued', 'running');
    PERFORM minion_task_settle(p_task_id);
END $$;
-- A task's progress, for the API and the CLI: from the task's counters plus its running subtasks
-- (few: one per busy executor), never a scan of all its subtasks (the web UI polls this).
CREATE OR REPLACE FUNCTION minion_task_counts(p_task_id bigint,
    OUT subtasks_total bigint, OUT subtasks_pending bigint, OUT subtasks_leased bigint,
    OUT subtasks_done bigint, OUT subtasks_failed bigint, OUT subtasks_cancelled bigint,
    OUT records_done bigint)
LANGUAGE sql STABLE AS $$
    SELECT t.subtasks_total, t.open_subtasks - l.leased, l.leased,
           t.subtasks_total - t.open_subtasks - t.failed_subtasks - t.cancelled_subtasks,
           t.failed_subtasks, t.cancelled_subtasks, t.records_done
      FROM tasks t
     CROSS JOIN LATERAL (SELECT count(*) AS leased FROM subtasks s
                          WHERE s.task_id = t.id AND s.state = 'leased') l
     WHERE t.id = p_task_id
$$;
