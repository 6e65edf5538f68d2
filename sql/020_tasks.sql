-- Task lifecycle: splitting, settling, cancelling. Each function is one atomic step.

-- What an executor must advertise to be handed a subtask: 'kind:model', or 'sleep:*' (the synthetic
-- workload needs no model).
CREATE FUNCTION minion_capability(p_kind text, p_model text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_kind = 'sleep' THEN 'sleep:*' ELSE p_kind || ':' || p_model END
$$;

-- The object key an attempt writes its output to: per attempt and per lease, so a late writer can
-- never overwrite a committed result (invariant 4).
CREATE FUNCTION minion_output_key(p_task_id bigint, p_subtask_id integer, p_attempt integer, p_token uuid)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format('outputs/%s/%s/%s-%s.jsonl', p_task_id, p_subtask_id, p_attempt, p_token)
$$;

-- A task whose last open subtask closed, and whose split is finished, ends here.
CREATE FUNCTION minion_task_settle(p_task_id bigint) RETURNS void LANGUAGE sql AS $$
    UPDATE tasks
       SET status = CASE WHEN failed_subtasks > 0 THEN 'failed' ELSE 'completed' END,
           finished_at = now()
     WHERE id = p_task_id
       AND split_done AND open_subtasks = 0
       AND status IN ('splitting', 'queued', 'running')
$$;

-- A subtask left the open states (done, or failed for good). Locks the task row briefly, which is
-- what makes "the last one closes the task" race-free.
CREATE FUNCTION minion_subtask_closed(p_task_id bigint, p_failed boolean, p_error text DEFAULT NULL,
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

-- The splitter takes a task: returns where to resume (a crashed split resumes, never restarts,
-- because its first subtasks may already be leased). NULL when the task is no longer splittable.
CREATE FUNCTION minion_begin_split(p_task_id bigint,
    OUT split_offset bigint, OUT split_records bigint, OUT next_subtask_id integer)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks t SET status = CASE WHEN t.status = 'submitted' THEN 'splitting' ELSE t.status END
     WHERE t.id = p_task_id AND NOT t.split_done AND t.status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING t.split_offset, t.split_records INTO split_offset, split_records;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT coalesce(max(s.subtask_id) + 1, 0) INTO next_subtask_id FROM subtasks s WHERE s.task_id = p_task_id;
END $$;

-- One batch of subtasks, and the split's progress, in one statement's worth of work.
-- Returns false (and inserts nothing) when the task was cancelled or failed meanwhile.
CREATE FUNCTION minion_add_subtasks(p_task_id bigint, p_byte_starts bigint[], p_byte_ends bigint[],
    p_first_records bigint[], p_records integer[], p_first_subtask_id integer,
    p_split_offset bigint, p_split_records bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
    n integer := cardinality(p_byte_starts);
BEGIN
    SELECT * INTO t FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('submitted', 'splitting', 'queued', 'running') OR t.split_done THEN
        RETURN false;
    END IF;
    INSERT INTO subtasks (task_id, subtask_id, team, project, task_name, capability, priority,
                          byte_start, byte_end, first_record, records)
    SELECT p_task_id, p_first_subtask_id + i - 1, t.team, t.project, t.name,
           minion_capability(t.kind, t.model), t.priority,
           p_byte_starts[i], p_byte_ends[i], p_first_records[i], p_records[i]
      FROM generate_subscripts(p_byte_starts, 1) AS i;
    UPDATE tasks SET open_subtasks = open_subtasks + n,
                     subtasks_total = subtasks_total + n,
                     split_offset = p_split_offset,
                     split_records = p_split_records
     WHERE id = p_task_id;
    RETURN true;
END $$;

CREATE FUNCTION minion_finish_split(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks
       SET split_done = true,
           status = CASE WHEN status = 'splitting' THEN 'queued' ELSE status END
     WHERE id = p_task_id AND NOT split_done AND status IN ('splitting', 'queued', 'running');
    PERFORM minion_task_settle(p_task_id);
END $$;

-- A malformed input fails the task and leaves no subtasks behind (any already leased become stale:
-- their tokens vanish with them, so a late complete gets 409).
CREATE FUNCTION minion_fail_split(p_task_id bigint, p_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- ended meanwhile (a cancel): its committed results stay
    END IF;
    DELETE FROM subtasks WHERE task_id = p_task_id;
    UPDATE tasks
       SET status = 'failed', error = p_error, finished_at = now(), split_done = true, open_subtasks = 0,
           subtasks_total = 0, failed_subtasks = 0, records_done = 0
     WHERE id = p_task_id;
END $$;

-- Cancel: pending and leased subtasks become cancelled at once; a leased one's executor learns it at
-- its next heartbeat (the token is kept so the answer is 'cancelled', not 'lost').
CREATE FUNCTION minion_cancel_task(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task. Completing, failing and reclaiming
    -- lock a subtask, then its task; taking the task first here would deadlock with them.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state IN ('pending', 'leased')
      ORDER BY subtask_id FOR UPDATE;
    UPDATE tasks SET status = 'cancelled', finished_at = now(), split_done = true,
                     cancelled_subtasks = open_subtasks, open_subtasks = 0
     WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT task_id, subtask_id, attempts, lease_executor, lease_token, leased_at, 'cancelled', 'task cancelled'
      FROM subtasks WHERE task_id = p_task_id AND state = 'leased';
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT b.task_id, b.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at, 'cancelled',
           'task cancelled'
      FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
     WHERE b.task_id = p_task_id;
    DELETE FROM subtask_backups WHERE task_id = p_task_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = p_task_id;
    UPDATE subtasks SET state = 'cancelled', lease_executor = NULL
     WHERE task_id = p_task_id AND state IN ('pending', 'leased');
    RETURN true;
END $$;

-- A task's progress, for the API and the CLI: from the task's counters plus its running subtasks
-- (few: one per busy executor), never a scan of all its subtasks (the web UI polls this).
CREATE FUNCTION minion_task_counts(p_task_id bigint,
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
