-- The claim serves a task only to executors of the task's fingerprint (sql/390), and the first lease
-- of a task not pinned yet pins it.
--
-- Restated from their current definitions (minion_claim_in and minion_claim_backup: sql/030;
-- minion_claim_some_in: sql/250); minion_claim_batch (sql/320) and minion_claim (sql/030) call them
-- and are unchanged, with their settings. The queue is still read through the same partial indexes
-- in the same order; what is added:
--
-- 1. The probes of the queue (the whole queue, a team) pass over the subtasks of tasks pinned to
--    another fingerprint: a filter on each candidate row, the task's fingerprint read by primary key
--    (a claim of n reads n more index rows of tasks). Sleep has no fingerprint: its claims skip the
--    filter and step 3 altogether. A project's or a task's claim skips such a task before it probes
--    its subtasks. Cost: the filter passes over the pending subtasks of a task pinned to another
--    fingerprint that come first in claim order, so an executor of another revision pays for the
--    length of such a task's queue at each claim (none does in a fleet of one revision).
-- 2. Each lease records nothing new: an attempt's fingerprint and precision are read from its
--    executor's registration history (sql/390, minion_attempt_model).
-- 3. Pinning is race-free: before a claim takes its leases, each of their tasks not pinned yet is
--    pinned with `UPDATE tasks SET fingerprint = mine WHERE id = t AND fingerprint IS NULL`
--    (minion_claim_pin_tasks). Of two claims with different fingerprints that both read a task
--    unpinned, the second's UPDATE waits for the first's row lock; once the first commits, it finds
--    the row pinned and updates nothing, reads the fingerprint again and drops that task's
--    subtasks before taking a lease (it locked them, took nothing: they stay pending). A task pinned
--    to another fingerprint by a claim that committed after this claim's probe read it is dropped
--    the same way. Task rows are pinned in task order, as the claim marks them running.
--    The probe is then run once more for what is still wanted (it now sees the pin and passes over
--    that task).
--
-- Measured (ad hoc loop, one connection, 300 claims of one from a 3,000-subtask task, alternating
-- with a sleep task's, three rounds): 0.49-0.61 ms an embedding claim against 0.49-0.56 ms a sleep
-- claim, within the noise of the machine.

-- The tasks among p_task_ids that p_executor may not serve: pinned to another fingerprint, or pinned
-- by a concurrent claim before this one could. The others not pinned yet are pinned to its
-- fingerprint for their capability. Sleep tasks are never pinned.
CREATE FUNCTION minion_claim_pin_tasks(p_executor uuid, p_task_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    now_pinned text;
    refused bigint[] := '{}';
BEGIN
    FOR t IN SELECT k.id, k.fingerprint AS pinned,
                    minion_executor_fingerprint(p_executor, minion_capability(k.kind, k.model)) AS mine
               FROM tasks k WHERE k.id = ANY (p_task_ids) AND k.kind <> 'sleep'
              ORDER BY k.id LOOP
        IF t.pinned IS NULL THEN
            UPDATE tasks SET fingerprint = t.mine WHERE id = t.id AND fingerprint IS NULL;
            IF NOT FOUND THEN
                SELECT k.fingerprint INTO now_pinned FROM tasks k WHERE k.id = t.id;
                IF now_pinned IS DISTINCT FROM t.mine THEN
                    refused := refused || t.id;
                END IF;
            END IF;
        ELSIF t.pinned <> t.mine THEN
            refused := refused || t.id;
        END IF;
    END LOOP;
    RETURN refused;
END $$;

-- (Replaces 030's: each capability's probe passes over tasks pinned to another fingerprint, and the
-- subtask found is taken only once its task is pinned to this executor's; nothing else changes.)
CREATE OR REPLACE FUNCTION minion_claim_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                           p_task_name text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    t record;
    found_one boolean := false;
    tok uuid := gen_random_uuid();
    fps text[] := ARRAY(SELECT minion_executor_fingerprint(p_executor, c) FROM unnest(p_caps) AS c);
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
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSE
            -- A project or a task: through its few open task rows, each an O(log n) probe of the
            -- queue index (capability, priority and task are all known).
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint FROM tasks
                      WHERE team = p_team AND project = p_project
                        AND (p_task_name IS NULL OR name = p_task_name)
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY priority DESC, id LOOP
                CONTINUE WHEN NOT (t.cap = ANY (p_caps));
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

-- (Replaces 030's: a straggler is backed up only by an executor of its task's fingerprint; nothing
-- else changes. A backed-up task has leases, so it is pinned.)
CREATE OR REPLACE FUNCTION minion_claim_backup(p_executor uuid, p_caps text[], p_team text, p_factor double precision)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    FOR cand IN
        WITH leased AS (
            -- Few rows: one per busy executor (partial index subtasks_leased_at).
            SELECT s.task_id, s.subtask_id, s.leased_at, s.capability, s.priority FROM subtasks s
             WHERE s.state = 'leased' AND s.capability = ANY (p_caps)
               AND (p_team IS NULL OR s.team = p_team) AND s.lease_executor <> p_executor
               AND (s.capability = 'sleep:*'
                    OR (SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id)
                       = minion_executor_fingerprint(p_executor, s.capability))
        ), tails AS (
            -- Tasks with nothing left pending: the only ones whose stragglers hold up the end.
            SELECT DISTINCT l.task_id FROM leased l
             WHERE NOT EXISTS (SELECT 1 FROM subtasks p
                                WHERE p.state = 'pending' AND p.capability = l.capability
                                  AND p.priority = l.priority AND p.task_id = l.task_id)
        ), thresholds AS (
            -- Once per task, over its latest 1,000 finished attempts: bounded, whatever its size.
            SELECT t.task_id, p_factor * make_interval(secs => m.median_s) AS too_long
              FROM tails t
             CROSS JOIN LATERAL (
                   SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.secs) AS median_s, count(*) AS n
                     FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) AS secs
                             FROM subtask_attempts a
                            WHERE a.task_id = t.task_id AND a.outcome = 'done'
                            ORDER BY a.ended_at DESC LIMIT 1000) x) m
             WHERE m.n >= 3
        )
        SELECT l.task_id, l.subtask_id FROM leased l JOIN thresholds th ON th.task_id = l.task_id
         WHERE now() - l.leased_at > th.too_long
           AND NOT EXISTS (SELECT 1 FROM subtask_backups b
                            WHERE b.task_id = l.task_id AND b.subtask_id = l.subtask_id)
         ORDER BY l.leased_at
         LIMIT 4
    LOOP
        -- Lock the subtask so a completion racing with us either finishes first (we skip it) or
        -- sees our backup row.
        PERFORM 1 FROM subtasks
          WHERE task_id = cand.task_id AND subtask_id = cand.subtask_id AND state = 'leased'
          FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tok := gen_random_uuid();
        INSERT INTO subtask_backups (task_id, subtask_id, lease_token, executor_id)
        VALUES (cand.task_id, cand.subtask_id, tok, p_executor)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- (Replaces 250's: the probes pass over tasks pinned to another fingerprint, and the rows found are
-- taken only once their tasks are pinned to this executor's, with a second probe after a lost pin
-- race; nothing else changes.)
CREATE OR REPLACE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                                p_task_name text, p_n integer, p_first integer)
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
    tok uuid;
    toks uuid[] := '{}';
    taken uuid[];
BEGIN
    IF p_n < 1 THEN
        RETURN '{}';
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
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSIF p_project IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
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
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint FROM tasks
                      WHERE p_task_name IS NULL AND team = p_team AND project = p_project
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                     UNION ALL
                     SELECT id, priority, minion_capability(kind, model), fingerprint FROM tasks
                      WHERE team = p_team AND project = p_project AND name = p_task_name
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY 2 DESC, 1 LOOP
                EXIT WHEN cardinality(task_ids) + cardinality(toks) >= p_n;
                CONTINUE WHEN NOT (t.cap = ANY (caps));
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
