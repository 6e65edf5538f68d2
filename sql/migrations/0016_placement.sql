-- Placement: a task may be leased by vouched executors only ('trusted'): every claim path (the
-- queue, a team's, a project's or task's preference, a straggler's backup, a replica) passes over it
-- for a volunteer. A verification task is placed so, and suspects more: results committed
-- unchecked and volunteers' results no vouched executor agreed with.
ALTER TABLE tasks ADD COLUMN placement text NOT NULL DEFAULT 'any' CHECK (placement IN ('any', 'trusted'));

DROP FUNCTION minion_submit_task(text, text, text, text, text, jsonb, integer, integer, integer, text, text, bigint,
                                 bigint[], bigint[], bigint[], integer[], bytea, bigint);

CREATE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
    p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer, p_input_uri text,
    p_request_hash text, p_created_by bigint, p_byte_starts bigint[], p_byte_ends bigint[],
    p_first_records bigint[], p_records integer[], p_input_data bytea, p_input_quota bigint DEFAULT 0,
    p_placement text DEFAULT 'any')
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
BEGIN
    IF p_input_data IS NOT NULL AND NOT coalesce(p_input_uri IS NULL AND cardinality(p_byte_ends) > 0
                                                 AND p_byte_ends[cardinality(p_byte_ends)] = length(p_input_data),
                                                 false) THEN
        RAISE EXCEPTION 'a kept input needs no input_uri and the subtasks of all its bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO t FROM minion_submit_task(p_team, p_project, p_name, p_kind, p_model, p_params, p_priority,
                                            p_subtask_size, p_max_attempts, p_input_uri, p_request_hash,
                                            p_created_by, p_byte_starts, p_byte_ends, p_first_records, p_records);
    IF NOT FOUND THEN
        RETURN;  -- the name is taken: answered as a re-submission, quota or not
    END IF;
    IF p_placement <> 'any' THEN  -- in this transaction: no claim can see the task before it is placed
        UPDATE tasks SET placement = p_placement WHERE id = t.id RETURNING * INTO t;
    END IF;
    IF p_input_data IS NOT NULL THEN
        -- Last, so the team's count is held locked for as little as can be.
        IF p_input_quota > 0 THEN
            PERFORM minion_lock_team_inputs(p_team);
            IF minion_team_input_bytes(p_team) + length(p_input_data) > p_input_quota THEN
                RAISE EXCEPTION 'quota_exceeded' USING ERRCODE = 'configuration_limit_exceeded';
            END IF;
        END IF;
        INSERT INTO task_inputs (task_id, team, data) VALUES (t.id, p_team, p_input_data);
    END IF;
    RETURN NEXT t;
END $$;

CREATE OR REPLACE FUNCTION minion_claim_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                           p_task_name text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    t record;
    found_one boolean := false;
    tok uuid := gen_random_uuid();
    fps text[] := ARRAY(SELECT minion_executor_fingerprint(p_executor, c) FROM unnest(p_caps) AS c);
    vouched boolean := minion_executor_vouched(p_executor);  -- may take tasks placed on trusted executors
BEGIN
    -- A second probe only after a lost pin race (the task is pinned to another fingerprint now).
    FOR pass IN 1 .. 2 LOOP
        found_one := false;
        IF p_team IS NULL THEN
            SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
              FROM unnest(p_caps, fps) AS c(cap, fp)
             CROSS JOIN LATERAL (
                   SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                    WHERE s.state = 'pending' AND s.capability = c.cap
                      AND (c.fp IS NULL
                           OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), c.fp) = c.fp)
                      AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSIF p_project IS NULL THEN
            SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
              FROM unnest(p_caps, fps) AS c(cap, fp)
             CROSS JOIN LATERAL (
                   SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                    WHERE s.state = 'pending' AND s.team = p_team AND s.capability = c.cap
                      AND (c.fp IS NULL
                           OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), c.fp) = c.fp)
                      AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSE
            -- A project or a task: through its few open task rows, each an O(log n) probe of the
            -- queue index (capability, priority and task are all known).
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint, placement FROM tasks
                      WHERE team = p_team AND project = p_project
                        AND (p_task_name IS NULL OR name = p_task_name)
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY priority DESC, id LOOP
                CONTINUE WHEN NOT (t.cap = ANY (p_caps));
                CONTINUE WHEN t.placement = 'trusted' AND NOT vouched;
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
                SELECT s.task_id, s.subtask_id, s.team, s.project, s.task_name INTO cand FROM subtasks s
                 WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority AND s.task_id = t.id
                 ORDER BY s.subtask_id LIMIT 1
                   FOR UPDATE SKIP LOCKED;
                found_one := FOUND;
                EXIT WHEN found_one;
            END LOOP;
        END IF;
        IF NOT found_one THEN
            RETURN NULL;
        END IF;
        EXIT WHEN cardinality(minion_claim_pin_tasks(p_executor, ARRAY[cand.task_id])) = 0;
        found_one := false;
    END LOOP;
    IF NOT found_one THEN
        RETURN NULL;
    END IF;

    INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
    VALUES (cand.team, cand.project, cand.task_name, cand.subtask_id, cand.task_id, p_executor, tok);
    UPDATE subtasks
       SET state = 'leased', lease_token = tok, lease_executor = p_executor, leased_at = now(),
           attempts = attempts + 1
     WHERE task_id = cand.task_id AND subtask_id = cand.subtask_id;
    RETURN tok;
