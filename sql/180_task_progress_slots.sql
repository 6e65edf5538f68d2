-- No hot task row (issue 11). Until now every complete updated its task's row
-- (minion_subtask_closed), so all completes of a task queued on that one row lock until the
-- holder's commit was flushed. Now a close adds to a progress slot of its own: one row per
-- (task, backend pid), so two transactions never write the same slot (a live pid names one
-- backend) and completes of one task run side by side. The task row's counters hold what was
-- folded in: the splitter's additions, and every slot once the task ends (settle, cancel).
-- A task's progress = its row + the sum of its slots (a few rows: one per connection that closed
-- some of its subtasks).
--
-- Ending the task exactly once, without that row: a close that sees (in its snapshot) no subtask
-- left open settles the task itself, under the task row's lock as before. A close that still sees
-- open ones returns at once when one of them is pending, or leased and not being changed right now
-- (not row-locked): that subtask's closer decides later, with a later snapshot. The closer with
-- the latest decision therefore never takes that exit: it sees every other subtask closed
-- (settles) or sees only subtasks whose closers are in flight, which it cannot wait for (they may
-- be waiting for it); it then NOTIFYs 'tasks', and the splitter, holding no subtask lock, waits for
-- them in minion_settle_waiting and settles. Only the tail of a task (its last in-flight completes)
-- takes that path; the splitter's sweep runs it too, so a lost NOTIFY only delays.

CREATE TABLE task_progress_slots (
    task_id      bigint NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    slot         integer NOT NULL,            -- pg_backend_pid() of the writer
    closed       integer NOT NULL DEFAULT 0,  -- subtasks that left the open states (done or failed)
    failed       integer NOT NULL DEFAULT 0,
    records_done bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, slot)
);

-- Tasks whose split is done and that have not ended: what the splitter's settle sweep looks at.
CREATE INDEX tasks_settling ON tasks (id) WHERE split_done AND status IN ('splitting', 'queued', 'running');

-- A task's unfolded progress: its slots summed (zeros when it has none).
CREATE FUNCTION minion_task_slot_sums(p_task_id bigint,
    OUT closed bigint, OUT failed bigint, OUT records_done bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(p.closed), 0), coalesce(sum(p.failed), 0), coalesce(sum(p.records_done), 0)
      FROM task_progress_slots p WHERE p.task_id = p_task_id
$$;

