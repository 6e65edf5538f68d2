-- The splitter settles the tasks a notification names, not every open task at every wake (issue 11).
--
-- Every notification on 'tasks' woke the splitter's workers to sweep: minion_settle_candidates reads
-- every open task that is split, one probe of the queue index each. Every submission notifies (the
-- insert's trigger), so each submission cost each worker one probe per task waiting in the queue:
-- O(tasks queued) per submission, twice over with two workers. With a few thousand small tasks
-- queued, the sweeps of a steady stream of submissions kept both cores busy and the POSTs slowed
-- down with them (BENCHMARKS.md, "Drain, seventh round").
--
-- Each notification names its task: a new task (010's trigger), a close that could not decide the
-- task's end (180's hand-off), a split's end (180's minion_finish_split). The workers now look at
-- those tasks only, through minion_settle_candidates_among; the sweep of every open task stays, on
-- start, after a reconnect and every sweep interval: the safety net for a notification lost.
--
-- What "may have ended" means is written once, as a view both read.

CREATE VIEW minion_tasks_to_settle AS
    SELECT t.id FROM tasks t
     WHERE t.split_done AND t.status IN ('splitting', 'queued', 'running')
       AND NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
                          AND s.priority = t.priority AND s.task_id = t.id);

-- (Replaces 180's: the same tasks, read through the view.)
CREATE OR REPLACE FUNCTION minion_settle_candidates(p_limit integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM minion_tasks_to_settle ORDER BY id LIMIT p_limit
$$;

-- Those of the named tasks that may have ended: a primary-key probe each.
CREATE FUNCTION minion_settle_candidates_among(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM minion_tasks_to_settle WHERE id = ANY (p_ids) ORDER BY id
$$;
