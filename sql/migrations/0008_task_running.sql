-- A task's subtasks being worked on now, apart from those claimed ahead (subtasks.running of a
-- task in the API).

-- How many of a task's leased subtasks are being worked on now. An agent claims ahead of its work
-- (agents/macos/claim_depth.py) and runs its leases one at a time, in claim order: of an
-- executor's leases the oldest is the one it works on, the others wait behind it. The rest of
-- the task's leased subtasks are claimed ahead (leased - running), not running.
CREATE FUNCTION minion_task_running(p_task_id bigint) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM subtasks s
     WHERE s.task_id = p_task_id AND s.state = 'leased'
       AND NOT EXISTS (SELECT 1 FROM subtasks o
                        WHERE o.lease_executor = s.lease_executor AND o.state = 'leased'
                          AND (o.leased_at, o.task_id, o.subtask_id) < (s.leased_at, s.task_id, s.subtask_id))
$$;