-- Folds a task's slots into its row (the caller holds, or is about to take, the task row's lock).
CREATE FUNCTION minion_task_fold_slots(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    WITH gone AS (DELETE FROM task_progress_slots WHERE task_id = p_task_id RETURNING closed, failed, records_done)
    UPDATE tasks t
       SET open_subtasks = t.open_subtasks - g.closed,
           failed_subtasks = t.failed_subtasks + g.failed,
           records_done = t.records_done + g.records_done
      FROM (SELECT coalesce(sum(closed), 0) AS closed, coalesce(sum(failed), 0) AS failed,
                   coalesce(sum(records_done), 0) AS records_done FROM gone) g
     WHERE t.id = p_task_id AND g.closed + g.failed + g.records_done > 0;
END $$;

-- A task whose last open subtask closed, and whose split is finished, ends here (its slots folded
-- into its row). (Replaces 020's, which read the row's counters alone.)
CREATE OR REPLACE FUNCTION minion_task_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    sums record;
BEGIN
    -- The row lock first: a second settler waits here, then finds the task ended.
    PERFORM 1 FROM tasks WHERE id = p_task_id AND split_done AND status IN ('splitting', 'queued', 'running')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    sums := minion_task_slot_sums(p_task_id);
    IF (SELECT open_subtasks FROM tasks WHERE id = p_task_id) - sums.closed > 0 THEN
        RETURN;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks
       SET status = CASE WHEN failed_subtasks > 0 THEN 'failed' ELSE 'completed' END,
           finished_at = now()
     WHERE id = p_task_id;
END $$;

-- After a close (or the end of a split): settle now if nothing else is open, return when a later
-- closer will decide, else hand the decision to the splitter (see the header).
CREATE FUNCTION minion_task_try_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    SELECT split_done, status, kind, model, priority, open_subtasks INTO t FROM tasks WHERE id = p_task_id;
    IF NOT FOUND OR NOT t.split_done OR t.status NOT IN ('splitting', 'queued', 'running') THEN
        RETURN;  -- not split yet: minion_finish_split decides
    END IF;
    IF t.open_subtasks - (minion_task_slot_sums(p_task_id)).closed <= 0 THEN
        PERFORM minion_task_settle(p_task_id);
        RETURN;
    END IF;
    -- One probe of the queue index (capability, priority and task known).
    PERFORM 1 FROM subtasks s
      WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
        AND s.priority = t.priority AND s.task_id = p_task_id
      LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state = 'leased'
      LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('tasks', p_task_id::text);
END $$;

-- A subtask left the open states (done, or failed for good): counted in this backend's slot.
-- (Replaces 020's, which updated the task row on every close.)
CREATE OR REPLACE FUNCTION minion_subtask_closed(p_task_id bigint, p_failed boolean, p_error text DEFAULT NULL,
                                                 p_records integer DEFAULT 0)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
    VALUES (p_task_id, pg_backend_pid(), 1, p_failed::int, CASE WHEN p_failed THEN 0 ELSE p_records END)
    ON CONFLICT (task_id, slot) DO UPDATE
       SET closed = p.closed + 1, failed = p.failed + EXCLUDED.failed,
           records_done = p.records_done + EXCLUDED.records_done;
    IF p_failed THEN
        -- Rare: the task keeps its first failure's reason.
        UPDATE tasks SET error = p_error WHERE id = p_task_id AND error IS NULL;
    END IF;
    PERFORM minion_task_try_settle(p_task_id);
END $$;

-- The splitter's sweep: tasks whose split is done, that have not ended and have nothing pending.
CREATE FUNCTION minion_settle_candidates(p_limit integer) RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    SELECT t.id FROM tasks t
     WHERE t.split_done AND t.status IN ('splitting', 'queued', 'running')
       AND NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
                          AND s.priority = t.priority AND s.task_id = t.id)
     ORDER BY t.id LIMIT p_limit
$$;

-- Settles one of them once the closes in flight have committed: this session holds no subtask
-- lock (one task per statement), so it may wait for them. Returns whether the task ended.
CREATE FUNCTION minion_settle_waiting(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Waits for each in-flight close, then sees the row as it committed.
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('pending', 'leased') FOR KEY SHARE;
    IF FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    RETURN (SELECT finished_at IS NOT NULL FROM tasks WHERE id = p_task_id);
END $$;

-- (Replaces 020's: the end of a split settles through minion_task_try_settle, and when it cannot
-- decide, wakes the splitter, whose sweep settles it.)
CREATE OR REPLACE FUNCTION minion_finish_split(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks
       SET split_done = true,
           status = CASE WHEN status = 'splitting' THEN 'queued' ELSE status END
     WHERE id = p_task_id AND NOT split_done AND status IN ('splitting', 'queued', 'running');
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    -- Closes that ran before split_done committed could not decide: the sweep after this commit does.
    IF (SELECT finished_at IS NULL FROM tasks WHERE id = p_task_id) THEN
        PERFORM pg_notify('tasks', p_task_id::text);
    END IF;
END $$;

-- (Replaces 020's: clears the task's slots too.)
CREATE OR REPLACE FUNCTION minion_fail_split(p_task_id bigint, p_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- ended meanwhile (a cancel): its committed results stay
    END IF;
    DELETE FROM subtasks WHERE task_id = p_task_id;
    DELETE FROM task_progress_slots WHERE task_id = p_task_id;
    UPDATE tasks
       SET status = 'failed', error = p_error, finished_at = now(), split_done = true, open_subtasks = 0,
           subtasks_total = 0, failed_subtasks = 0, records_done = 0
     WHERE id = p_task_id;
END $$;

-- (Replaces 020's: folds the slots before it counts the cancelled subtasks.)
CREATE OR REPLACE FUNCTION minion_cancel_task(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task. Completing, failing and reclaiming
    -- lock a subtask, then its task; taking the task first here would deadlock with them.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state IN ('pending', 'leased')
      ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks SET status = 'cancelled', finished_at = now(), split_done = true,
                     cancelled_subtasks = open_subtasks, open_subtasks = 0
     WHERE id = p_task_id;
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

-- (Replaces 020's: the row's counters plus the slots.)
CREATE OR REPLACE FUNCTION minion_task_counts(p_task_id bigint,
    OUT subtasks_total bigint, OUT subtasks_pending bigint, OUT subtasks_leased bigint,
    OUT subtasks_done bigint, OUT subtasks_failed bigint, OUT subtasks_cancelled bigint,
    OUT records_done bigint)
LANGUAGE sql STABLE AS $$
    SELECT t.subtasks_total, t.open_subtasks - p.closed - l.leased, l.leased,
           t.subtasks_total - (t.open_subtasks - p.closed) - (t.failed_subtasks + p.failed) - t.cancelled_subtasks,
           t.failed_subtasks + p.failed, t.cancelled_subtasks, t.records_done + p.records_done
      FROM tasks t
     CROSS JOIN LATERAL minion_task_slot_sums(t.id) p
     CROSS JOIN LATERAL (SELECT count(*) AS leased FROM subtasks s
                          WHERE s.task_id = t.id AND s.state = 'leased') l
     WHERE t.id = p_task_id
$$;

-- (Replaces 050's: same columns, the counters read through the slots.)
CREATE OR REPLACE VIEW grafana_tasks AS
SELECT t.team::text AS team,
       t.project::text AS project,
       t.name::text AS task_name,
       t.id AS task_id,
       t.kind,
       t.model,
       t.status,
       CASE WHEN t.status IN ('submitted', 'splitting', 'queued', 'running') THEN 'active'
            ELSE t.status END AS phase,
       t.priority,
       t.split_records AS records,
       -- Scalar subqueries, not a join or minion_task_slot_sums: a view reads its tables with its
       -- owner's rights (a function it calls runs with the reader's, and minions_grafana reads
       -- views only), and the view stays a simple one, so writing to it is refused for want of
       -- the privilege, as before.
       (t.open_subtasks - (SELECT coalesce(sum(s.closed), 0) FROM task_progress_slots s
                            WHERE s.task_id = t.id))::integer AS open_subtasks,
       (t.failed_subtasks + (SELECT coalesce(sum(s.failed), 0) FROM task_progress_slots s
                              WHERE s.task_id = t.id))::integer AS failed_subtasks,
       t.created_at,
       t.started_at,
       t.finished_at,
       t.error
  FROM tasks t;
