-- OpenAI's Files and Batches API (/v1): an adapter at the edge. A batch is a Minions task underneath
-- (the same splitter, claims, watchdog and views); the tables hold only what OpenAI's objects carry
-- that a task does not.
--
-- The interactive lane (POST /v1/embeddings, /v1/chat/completions): a request is a one-subtask task
-- above every native priority (native tasks take -1000..1000), split in the same transaction that
-- makes it, whose end is NOTIFYed to the API process that waits for it.

-- Returns the store URI to remove, or NULL when there is no such live file.
CREATE FUNCTION minion_openai_delete_file(p_id text) RETURNS text LANGUAGE sql AS $$
    UPDATE openai_files SET deleted_at = now() WHERE id = p_id AND deleted_at IS NULL RETURNING uri
$$;

-- A batch that passed validation: its task (minion_create_task) and the batch in one step (no task
-- without its batch). The task is named by the batch's id, fresh: a taken name is a unique_violation.
CREATE FUNCTION minion_openai_submit_batch(p_id text, p_team text, p_project text, p_kind text, p_model text,
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

-- Native tasks take priorities -1000..1000 (services/api/tasks/validation.py): the lane is above them all.
CREATE FUNCTION minion_openai_interactive_priority() RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT 10000
$$;

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

-- The interactive lane's task: one subtask (bytes [0, p_bytes) of its input, p_records records), created
-- split (minion_create_task), so the splitter, woken by the task's NOTIFY, finds it split and leaves it.
CREATE FUNCTION minion_openai_submit_interactive(p_team text, p_project text, p_name text,
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

-- Counted by statement triggers, as input_objects and task_inputs are: one UPDATE per team a
-- statement touches, the teams in order. A file stops counting when it is deleted (deleted_at set)
-- or its row goes.
CREATE FUNCTION minion_openai_files_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO team_input_usage AS u (team, bytes)
    SELECT coalesce(a.team::text, ''), sum(a.bytes) FROM added a
     WHERE a.purpose = 'batch' AND a.deleted_at IS NULL
     GROUP BY 1 ORDER BY 1
    ON CONFLICT (team) DO UPDATE SET bytes = u.bytes + excluded.bytes;
    RETURN NULL;
END $$;

CREATE TRIGGER openai_files_added AFTER INSERT ON openai_files REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_added();

CREATE FUNCTION minion_openai_files_removed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(g.team::text, '') AS team, sum(g.bytes) AS bytes
               FROM removed g WHERE g.purpose = 'batch' AND g.deleted_at IS NULL GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER openai_files_removed AFTER DELETE ON openai_files REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_removed();

-- A live file marked deleted gives its bytes back (a deleted one never counts again).
CREATE FUNCTION minion_openai_files_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(o.team::text, '') AS team, sum(o.bytes) AS bytes
               FROM before_rows o JOIN after_rows n ON n.id = o.id
              WHERE o.purpose = 'batch' AND o.deleted_at IS NULL AND n.deleted_at IS NOT NULL
              GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER openai_files_deleted AFTER UPDATE ON openai_files
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_deleted();

-- What a file counts is fixed once it is stored: only deleted_at may change.
CREATE FUNCTION minion_openai_file_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the team, purpose and size of file % cannot change', OLD.id USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER openai_files_fixed BEFORE UPDATE ON openai_files
    FOR EACH ROW WHEN (NEW.team IS DISTINCT FROM OLD.team OR NEW.purpose IS DISTINCT FROM OLD.purpose
                       OR NEW.bytes IS DISTINCT FROM OLD.bytes OR (OLD.deleted_at IS NOT NULL
                                                                   AND NEW.deleted_at IS NULL))
    EXECUTE FUNCTION minion_openai_file_fixed();

CREATE FUNCTION minion_openai_add_file(p_id text, p_team text, p_purpose text, p_filename text, p_bytes bigint,
                                       p_uri text, p_created_by bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO openai_files (id, team, purpose, filename, bytes, uri, created_by)
    VALUES (p_id, p_team, p_purpose, p_filename, p_bytes, p_uri, p_created_by)
$$;

-- An upload, within the team's quota (MINIONS_TEAM_INPUT_QUOTA_BYTES, 0: none); the overload above
-- records a batch's output file, which no quota refuses. 'ok', or 'quota_exceeded' and nothing recorded. A
-- 'batch_output' file is never refused: it is a result. The lock is minion_record_input's, so an
-- upload here and one to POST /api/v1/inputs cannot both squeeze under the quota.
CREATE FUNCTION minion_openai_add_file(p_id text, p_team text, p_purpose text, p_filename text, p_bytes bigint,
                                       p_uri text, p_created_by bigint, p_quota bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_purpose = 'batch' AND p_quota > 0 THEN
        PERFORM minion_lock_team_inputs(p_team);
        IF minion_team_input_bytes(p_team) + p_bytes > p_quota THEN
            RETURN 'quota_exceeded';
        END IF;
    END IF;
    INSERT INTO openai_files (id, team, purpose, filename, bytes, uri, created_by)
    VALUES (p_id, p_team, p_purpose, p_filename, p_bytes, p_uri, p_created_by);
    RETURN 'ok';
END $$;
