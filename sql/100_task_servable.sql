-- Whether any online executor can serve a task: one whose capabilities hold the task's 'kind:model'
-- and whose token may claim the task's team (an unscoped executor claims every team). A read, not a
-- state change: the API reports a task no executor can serve (`warnings` on the task object) instead
-- of leaving it queued with no hint.
CREATE FUNCTION minion_task_servable(p_team text, p_kind text, p_model text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM executors e
         WHERE e.status = 'online'
           AND minion_capability(p_kind, p_model) = ANY (e.capabilities)
           AND (e.team IS NULL OR e.team = p_team)
    )
$$;
