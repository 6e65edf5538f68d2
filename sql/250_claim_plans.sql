-- The claim plans its statements once per connection, not at every call (issue 11).
--
-- PostgreSQL plans a PL/pgSQL statement with parameters at each of its first five runs, then keeps
-- one generic plan unless that plan's estimate is worse than the custom plans' average. The claim's
-- statements over arrays and limits (unnest of the leases won, LIMIT of the subtasks still wanted,
-- `lease_token = ANY (won)`) are estimated at 10 elements or a tenth of the queue without their
-- values, and at 1 with them: for a claim of one, the generic estimate always loses, so five of
-- them were planned again at every claim. pg_stat_statements in bench/drain.py's http-inline1 arm
-- (2,000 subtasks, 16 executors, track = all, track_planning = on): 1.12 ms of planning per subtask,
-- about 0.9 ms of it in the claim, against ~3.8 ms of PostgreSQL CPU per subtask in all.
--
-- The generic plans are the custom plans' shape: the queue's partial indexes in claim order under
-- the row locks, the primary key per lease won, the lease-token index (EXPLAIN of both with 3 and
-- 200,000 pending subtasks). The setting holds for the whole call, the functions it calls included,
-- and is restored when it returns. A cached plan is re-made when its tables' statistics change, so a
-- queue that grows from a handful of rows gets index plans once autovacuum analyzes it. One statement
-- needed rewriting for it: a claim by preference for a project or a task found the task's rows
-- through `p_task_name IS NULL OR name = p_task_name`, which a generic plan cannot resolve to the
-- task's name (below). A generic plan made while the tables are nearly empty (a fresh database) keeps
-- its shape until their statistics change: the lookup of the leases won may then combine the
-- lease-token index with the leased subtasks' index, reading every lease in flight, until autovacuum
-- analyzes subtasks.
--
-- A CREATE OR REPLACE of minion_claim_batch drops this setting: a restatement must carry
-- `SET plan_cache_mode = force_generic_plan` itself (tests/test_sql_batched_steps.py checks it).
ALTER FUNCTION minion_claim_batch(uuid, bigint, integer, double precision) SET plan_cache_mode = force_generic_plan;

-- (Replaces 220's: the project-or-task lookup is two gated branches; nothing else changes.)
CREATE OR REPLACE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                                p_task_name text, p_n integer, p_first integer)
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    caps text[] := ARRAY(SELECT DISTINCT c FROM unnest(p_caps) AS c);
    task_ids bigint[] := '{}';
    subtask_ids integer[] := '{}';
    more_tasks bigint[];
    more_subtasks integer[];
    t record;
    tok uuid;
    toks uuid[] := '{}';
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
    -- The whole queue and a team's queue are two statements, not one with `p_team IS NULL OR`: each
    -- keeps its own partial index (subtasks_pending_queue, subtasks_pending_team) in a cached plan.
    IF p_project IS NULL AND p_team IS NULL THEN
        SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
               coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
          INTO task_ids, subtask_ids
          FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                 WHERE s.state = 'pending' AND s.capability = caps[1]
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n
                   FOR UPDATE SKIP LOCKED) q;
    ELSIF p_project IS NULL THEN
        SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
               coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
          INTO task_ids, subtask_ids
          FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                 WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n
                   FOR UPDATE SKIP LOCKED) q;
    ELSE
        -- A project or a task: its few open task rows in claim order, each an O(log n) probe of the
        -- queue index for what is still wanted (as minion_claim_in). One capability per task, so
        -- nothing is locked that is not taken.
        -- A whole project and a task by name are two branches, not one `p_task_name IS NULL OR`
        -- condition: in one generic plan (above) that condition could not use the task's name, and
        -- every claim would read all of the project's tasks. Only one branch runs: the first is gated
        -- on the name being NULL, the second finds nothing when it is.
        FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap FROM tasks
                  WHERE p_task_name IS NULL AND team = p_team AND project = p_project
                    AND NOT (status IN ('completed', 'failed', 'cancelled'))
                 UNION ALL
                 SELECT id, priority, minion_capability(kind, model) FROM tasks
                  WHERE team = p_team AND project = p_project AND name = p_task_name
                    AND NOT (status IN ('completed', 'failed', 'cancelled'))
                  ORDER BY 2 DESC, 1 LOOP
            EXIT WHEN cardinality(task_ids) >= p_n;
            CONTINUE WHEN NOT (t.cap = ANY (caps));
            SELECT coalesce(array_agg(q.task_id ORDER BY q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.subtask_id), '{}')
              INTO more_tasks, more_subtasks
              FROM (SELECT s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority
                       AND s.task_id = t.id
                     ORDER BY s.subtask_id LIMIT p_n - cardinality(task_ids)
                       FOR UPDATE SKIP LOCKED) q;
            task_ids := task_ids || more_tasks;
            subtask_ids := subtask_ids || more_subtasks;
        END LOOP;
    END IF;
    IF cardinality(task_ids) = 0 THEN
        RETURN '{}';
    END IF;

    toks := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(task_ids)));
    INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
    SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, w.tok
      FROM unnest(task_ids, subtask_ids, toks) AS w(task_id, subtask_id, tok)
      JOIN subtasks s ON s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
    UPDATE subtasks s
       SET state = 'leased', lease_token = w.tok, lease_executor = p_executor,
           leased_at = now() + (p_first + w.n - 1) * interval '1 microsecond', attempts = s.attempts + 1
      FROM unnest(task_ids, subtask_ids, toks) WITH ORDINALITY AS w(task_id, subtask_id, tok, n)
     WHERE s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
    RETURN toks;
END $$;

