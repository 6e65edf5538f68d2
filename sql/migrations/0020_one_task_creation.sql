-- One SQL entry creates every task: minion_create_task, shared by the API's submission, the OpenAI
-- adapter's batches and interactive requests, and verification (each had an INSERT of its own, and
-- minion_submit_task two overloads). The short overload of minion_submit_task goes; the API's keeps
-- its signature, with defaults for what a plain submission leaves out, and places the task in its very insert.
CREATE FUNCTION minion_create_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
    p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer, p_input_uri text,
    p_request_hash text, p_created_by bigint, p_placement text DEFAULT 'any',
    p_byte_starts bigint[] DEFAULT NULL, p_byte_ends bigint[] DEFAULT NULL,
    p_first_records bigint[] DEFAULT NULL, p_records integer[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(p_byte_starts), 0);
    tid bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by, placement,
                       status, split_done, open_subtasks, subtasks_total, split_offset, split_records)
    VALUES (p_team, p_project, p_name, p_kind, p_model, p_params, p_priority, p_subtask_size,
            coalesce(p_max_attempts, minion_max_attempts()), p_input_uri, p_request_hash, p_created_by, p_placement,
            CASE WHEN n > 0 THEN 'queued' ELSE 'submitted' END, n > 0, n, n,
            CASE WHEN n > 0 THEN p_byte_ends[n] ELSE 0 END,
            CASE WHEN n > 0 THEN (SELECT sum(r) FROM unnest(p_records) AS r) ELSE 0 END)
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO tid;
    IF tid IS NOT NULL AND n > 0 THEN
        INSERT INTO subtasks (task_id, subtask_id, team, project, task_name, capability, priority,
                              byte_start, byte_end, first_record, records)
        SELECT tid, i - 1, p_team, p_project, p_name, minion_capability(p_kind, p_model), p_priority,
               p_byte_starts[i], p_byte_ends[i], p_first_records[i], p_records[i]
          FROM generate_subscripts(p_byte_starts, 1) AS i;
    END IF;
    RETURN tid;
END $$;

DROP FUNCTION minion_submit_task(text, text, text, text, text, jsonb, integer, integer, integer, text, text, bigint,
                                 bigint[], bigint[], bigint[], integer[]);

CREATE OR REPLACE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
    p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer, p_input_uri text,
    p_request_hash text, p_created_by bigint, p_byte_starts bigint[] DEFAULT NULL, p_byte_ends bigint[] DEFAULT NULL,
    p_first_records bigint[] DEFAULT NULL, p_records integer[] DEFAULT NULL, p_input_data bytea DEFAULT NULL,
    p_input_quota bigint DEFAULT 0, p_placement text DEFAULT 'any')
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    tid bigint;
BEGIN
    IF p_input_data IS NOT NULL AND NOT coalesce(p_input_uri IS NULL AND cardinality(p_byte_ends) > 0
                                                 AND p_byte_ends[cardinality(p_byte_ends)] = length(p_input_data),
                                                 false) THEN
        RAISE EXCEPTION 'a kept input needs no input_uri and the subtasks of all its bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Placed in this very insert: no claim can see the task before it is placed.
    tid := minion_create_task(p_team, p_project, p_name, p_kind, p_model, p_params, p_priority, p_subtask_size,
                              p_max_attempts, p_input_uri, p_request_hash, p_created_by, p_placement,
                              p_byte_starts, p_byte_ends, p_first_records, p_records);
    IF tid IS NULL THEN
        RETURN;  -- the name is taken: answered as a re-submission, quota or not
    END IF;
    IF p_input_data IS NOT NULL THEN
        -- Last, so the team's count is held locked for as little as can be.
        IF p_input_quota > 0 THEN
            PERFORM minion_lock_team_inputs(p_team);
            IF minion_team_input_bytes(p_team) + length(p_input_data) > p_input_quota THEN
                RAISE EXCEPTION 'quota_exceeded' USING ERRCODE = 'configuration_limit_exceeded';
            END IF;
        END IF;
        INSERT INTO task_inputs (task_id, team, data) VALUES (tid, p_team, p_input_data);
    END IF;
    RETURN QUERY SELECT * FROM tasks WHERE id = tid;
END $$;

CREATE OR REPLACE FUNCTION minion_openai_submit_batch(p_id text, p_team text, p_project text, p_kind text, p_model text,
    p_params jsonb, p_subtask_size integer, p_max_attempts integer, p_input_uri text, p_endpoint text,
    p_input_file_id text, p_window text, p_window_s double precision, p_metadata jsonb,
    p_request_total integer, p_record_total integer, p_created_by bigint, p_priority integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    -- metadata.placement 'trusted' (checked by the API): only vouched executors lease it.
    v_task := minion_create_task(p_team, p_project, p_id, p_kind, p_model, p_params, p_priority, p_subtask_size,
                                 p_max_attempts, p_input_uri, p_id, p_created_by,
                                 CASE WHEN p_metadata ->> 'placement' = 'trusted' THEN 'trusted' ELSE 'any' END);
    IF v_task IS NULL THEN
        RAISE EXCEPTION 'task % already exists', p_id USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO openai_batches (id, team, task_id, endpoint, input_file_id, completion_window, metadata,
                                request_total, record_total, created_by, in_progress_at, expires_at)
    VALUES (p_id, p_team, v_task, p_endpoint, p_input_file_id, p_window, p_metadata, p_request_total,
            p_record_total, p_created_by, now(), now() + make_interval(secs => p_window_s));
    RETURN v_task;
END $$;

CREATE OR REPLACE FUNCTION minion_openai_submit_interactive(p_team text, p_project text, p_name text,
    p_kind text, p_model text, p_params jsonb, p_max_attempts integer, p_input_uri text, p_bytes bigint,
    p_records integer, p_created_by bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    v_task := minion_create_task(p_team, p_project, p_name, p_kind, p_model, p_params,
                                 minion_openai_interactive_priority(), greatest(p_records, 1), p_max_attempts,
                                 p_input_uri, p_name, p_created_by, 'any',
                                 ARRAY[0::bigint], ARRAY[p_bytes], ARRAY[0::bigint], ARRAY[p_records]);
    IF v_task IS NULL THEN  -- the lane's names are fresh uuids
        RAISE EXCEPTION 'task % already exists', p_name USING ERRCODE = 'unique_violation';
    END IF;
    RETURN v_task;
END $$;

CREATE OR REPLACE FUNCTION minion_verify_task(p_task_id bigint, p_name text, p_all boolean, p_created_by bigint,
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
                                AND (e.quarantined_at IS NOT NULL OR a.outcome = 'unchecked'
                                     OR (NOT minion_executor_vouched(e.id)
                                         AND NOT EXISTS (SELECT 1 FROM subtask_attempts v
                                                          WHERE v.task_id = s.task_id AND v.subtask_id = s.subtask_id
                                                            AND v.attempt = a.attempt AND v.outcome = 'agreed'
                                                            AND minion_executor_vouched(v.executor_id))))));
    subtasks := picked.n;
    IF subtasks = 0 THEN
        RETURN;
    END IF;
    new_id := minion_create_task(t.team, t.project, p_name, t.kind,
                                 CASE WHEN t.fingerprint_from_revision THEN t.model || '@' || t.fingerprint
                                      ELSE t.model END,
                                 t.params, t.priority, t.subtask_size, t.max_attempts, t.input_uri,
                                 'verify:' || t.request_hash, p_created_by, 'trusted');
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