END $$;

CREATE OR REPLACE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                                p_task_name text, p_n integer, p_first integer,
                                                p_excluded text[] DEFAULT '{}')
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    caps text[] := ARRAY(SELECT DISTINCT c FROM unnest(p_caps) AS c);
    fp text;  -- the executor's fingerprint for caps[1] (the queue's and a team's probe)
    task_ids bigint[];
    subtask_ids integer[];
    more_tasks bigint[];
    more_subtasks integer[];
    refused bigint[];
    to_pin bigint[];  -- the tasks of the rows found that have a model (sleep is never pinned)
    t record;
    cap text;
    tok uuid;
    toks uuid[] := '{}';
    taken uuid[];
    vouched boolean;  -- may take tasks placed on trusted executors (read once a probe needs it)
BEGIN
    IF p_n < 1 THEN
        RETURN '{}';
    END IF;
    IF p_team IS NULL AND cardinality(p_excluded) > 0 AND cardinality(caps) > 1 THEN
        -- Teams left out of the whole queue (at their lease cap): one capability at a time, each
        -- probe with the exclusion (rare: only while some team has a cap).
        FOREACH cap IN ARRAY caps LOOP
            EXIT WHEN cardinality(toks) >= p_n;
            toks := toks || minion_claim_some_in(p_executor, ARRAY[cap], NULL, NULL, NULL, p_n - cardinality(toks),
                                                 p_first + cardinality(toks), p_excluded);
        END LOOP;
        RETURN toks;
    END IF;
    IF p_project IS NULL AND cardinality(caps) <> 1 THEN
        FOR k IN 1 .. p_n LOOP
            tok := minion_claim_in(p_executor, caps, p_team, NULL, NULL);
            EXIT WHEN tok IS NULL;
            toks := toks || tok;
        END LOOP;
        IF p_first > 0 OR cardinality(toks) > 1 THEN  -- minion_claim_in stamps now(): shifted here
            UPDATE subtasks s
               SET leased_at = s.leased_at + (p_first + array_position(toks, s.lease_token) - 1) * interval '1 microsecond'
             WHERE s.lease_token = ANY (toks);
        END IF;
        RETURN toks;
    END IF;
    IF p_project IS NULL THEN
        fp := minion_executor_fingerprint(p_executor, caps[1]);
    END IF;
    vouched := minion_executor_vouched(p_executor);
    -- A second probe only after a lost pin race.
    FOR pass IN 1 .. 2 LOOP
        task_ids := '{}';
        subtask_ids := '{}';
        refused := '{}';
        to_pin := '{}';
        -- The whole queue and a team's queue are two statements, not one with `p_team IS NULL OR`: each
        -- keeps its own partial index (subtasks_pending_queue, subtasks_pending_team) in a cached plan.
        IF p_project IS NULL AND p_team IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                       AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                       AND NOT (s.team::text = ANY (p_excluded))
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSIF p_project IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                       AND (vouched OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSE
            -- A project or a task: its few open task rows in claim order, each an O(log n) probe of the
            -- queue index for what is still wanted (as minion_claim_in). One capability per task, so
            -- nothing is locked that is not taken.
            -- A whole project and a task by name are two branches, not one `p_task_name IS NULL OR`
            -- condition: in one generic plan (above) that condition could not use the task's name, and
            -- every claim would read all of the project's tasks. Only one branch runs: the first is gated
            -- on the name being NULL, the second finds nothing when it is.
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint, placement FROM tasks
                      WHERE p_task_name IS NULL AND team = p_team AND project = p_project
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                     UNION ALL
                     SELECT id, priority, minion_capability(kind, model), fingerprint, placement FROM tasks
                      WHERE team = p_team AND project = p_project AND name = p_task_name
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY 2 DESC, 1 LOOP
                EXIT WHEN cardinality(task_ids) + cardinality(toks) >= p_n;
                CONTINUE WHEN NOT (t.cap = ANY (caps));
                CONTINUE WHEN t.placement = 'trusted' AND NOT vouched;
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
                SELECT coalesce(array_agg(q.task_id ORDER BY q.subtask_id), '{}'),
                       coalesce(array_agg(q.subtask_id ORDER BY q.subtask_id), '{}')
                  INTO more_tasks, more_subtasks
                  FROM (SELECT s.task_id, s.subtask_id FROM subtasks s
                         WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority
                           AND s.task_id = t.id
                         ORDER BY s.subtask_id LIMIT p_n - cardinality(task_ids) - cardinality(toks)
                           FOR UPDATE SKIP LOCKED) q;
                task_ids := task_ids || more_tasks;
                subtask_ids := subtask_ids || more_subtasks;
                IF t.cap <> 'sleep:*' AND cardinality(more_tasks) > 0 THEN
                    to_pin := to_pin || t.id;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN cardinality(task_ids) = 0;

        IF fp IS NOT NULL THEN
            to_pin := ARRAY(SELECT DISTINCT x FROM unnest(task_ids) AS x);
        END IF;
        IF cardinality(to_pin) > 0 THEN
            refused := minion_claim_pin_tasks(p_executor, to_pin);
            IF cardinality(refused) > 0 THEN  -- its rows stay locked until the claim commits, untaken
                SELECT coalesce(array_agg(w.task_id ORDER BY w.n), '{}'),
                       coalesce(array_agg(w.subtask_id ORDER BY w.n), '{}')
                  INTO task_ids, subtask_ids
                  FROM unnest(task_ids, subtask_ids) WITH ORDINALITY AS w(task_id, subtask_id, n)
                 WHERE NOT (w.task_id = ANY (refused));
            END IF;
        END IF;

        IF cardinality(task_ids) > 0 THEN
            taken := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(task_ids)));
            INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
            SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, w.tok
              FROM unnest(task_ids, subtask_ids, taken) AS w(task_id, subtask_id, tok)
              JOIN subtasks s ON s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            UPDATE subtasks s
               SET state = 'leased', lease_token = w.tok, lease_executor = p_executor,
                   leased_at = now() + (p_first + cardinality(toks) + w.n - 1) * interval '1 microsecond',
                   attempts = s.attempts + 1
              FROM unnest(task_ids, subtask_ids, taken) WITH ORDINALITY AS w(task_id, subtask_id, tok, n)
             WHERE s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            toks := toks || taken;
        END IF;
        EXIT WHEN cardinality(refused) = 0 OR cardinality(toks) >= p_n;
    END LOOP;
    RETURN toks;
