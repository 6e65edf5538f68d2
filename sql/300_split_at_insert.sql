-- A task split at submission is inserted split (issue 11, submit -> first lease).
--
-- A small task (sql/181: its inline records cut by the API) and an interactive request (sql/141) were
-- inserted unsplit, then split in the same transaction through the splitter's three steps:
-- minion_begin_split, minion_add_subtasks and minion_finish_split. That is three updates of the row
-- just inserted, a settle of a task whose subtasks are all pending, and two NOTIFYs on 'tasks' (the
-- insert's trigger, the split's end) that woke every splitter worker, on the cores the claim that
-- follows needs, for a task none of them had anything to do with.
--
-- No close can see the task before this transaction commits, so nothing is left to settle and no
-- splitter needs to hear of it. The task is now inserted with its split done and its counters set,
-- and its subtasks in one more insert (whose statement trigger still wakes the claims, sql/010). The
-- 'tasks' NOTIFY of an insert is for unsplit tasks only: those are what the splitter splits.
-- BENCHMARKS.md, "Drain, eighth round": the submit statement took 4.27 ms of the submit -> lease flow
-- before, 3.15 ms after.
-- The splitter's own split (big inputs, inputs by URI) keeps the three steps: closes can run while it
-- splits.

-- (Replaces 010's trigger: an insert notifies the splitter only of a task it has to split.)
DROP TRIGGER tasks_notify ON tasks;
CREATE TRIGGER tasks_notify AFTER INSERT ON tasks
    FOR EACH ROW WHEN (NOT NEW.split_done) EXECUTE FUNCTION minion_notify_task();

-- (Replaces 181's: one insert of the task, split when ranges are given; the rest is unchanged.)
CREATE OR REPLACE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text,
    p_model text, p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer,
    p_input_uri text, p_request_hash text, p_created_by bigint,
    p_byte_starts bigint[] DEFAULT NULL, p_byte_ends bigint[] DEFAULT NULL,
    p_first_records bigint[] DEFAULT NULL, p_records integer[] DEFAULT NULL)
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(p_byte_starts), 0);
    tid bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by,
                       status, split_done, open_subtasks, subtasks_total, split_offset, split_records)
    VALUES (p_team, p_project, p_name, p_kind, p_model, p_params, p_priority, p_subtask_size,
            coalesce(p_max_attempts, minion_max_attempts()), p_input_uri, p_request_hash, p_created_by,
            CASE WHEN n > 0 THEN 'queued' ELSE 'submitted' END, n > 0, n, n,
            CASE WHEN n > 0 THEN p_byte_ends[n] ELSE 0 END,
            CASE WHEN n > 0 THEN (SELECT sum(r) FROM unnest(p_records) AS r) ELSE 0 END)
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO tid;
    IF tid IS NULL THEN
        RETURN;
    END IF;
    IF n > 0 THEN
        INSERT INTO subtasks (task_id, subtask_id, team, project, task_name, capability, priority,
                              byte_start, byte_end, first_record, records)
        SELECT tid, i - 1, p_team, p_project, p_name, minion_capability(p_kind, p_model), p_priority,
               p_byte_starts[i], p_byte_ends[i], p_first_records[i], p_records[i]
          FROM generate_subscripts(p_byte_starts, 1) AS i;
    END IF;
    RETURN QUERY SELECT * FROM tasks WHERE id = tid;
END $$;

-- (Replaces 141's: the lane's task is a submission of one subtask, split at insert like any other.)
CREATE OR REPLACE FUNCTION minion_openai_submit_interactive(p_team text, p_project text, p_name text,
    p_kind text, p_model text, p_params jsonb, p_max_attempts integer, p_input_uri text, p_bytes bigint,
    p_records integer, p_created_by bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    SELECT id INTO v_task
      FROM minion_submit_task(p_team, p_project, p_name, p_kind, p_model, p_params,
                              minion_openai_interactive_priority(), greatest(p_records, 1), p_max_attempts,
                              p_input_uri, p_name, p_created_by,
                              ARRAY[0::bigint], ARRAY[p_bytes], ARRAY[0::bigint], ARRAY[p_records]);
    IF NOT FOUND THEN  -- as the plain insert it replaces did: the lane's names are fresh uuids
        RAISE EXCEPTION 'task % already exists', p_name USING ERRCODE = 'unique_violation';
    END IF;
    RETURN v_task;
END $$;
