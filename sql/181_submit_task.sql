-- Submission is one SQL function (issue 10 item 5), like every other state change: the API no longer
-- runs a raw INSERT ... ON CONFLICT, a re-select and a lookup. A task submitted without its own
-- max_attempts gets the cluster's (minion_max_attempts()).
--
-- A small task can be split in the same transaction (issue 11): the API cuts its inline records
-- (services/splitter/cutter.py, the splitter's own cutter) and passes the subtasks' byte ranges, so
-- they are claimable the moment this commits, with no splitter hop. NULL ranges: the splitter
-- splits it, as before (big inputs, inputs by URI).
--
-- Returns the new task's row, already split when ranges were given; no row when the name is taken
-- (the caller answers like a re-submission).
CREATE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
    p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer, p_input_uri text,
    p_request_hash text, p_created_by bigint,
    p_byte_starts bigint[] DEFAULT NULL, p_byte_ends bigint[] DEFAULT NULL,
    p_first_records bigint[] DEFAULT NULL, p_records integer[] DEFAULT NULL)
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    tid bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by)
    VALUES (p_team, p_project, p_name, p_kind, p_model, p_params, p_priority, p_subtask_size,
            coalesce(p_max_attempts, minion_max_attempts()), p_input_uri, p_request_hash, p_created_by)
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO tid;
    IF tid IS NULL THEN
        RETURN;
    END IF;
    IF p_byte_starts IS NOT NULL AND cardinality(p_byte_starts) > 0 THEN
        PERFORM minion_begin_split(tid);
        PERFORM minion_add_subtasks(tid, p_byte_starts, p_byte_ends, p_first_records, p_records, 0,
                                    p_byte_ends[cardinality(p_byte_ends)],
                                    (SELECT sum(r) FROM unnest(p_records) AS r));
        PERFORM minion_finish_split(tid);
    END IF;
    RETURN QUERY SELECT * FROM tasks WHERE id = tid;
END $$;