END $$;

CREATE OR REPLACE FUNCTION minion_claim_backup(p_executor uuid, p_caps text[], p_team text, p_factor double precision)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    FOR cand IN
        WITH leased AS (
            -- Few rows: one per busy executor (partial index subtasks_leased_at).
            SELECT s.task_id, s.subtask_id, s.leased_at, s.capability, s.priority, s.records FROM subtasks s
             WHERE s.state = 'leased' AND s.capability = ANY (p_caps)
               AND (p_team IS NULL OR s.team = p_team) AND s.lease_executor <> p_executor
               AND (s.capability = 'sleep:*'
                    OR (SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id)
                       = minion_executor_fingerprint(p_executor, s.capability))
               AND (minion_executor_vouched(p_executor)
                    OR (SELECT k.placement FROM tasks k WHERE k.id = s.task_id) = 'any')
        ), tails AS (
            -- Tasks with nothing left pending: the only ones whose stragglers hold up the end.
            SELECT DISTINCT l.task_id FROM leased l
             WHERE NOT EXISTS (SELECT 1 FROM subtasks p
                                WHERE p.state = 'pending' AND p.capability = l.capability
                                  AND p.priority = l.priority AND p.task_id = l.task_id)
        ), thresholds AS (
            -- Once per task: a typical record's run (the task's size per subtask varies at its end).
            SELECT t.task_id, minion_typical_run_s(t.task_id, 1) AS per_record FROM tails t
        )
        SELECT l.task_id, l.subtask_id FROM leased l JOIN thresholds th ON th.task_id = l.task_id
         WHERE th.per_record IS NOT NULL
           AND now() - l.leased_at > p_factor * make_interval(secs => th.per_record * greatest(l.records, 1))
           AND NOT EXISTS (SELECT 1 FROM subtask_backups b
                            WHERE b.task_id = l.task_id AND b.subtask_id = l.subtask_id)
         ORDER BY l.leased_at
         LIMIT 4
    LOOP
        tok := minion_take_second_run(cand.task_id, cand.subtask_id, 'leased', p_executor);
        IF tok IS NOT NULL THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION minion_claim_replica(p_executor uuid, p_token_id bigint, p_caps text[], p_team text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    -- Nothing held for a check (the usual case): one probe of an empty table, whatever plan the
    -- queue's statistics gave the search below (one made while nothing was in flight reads every
    -- lease through the in-flight index).
    IF NOT EXISTS (SELECT 1 FROM subtask_checks) THEN
        RETURN NULL;
    END IF;
    -- The first 64 checking subtasks in claim order are looked at, no more: a backlog of checks (an
    -- untrusted executor's held results, replicas running) costs a claim a bounded scan, and the
    -- subtasks further back come forward as those ahead resolve.
    FOR cand IN
        SELECT h.task_id, h.subtask_id
          FROM (SELECT s.task_id, s.subtask_id, s.capability, s.team, s.priority FROM subtasks s
                 WHERE s.state = 'checking' AND s.capability = ANY (p_caps) AND (p_team IS NULL OR s.team = p_team)
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id
                 LIMIT 64) h
          JOIN tasks t ON t.id = h.task_id
         WHERE NOT EXISTS (SELECT 1 FROM subtask_backups b WHERE b.task_id = h.task_id AND b.subtask_id = h.subtask_id)
           AND (h.capability = 'sleep:*' OR t.fingerprint IS NULL
                OR t.fingerprint = minion_executor_fingerprint(p_executor, h.capability))
           AND (t.placement = 'any' OR minion_executor_vouched(p_executor))
           AND minion_replica_allowed(p_executor, p_token_id, h.task_id, h.subtask_id, h.capability, h.team::text,
                                      t.fingerprint)
         ORDER BY h.priority DESC, h.task_id, h.subtask_id
         LIMIT 4
    LOOP
        tok := minion_take_second_run(cand.task_id, cand.subtask_id, 'checking', p_executor);
        IF tok IS NOT NULL THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
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
                                                            AND v.outcome = 'agreed'
                                                            AND minion_executor_vouched(v.executor_id))))));
    subtasks := picked.n;
    IF subtasks = 0 THEN
        RETURN;
    END IF;
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts, input_uri,
                       request_hash, created_by, placement)
    VALUES (t.team, t.project, p_name, t.kind,
            CASE WHEN t.fingerprint_from_revision THEN t.model || '@' || t.fingerprint ELSE t.model END,
            t.params, t.priority, t.subtask_size, t.max_attempts, t.input_uri, 'verify:' || t.request_hash,
            p_created_by, 'trusted')
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

