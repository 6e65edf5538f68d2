-- A finished task's results run again by others: `minions verify TASK`.
--
-- A spot check catches a lying executor only in the share it checks; once caught (quarantined),
-- its results in open tasks run again (sql/400), while tasks that ended with them only carry a
-- warning. minion_verify_task re-runs those results as a task of their own: the same input ranges
-- (the same input object, or a copy of the kept bytes), kind, model (pinned to the same revision when
-- the task named one; else its first lease pins it, as any task's: the original's pin may have come
-- from the very executor in doubt), params and priority, only the subtasks whose committed result
-- came from an executor now quarantined (or every done subtask, p_all). The caller compares the two
-- tasks' results by record id. A verification task is a task like any: listed, cancelled, deleted
-- as any.

-- The verification task of task p_task_id, named p_name in the same team and project, and how many
-- subtasks it holds. task_id NULL: nothing to verify (subtasks 0), or p_name is taken (subtasks -1).
CREATE FUNCTION minion_verify_task(p_task_id bigint, p_name text, p_all boolean, p_created_by bigint,
                                   OUT task_id bigint, OUT subtasks integer)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
    picked record;
    new_id bigint;
BEGIN
    SELECT * INTO t FROM tasks WHERE id = p_task_id;
    SELECT array_agg(s.byte_start ORDER BY s.subtask_id) AS starts, array_agg(s.byte_end ORDER BY s.subtask_id) AS ends,
           array_agg(s.first_record ORDER BY s.subtask_id) AS firsts, array_agg(s.records ORDER BY s.subtask_id) AS counts,
           count(*)::integer AS n, max(s.byte_end) AS last_byte, sum(s.records)::bigint AS records
      INTO picked
      FROM subtasks s
     WHERE s.task_id = p_task_id AND s.state = 'done'
       AND (p_all OR EXISTS (SELECT 1 FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                              WHERE a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                                AND a.lease_token = s.lease_token AND a.outcome IN ('done', 'unchecked')
                                AND e.quarantined_at IS NOT NULL));
    subtasks := picked.n;
    IF subtasks = 0 THEN
        RETURN;
    END IF;
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts, input_uri,
                       request_hash, created_by)
    VALUES (t.team, t.project, p_name, t.kind,
            CASE WHEN t.fingerprint_from_revision THEN t.model || '@' || t.fingerprint ELSE t.model END,
            t.params, t.priority, t.subtask_size, t.max_attempts, t.input_uri, 'verify:' || t.request_hash,
            p_created_by)
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        subtasks := -1;
        RETURN;
    END IF;
    INSERT INTO task_inputs (task_id, team, data) SELECT new_id, i.team, i.data FROM task_inputs i WHERE i.task_id = p_task_id;
    PERFORM minion_begin_split(new_id);
    PERFORM minion_add_subtasks(new_id, picked.starts, picked.ends, picked.firsts, picked.counts, 0,
                                picked.last_byte, picked.records);
    PERFORM minion_finish_split(new_id);
    task_id := new_id;
END $$;
