-- The interactive lane (POST /v1/embeddings, /v1/chat/completions; issue 13.3): a request is a
-- one-subtask task above every native priority, split by the API in the same transaction that makes
-- it (no round trip through the splitter), whose end is NOTIFYed to the API process that waits for it.

-- Native tasks take priorities -1000..1000 (services/api/validation.py): the lane is above them all.
CREATE FUNCTION minion_openai_interactive_priority() RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT 10000
$$;

-- The task, its one subtask (bytes [0, p_bytes) of its input, p_records records) and the split's end,
-- in one step: the splitter, woken by the task's NOTIFY, finds it already split and leaves it.
CREATE FUNCTION minion_openai_submit_interactive(p_team text, p_project text, p_name text, p_kind text,
    p_model text, p_params jsonb, p_max_attempts integer, p_input_uri text, p_bytes bigint, p_records integer,
    p_created_by bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by)
    VALUES (p_team, p_project, p_name, p_kind, p_model, p_params, minion_openai_interactive_priority(),
            greatest(p_records, 1), p_max_attempts, p_input_uri, p_name, p_created_by)
    RETURNING id INTO v_task;
    PERFORM minion_begin_split(v_task);
    PERFORM minion_add_subtasks(v_task, ARRAY[0::bigint], ARRAY[p_bytes], ARRAY[0::bigint], ARRAY[p_records],
                                0, p_bytes, p_records::bigint);
    PERFORM minion_finish_split(v_task);
    RETURN v_task;
END $$;

-- task_ended: the end of an interactive task (payload: its id), for the API process whose handler
-- waits on it. Only the lane's tasks notify: a NOTIFY serialises commits cluster-wide, and batch
-- work needs no such wake-up.
CREATE FUNCTION minion_notify_interactive_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('task_ended', NEW.id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER tasks_notify_interactive_ended AFTER UPDATE OF finished_at ON tasks
    FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL
                       AND NEW.priority = 10000)
    EXECUTE FUNCTION minion_notify_interactive_ended();
