-- Task lifecycle: submission, splitting, settling, cancelling. Each function is one atomic step.
--
-- Progress without a hot task row: a close adds to a progress slot of its own (task_progress_slots),
-- so completes of one task run side by side. A task's progress = its row + the sum of its slots (a
-- few rows: one per connection that closed some of its subtasks).
--
-- Ending the task exactly once, without that row: a close that sees (in its snapshot) no subtask
-- left open settles the task itself, under the task row's lock. A close that still sees open ones
-- returns at once when one of them is pending, or in flight and not being changed right now (not
-- row-locked): that subtask's closer decides later, with a later snapshot. The closer with the
-- latest decision therefore never takes that exit: it sees every other subtask closed (settles) or
-- sees only subtasks whose closers are in flight, which it cannot wait for (they may be waiting for
-- it); it then NOTIFYs 'tasks', and the splitter, holding no subtask lock, waits for them in
-- minion_settle_waiting and settles. Only the tail of a task (its last in-flight completes) takes
-- that path; the splitter's sweep runs it too, so a lost NOTIFY only delays.

-- What an executor must advertise to be handed a subtask: 'kind:model', or 'sleep:*' (the synthetic
-- workload needs no model). A model named with a revision is claimed as the model itself:
-- 'kind:name@revision' is 'kind:name' (the revision pins the task's fingerprint instead).
CREATE FUNCTION minion_capability(p_kind text, p_model text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_kind = 'sleep' THEN 'sleep:*'
                WHEN strpos(p_model, '@') = 0 THEN p_kind || ':' || p_model
                ELSE p_kind || ':' || regexp_replace(p_model, '@[^@]*$', '') END
$$;

CREATE FUNCTION minion_output_key(p_task_id bigint, p_subtask_id integer, p_attempt integer, p_token uuid)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'outputs/' || p_task_id::text || '/' || p_subtask_id::text || '/' || p_attempt::text || '-'
           || p_token::text || '.jsonl'
$$;

-- The splitter takes a task: returns where to resume (a crashed split resumes, never restarts,
-- because its first subtasks may already be leased). NULL when the task is no longer splittable.
CREATE FUNCTION minion_begin_split(p_task_id bigint,
    OUT split_offset bigint, OUT split_records bigint, OUT next_subtask_id integer)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks t SET status = CASE WHEN t.status = 'submitted' THEN 'splitting' ELSE t.status END
     WHERE t.id = p_task_id AND NOT t.split_done AND t.status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING t.split_offset, t.split_records INTO split_offset, split_records;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT coalesce(max(s.subtask_id) + 1, 0) INTO next_subtask_id FROM subtasks s WHERE s.task_id = p_task_id;
END $$;

-- One batch of subtasks, and the split's progress, in one statement's worth of work.
-- Returns false (and inserts nothing) when the task was cancelled or failed meanwhile.
CREATE FUNCTION minion_add_subtasks(p_task_id bigint, p_byte_starts bigint[], p_byte_ends bigint[],
    p_first_records bigint[], p_records integer[], p_first_subtask_id integer,
    p_split_offset bigint, p_split_records bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
    n integer := cardinality(p_byte_starts);
BEGIN
    SELECT * INTO t FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('submitted', 'splitting', 'queued', 'running') OR t.split_done THEN
        RETURN false;
    END IF;
    INSERT INTO subtasks (task_id, subtask_id, team, project, task_name, capability, priority,
                          byte_start, byte_end, first_record, records)
    SELECT p_task_id, p_first_subtask_id + i - 1, t.team, t.project, t.name,
           minion_capability(t.kind, t.model), t.priority,
           p_byte_starts[i], p_byte_ends[i], p_first_records[i], p_records[i]
      FROM generate_subscripts(p_byte_starts, 1) AS i;
    UPDATE tasks SET open_subtasks = open_subtasks + n,
                     subtasks_total = subtasks_total + n,
                     split_offset = p_split_offset,
                     split_records = p_split_records
     WHERE id = p_task_id;
    RETURN true;
END $$;

CREATE FUNCTION minion_task_servable(p_team text, p_kind text, p_model text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM executors e
         WHERE e.status = 'online'
           AND minion_capability(p_kind, p_model) = ANY (e.capabilities)
           AND (e.team IS NULL OR e.team = p_team)
    )
$$;

-- A task's unfolded progress: its slots summed (zeros when it has none).
CREATE FUNCTION minion_task_slot_sums(p_task_id bigint,
    OUT closed bigint, OUT failed bigint, OUT records_done bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(p.closed), 0), coalesce(sum(p.failed), 0), coalesce(sum(p.records_done), 0)
      FROM task_progress_slots p WHERE p.task_id = p_task_id
$$;

-- Folds a task's slots into its row (the caller holds, or is about to take, the task row's lock).
CREATE FUNCTION minion_task_fold_slots(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    WITH gone AS (DELETE FROM task_progress_slots WHERE task_id = p_task_id RETURNING closed, failed, records_done)
    UPDATE tasks t
       SET open_subtasks = t.open_subtasks - g.closed,
           failed_subtasks = t.failed_subtasks + g.failed,
           records_done = t.records_done + g.records_done
      FROM (SELECT coalesce(sum(closed), 0) AS closed, coalesce(sum(failed), 0) AS failed,
                   coalesce(sum(records_done), 0) AS records_done FROM gone) g
     WHERE t.id = p_task_id AND g.closed + g.failed + g.records_done > 0;
END $$;

-- A task whose last open subtask closed, and whose split is finished, ends here, its progress slots
-- folded into its row.
CREATE FUNCTION minion_task_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    sums record;
BEGIN
    -- The row lock first: a second settler waits here, then finds the task ended.
    PERFORM 1 FROM tasks WHERE id = p_task_id AND split_done AND status IN ('splitting', 'queued', 'running')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    sums := minion_task_slot_sums(p_task_id);
    IF (SELECT open_subtasks FROM tasks WHERE id = p_task_id) - sums.closed > 0 THEN
        RETURN;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks
       SET status = CASE WHEN failed_subtasks > 0 THEN 'failed' ELSE 'completed' END,
           finished_at = now()
     WHERE id = p_task_id;
END $$;

-- A subtask left the open states (done, or failed for good): counted in this backend's progress slot
-- (never the task row, which every close would otherwise queue on), then the task may settle.
CREATE FUNCTION minion_subtask_closed(p_task_id bigint, p_failed boolean, p_error text DEFAULT NULL,
                                                 p_records integer DEFAULT 0)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
    VALUES (p_task_id, pg_backend_pid(), 1, p_failed::int, CASE WHEN p_failed THEN 0 ELSE p_records END)
    ON CONFLICT (task_id, slot) DO UPDATE
       SET closed = p.closed + 1, failed = p.failed + EXCLUDED.failed,
           records_done = p.records_done + EXCLUDED.records_done;
    IF p_failed THEN
        -- Rare: the task keeps its first failure's reason.
        UPDATE tasks SET error = p_error WHERE id = p_task_id AND error IS NULL;
    END IF;
    PERFORM minion_task_try_settle(p_task_id);
END $$;

-- The split's end: the task's subtask total is final. It settles through minion_task_try_settle, and
-- when that cannot decide, wakes the splitter, whose sweep settles it.
CREATE FUNCTION minion_finish_split(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks
       SET split_done = true,
           status = CASE WHEN status = 'splitting' THEN 'queued' ELSE status END
     WHERE id = p_task_id AND NOT split_done AND status IN ('splitting', 'queued', 'running');
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    -- Closes that ran before split_done committed could not decide: the sweep after this commit does.
    IF (SELECT finished_at IS NULL FROM tasks WHERE id = p_task_id) THEN
        PERFORM pg_notify('tasks', p_task_id::text);
    END IF;
END $$;

-- A malformed input fails the task and leaves no subtasks (nor progress slots) behind: any already
-- leased become stale, their tokens vanish with them, so a late complete gets 409.
CREATE FUNCTION minion_fail_split(p_task_id bigint, p_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- ended meanwhile (a cancel): its committed results stay
    END IF;
    DELETE FROM subtasks WHERE task_id = p_task_id;
    DELETE FROM task_progress_slots WHERE task_id = p_task_id;
    UPDATE tasks
       SET status = 'failed', error = p_error, finished_at = now(), split_done = true, open_subtasks = 0,
           subtasks_total = 0, failed_subtasks = 0, records_done = 0
     WHERE id = p_task_id;
END $$;

CREATE VIEW minion_tasks_to_settle AS
    SELECT t.id FROM tasks t
     WHERE t.split_done AND t.status IN ('splitting', 'queued', 'running')
       AND NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
                          AND s.priority = t.priority AND s.task_id = t.id);

-- The splitter's sweep: tasks whose split is done, that have not ended and have nothing pending
-- (the view minion_tasks_to_settle).
CREATE FUNCTION minion_settle_candidates(p_limit integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM minion_tasks_to_settle ORDER BY id LIMIT p_limit
$$;

-- Those of the named tasks that may have ended: a primary-key probe each.
CREATE FUNCTION minion_settle_candidates_among(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM minion_tasks_to_settle WHERE id = ANY (p_ids) ORDER BY id
$$;

-- Every task is created here, whoever asks (a submission, an OpenAI batch or request, a verification):
-- one INSERT with the cluster's max_attempts for a task without its own. Given its subtasks' byte ranges
-- it is created already split, its subtasks in the same transaction and claimable the moment this
-- commits, with no splitter hop; NULL ranges: the splitter splits it. Returns the new task's id, or
-- NULL when the name is taken (each caller answers that its own way).
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

-- The API's submission: minion_create_task, and the inline records themselves when they are kept in
-- the database (p_input_data; p_input_uri is then NULL, and the task must be split now: p_input_data's
-- ranges are given, and they end where its bytes do; the splitter never reads a kept input).
-- p_input_quota: the team's quota of stored input bytes (MINIONS_TEAM_INPUT_QUOTA_BYTES, 0: none),
-- which kept inputs count against like objects: a kept input past it raises 'quota_exceeded' (SQLSTATE
-- 53400), and nothing is committed. p_placement: who may lease it (tasks.placement). Returns the new
-- task's row; no row when the name is taken (the caller answers like a re-submission).
CREATE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
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

-- Cancel: pending, leased and checking subtasks become cancelled at once (a checking one's held
-- results are dropped); a leased one's executor learns it at its next heartbeat (the token is kept so
-- the answer is 'cancelled', not 'lost'). The slots are folded before the cancelled are counted.
CREATE FUNCTION minion_cancel_task(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task. Completing, failing and reclaiming
    -- lock a subtask, then its task; taking the task first here would deadlock with them.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state IN ('pending', 'leased', 'checking')
      ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks SET status = 'cancelled', finished_at = now(), split_done = true,
                     cancelled_subtasks = open_subtasks, open_subtasks = 0
     WHERE id = p_task_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT task_id, subtask_id, attempts, lease_executor, lease_token, leased_at, 'cancelled', 'task cancelled'
      FROM subtasks WHERE task_id = p_task_id AND state = 'leased';
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT b.task_id, b.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at, 'cancelled',
           'task cancelled'
      FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
     WHERE b.task_id = p_task_id;
    UPDATE subtask_attempts a SET outcome = 'cancelled', error = 'task cancelled'
      FROM subtask_checks c
     WHERE c.task_id = p_task_id AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id
       AND a.lease_token = c.lease_token AND a.outcome = 'candidate';
    DELETE FROM subtask_checks WHERE task_id = p_task_id;
    DELETE FROM subtask_backups WHERE task_id = p_task_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = p_task_id;
    UPDATE subtasks SET state = 'cancelled', lease_executor = NULL
     WHERE task_id = p_task_id AND state IN ('pending', 'leased', 'checking');
    RETURN true;
END $$;

-- Retry: a failed task's failed subtasks back to the queue, each with a fresh budget of the task's
-- max_attempts (their attempts count from zero again; the history keeps every earlier attempt, each
-- with its own lease token, which output keys carry, so no new output can overwrite an old one).
-- Committed results stay; the task is running (queued if nothing was ever claimed) until its
-- subtasks close again, and the requeue trigger wakes the executors. Returns the verdict and how
-- many subtasks went back: 'retried', 'missing', 'not_failed' (the task's status) or
-- 'nothing_to_retry' (a task that failed with no failed subtask: its input could not be split).
CREATE FUNCTION minion_retry_task(p_task_id bigint, OUT verdict text, OUT subtasks integer)
LANGUAGE plpgsql AS $$
DECLARE
    task_status text;
BEGIN
    subtasks := 0;
    -- Lock order everywhere: subtasks (by id), then the task.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state = 'failed' ORDER BY subtask_id FOR UPDATE;
    SELECT status INTO task_status FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        verdict := 'missing';
        RETURN;
    END IF;
    IF task_status <> 'failed' THEN
        verdict := 'not_failed';
        RETURN;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE subtasks
       SET state = 'pending', attempts = 0, lease_token = NULL, lease_executor = NULL, leased_at = NULL,
           done_at = NULL, check_token = NULL
     WHERE task_id = p_task_id AND state = 'failed';
    GET DIAGNOSTICS subtasks = ROW_COUNT;
    IF subtasks = 0 THEN
        verdict := 'nothing_to_retry';
        RETURN;
    END IF;
    UPDATE tasks
       SET status = CASE WHEN started_at IS NULL THEN 'queued' ELSE 'running' END,
           finished_at = NULL, error = NULL,
           open_subtasks = open_subtasks + subtasks,
           failed_subtasks = failed_subtasks - subtasks
     WHERE id = p_task_id;
    verdict := 'retried';
END $$;

-- Settles one of them once the closes in flight (of leased and checking subtasks) have committed:
-- this session holds no subtask lock (one task per statement), so it may wait for them. Returns
-- whether the task ended.
CREATE FUNCTION minion_settle_waiting(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Waits for each in-flight close, then sees the row as it committed.
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('pending', 'leased', 'checking') FOR KEY SHARE;
    IF FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    RETURN (SELECT finished_at IS NOT NULL FROM tasks WHERE id = p_task_id);
END $$;

-- After a close (or the end of a split): settle now if nothing else is open, return when a later
-- closer will decide, else hand the decision to the splitter. Inside a batch the batch decides, once
-- per task after its last close (minion_defer_settle). The pending probe comes first, reading the
-- queue backwards from the task's tail; a leased or checking subtask is in flight; the slots' sum is
-- read only when nothing is pending or in flight.
CREATE FUNCTION minion_task_try_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    IF minion_settle_deferred() THEN
        RETURN;  -- minion_settle_after_batch decides
    END IF;
    SELECT split_done, status, kind, model, priority, open_subtasks INTO t FROM tasks WHERE id = p_task_id;
    IF NOT FOUND OR NOT t.split_done OR t.status NOT IN ('splitting', 'queued', 'running') THEN
        RETURN;  -- not split yet: minion_finish_split decides
    END IF;
    -- One probe of the queue index (capability, priority and task known), from the tail.
    PERFORM 1 FROM subtasks s
      WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
        AND s.priority = t.priority AND s.task_id = p_task_id
      ORDER BY s.subtask_id DESC LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    IF t.open_subtasks - (minion_task_slot_sums(p_task_id)).closed <= 0 THEN
        PERFORM minion_task_settle(p_task_id);
        RETURN;
    END IF;
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('leased', 'checking')
      LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('tasks', p_task_id::text);
END $$;

CREATE FUNCTION minion_task_counts(p_task_id bigint,
    OUT subtasks_total bigint, OUT subtasks_pending bigint, OUT subtasks_leased bigint,
    OUT subtasks_done bigint, OUT subtasks_failed bigint, OUT subtasks_cancelled bigint,
    OUT records_done bigint, OUT subtasks_checking bigint)
LANGUAGE sql STABLE AS $$
    SELECT t.subtasks_total, t.open_subtasks - p.closed - l.leased - l.checking, l.leased,
           t.subtasks_total - (t.open_subtasks - p.closed) - (t.failed_subtasks + p.failed) - t.cancelled_subtasks,
           t.failed_subtasks + p.failed, t.cancelled_subtasks, t.records_done + p.records_done, l.checking
      FROM tasks t
     CROSS JOIN LATERAL minion_task_slot_sums(t.id) p
     CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE s.state = 'leased') AS leased,
                                count(*) FILTER (WHERE s.state = 'checking') AS checking
                           FROM subtasks s
                          WHERE s.task_id = t.id AND s.state IN ('leased', 'checking')) l
     WHERE t.id = p_task_id
$$;

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