CREATE OR REPLACE FUNCTION minion_openai_submit_batch(p_id text, p_team text, p_project text, p_kind text, p_model text,
    p_params jsonb, p_subtask_size integer, p_max_attempts integer, p_input_uri text, p_endpoint text,
    p_input_file_id text, p_window text, p_window_s double precision, p_metadata jsonb,
    p_request_total integer, p_record_total integer, p_created_by bigint, p_priority integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    -- metadata.placement 'trusted' (checked by the API): only vouched executors lease it.
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by, placement)
    VALUES (p_team, p_project, p_id, p_kind, p_model, p_params, p_priority, p_subtask_size, p_max_attempts,
            p_input_uri, p_id, p_created_by,
            CASE WHEN p_metadata ->> 'placement' = 'trusted' THEN 'trusted' ELSE 'any' END)
    RETURNING id INTO v_task;
    INSERT INTO openai_batches (id, team, task_id, endpoint, input_file_id, completion_window, metadata,
                                request_total, record_total, created_by, in_progress_at, expires_at)
    VALUES (p_id, p_team, v_task, p_endpoint, p_input_file_id, p_window, p_metadata, p_request_total,
            p_record_total, p_created_by, now(), now() + make_interval(secs => p_window_s));
    RETURN v_task;
END $$;

