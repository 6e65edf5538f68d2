-- A complete's "anything still pending?" probe reads the task's queue from its tail (issue 11).
--
-- Every close (minion_task_try_settle, 220's) asks whether its task still has a pending subtask: one
-- probe of the queue index, LIMIT 1. It read the task's range from its head, where claims take
-- their subtasks: every subtask claimed since the last vacuum leaves a dead entry there, each one
-- visited before the first live one. So the probe grew with the subtasks already claimed, at every
-- close. bench/drain.py's sql-new arm at 20,000 subtasks (pg_stat_statements): 165 buffers and
-- 2.85 ms per probe, 43% of all statement time, and the arm drained slower than the hot-row
-- baseline it replaced (464/s against 500/s, medians of 3).
--
-- Claims go in subtask order, so the subtasks not yet claimed are the range's tail: read backwards,
-- the probe finds a live entry at once while the task has any. Once the last subtask has been
-- claimed it walks the dead entries as before, for the closes of the last leases only. The same
-- answer (is there one?), read from the other end.

-- (Replaces 220's: the probe reads backwards; nothing else changes.)
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
    -- One probe of the queue index (capability, priority and task known), from the tail.
    PERFORM 1 FROM subtasks s
      WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
        AND s.priority = t.priority AND s.task_id = p_task_id
      ORDER BY s.subtask_id DESC LIMIT 1;
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
