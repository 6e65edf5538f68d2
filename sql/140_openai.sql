-- OpenAI's Files and Batches API (/v1, issue 13): an adapter at the edge. A batch is a Minions task
-- underneath (the same splitter, claims, watchdog and views); these tables hold only what OpenAI's
-- objects carry that a task does not: file names and purposes, the batch's window, its validation
-- errors, its output and error files and its request counts.

CREATE TABLE openai_files (
    id          text PRIMARY KEY,                 -- 'file-<hex>'
    seq         bigserial UNIQUE,                 -- listing order
    team        minion_name,                      -- the uploading token's team; NULL: an unscoped token
    purpose     text NOT NULL,
    filename    text NOT NULL,
    bytes       bigint NOT NULL CHECK (bytes >= 0),
    uri         text NOT NULL,                    -- where the store holds it
    created_by  bigint REFERENCES api_tokens (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);
CREATE INDEX openai_files_live ON openai_files (seq) WHERE deleted_at IS NULL;

CREATE TABLE openai_batches (
    id                 text PRIMARY KEY,          -- 'batch_<hex>'
    seq                bigserial UNIQUE,          -- listing order
    team               minion_name,
    task_id            bigint UNIQUE REFERENCES tasks (id),  -- NULL for a batch that failed validation
    endpoint           text NOT NULL,
    input_file_id      text NOT NULL REFERENCES openai_files (id),
    completion_window  text NOT NULL,
    metadata           jsonb,
    errors             jsonb,                     -- validation errors: [{"code","message","param","line"}]
    request_total      integer NOT NULL DEFAULT 0,
    record_total       integer NOT NULL DEFAULT 0,  -- task records (a list input is several)
    request_completed  integer,                   -- known once finalized
    request_failed     integer,
    output_file_id     text REFERENCES openai_files (id),
    error_file_id      text REFERENCES openai_files (id),
    ending             text CHECK (ending IN ('cancel', 'expire')),
    created_by         bigint REFERENCES api_tokens (id),
    created_at         timestamptz NOT NULL DEFAULT now(),
    in_progress_at     timestamptz,
    expires_at         timestamptz NOT NULL,
    finalizing_at      timestamptz,
    completed_at       timestamptz,
    failed_at          timestamptz,
    expired_at         timestamptz,
    cancelling_at      timestamptz,
    cancelled_at       timestamptz
);
-- The finalizer's work list: batches not yet ended.
CREATE INDEX openai_batches_open ON openai_batches (seq)
    WHERE completed_at IS NULL AND failed_at IS NULL AND expired_at IS NULL AND cancelled_at IS NULL;

CREATE FUNCTION minion_openai_add_file(p_id text, p_team text, p_purpose text, p_filename text, p_bytes bigint,
                                       p_uri text, p_created_by bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO openai_files (id, team, purpose, filename, bytes, uri, created_by)
    VALUES (p_id, p_team, p_purpose, p_filename, p_bytes, p_uri, p_created_by)
$$;

-- Returns the store URI to remove, or NULL when there is no such live file.
CREATE FUNCTION minion_openai_delete_file(p_id text) RETURNS text LANGUAGE sql AS $$
    UPDATE openai_files SET deleted_at = now() WHERE id = p_id AND deleted_at IS NULL RETURNING uri
$$;

-- A batch that passed validation: its task and the batch in one step (no task without its batch).
CREATE FUNCTION minion_openai_submit_batch(p_id text, p_team text, p_project text, p_kind text, p_model text,
    p_params jsonb, p_subtask_size integer, p_max_attempts integer, p_input_uri text, p_endpoint text,
    p_input_file_id text, p_window text, p_window_s double precision, p_metadata jsonb,
    p_request_total integer, p_record_total integer, p_created_by bigint, p_priority integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by)
    VALUES (p_team, p_project, p_id, p_kind, p_model, p_params, p_priority, p_subtask_size, p_max_attempts,
            p_input_uri, p_id, p_created_by)
    RETURNING id INTO v_task;
    INSERT INTO openai_batches (id, team, task_id, endpoint, input_file_id, completion_window, metadata,
                                request_total, record_total, created_by, in_progress_at, expires_at)
    VALUES (p_id, p_team, v_task, p_endpoint, p_input_file_id, p_window, p_metadata, p_request_total,
            p_record_total, p_created_by, now(), now() + make_interval(secs => p_window_s));
    RETURN v_task;
END $$;

-- A batch whose input file failed validation: no task, the errors kept.
CREATE FUNCTION minion_openai_reject_batch(p_id text, p_team text, p_endpoint text, p_input_file_id text,
    p_window text, p_window_s double precision, p_metadata jsonb, p_errors jsonb, p_request_total integer,
    p_created_by bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO openai_batches (id, team, endpoint, input_file_id, completion_window, metadata, errors,
                                request_total, request_completed, request_failed, created_by, expires_at,
                                failed_at)
    VALUES (p_id, p_team, p_endpoint, p_input_file_id, p_window, p_metadata, p_errors, p_request_total, 0, 0,
            p_created_by, now() + make_interval(secs => p_window_s), now())
$$;

-- Cancel or expire (p_ending): the task is cancelled (its finished part stays committed) and the
-- batch waits for its files. False when the batch has already ended or is ending.
CREATE FUNCTION minion_openai_end_batch(p_id text, p_ending text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    UPDATE openai_batches
       SET ending = p_ending,
           cancelling_at = CASE WHEN p_ending = 'cancel' THEN now() ELSE cancelling_at END
     WHERE id = p_id AND ending IS NULL AND task_id IS NOT NULL AND finalizing_at IS NULL
       AND completed_at IS NULL AND failed_at IS NULL AND expired_at IS NULL AND cancelled_at IS NULL
    RETURNING task_id INTO v_task;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_cancel_task(v_task);  -- false when the task had just ended: the batch ends as it did
    RETURN true;
END $$;

-- One finalizer at a time per batch: true for the caller that takes it (or retakes one left for
-- p_stale_s, its finalizer having died).
CREATE FUNCTION minion_openai_begin_finalize(p_id text, p_stale_s double precision) RETURNS boolean
LANGUAGE sql AS $$
    UPDATE openai_batches b SET finalizing_at = now()
      FROM tasks t
     WHERE b.id = p_id AND t.id = b.task_id AND t.finished_at IS NOT NULL
       AND b.completed_at IS NULL AND b.failed_at IS NULL AND b.expired_at IS NULL AND b.cancelled_at IS NULL
       AND (b.finalizing_at IS NULL OR b.finalizing_at < now() - make_interval(secs => p_stale_s))
    RETURNING true
$$;

-- The output and error files are written: the batch ends completed, cancelled or expired.
CREATE FUNCTION minion_openai_finish_batch(p_id text, p_output_file_id text, p_error_file_id text,
                                           p_completed integer, p_failed integer)
RETURNS void LANGUAGE sql AS $$
    UPDATE openai_batches
       SET output_file_id = p_output_file_id, error_file_id = p_error_file_id,
           request_completed = p_completed, request_failed = p_failed,
           completed_at = CASE WHEN ending IS NULL THEN now() END,
           cancelled_at = CASE WHEN ending = 'cancel' THEN now() END,
           expired_at = CASE WHEN ending = 'expire' THEN now() END
     WHERE id = p_id AND completed_at IS NULL AND cancelled_at IS NULL AND expired_at IS NULL
$$;
