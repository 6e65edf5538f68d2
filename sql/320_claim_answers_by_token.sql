-- A claim reads less on its way out (issue 11: the unbatched HTTP claim against the direct-SQL one).
--
-- pg_stat_statements of a loop of the API's claim of one (minion_claim_batch with p_max 1) against
-- minion_claim, 16 connections draining 5,000 one-record subtasks: the batched claim spent ~0.5 ms
-- more of PostgreSQL's CPU per subtask, most of it in two statements that minion_claim does not run:
--
-- 1. Marking the won leases' tasks running: an UPDATE per task, run at every claim though only a
--    task's first claim finds it 'queued' (or 'splitting'). An UPDATE that changes nothing still
--    starts a whole update (the table's indexes and triggers opened): 130-230 us a claim. The task
--    rows are now read in the lookup that already lists the won leases' tasks, and only those still
--    'splitting' or 'queued' are updated, in task order as before. A task's status only moves on
--    from 'running' (to an end), so a task read as 'running' needs nothing; two claims that both
--    read 'queued' both update it, as before, and the UPDATE's own condition makes the second a no-op.
-- 2. The answer's rows: `lease_token = ANY (won) AND state = 'leased'` let the cached generic plan
--    read subtasks through the partial index of leased subtasks, filtering on the token: every lease
--    in flight, and the index's dead entries between vacuums (14 buffers a claim in the drain,
--    against 3 for the same rows by token). Every won token is a lease this transaction just took
--    (its row locked by the claim's UPDATE, so nothing else can end it), so the state condition
--    said nothing; without it, the rows are found by the lease-token index.
--
-- Same verdicts, the same leases in the same order, the same columns. A CREATE OR REPLACE drops a
-- function's settings: this one restates sql/250's and sql/310's (tests/test_sql_batched_steps.py).

CREATE OR REPLACE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
                                              p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (verdict text, capabilities text[], owner bigint, lease_token uuid, expires_at timestamptz,
               task_id bigint, subtask_id integer, attempt integer, team text, project text,
               task_name text, kind text, model text, params jsonb, input_uri text, byte_start bigint,
               byte_end bigint, records integer, output_key text, backup boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    wanted integer := greatest(p_max, 1);
    won uuid[] := '{}';  -- the leases won, in claim order
    backup_tok uuid;
    starting bigint;
    ex executors%ROWTYPE;
    pref record;
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := minion_executor_refusal(ex, p_token_id);
    IF verdict IS NULL AND ex.status = 'offline' THEN
        verdict := 'deregistered';
    END IF;
    IF verdict IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- The preferences in order, then the executor's whole queue (its token's team, or every team):
    -- the last filter, after every position.
    FOR pref IN (SELECT p.position, p.team, p.project, p.task_name FROM executor_preferences p
                  WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                 ORDER BY 1 LOOP
        won := won || minion_claim_some_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name,
                                           wanted - cardinality(won), cardinality(won));
        EXIT WHEN cardinality(won) >= wanted;
    END LOOP;
    IF cardinality(won) = 0 AND p_backup_factor > 0 THEN
        backup_tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
    END IF;
    IF cardinality(won) = 0 AND backup_tok IS NULL THEN
        verdict := 'empty';
        capabilities := ex.capabilities;
        RETURN NEXT;
        RETURN;
    END IF;

    -- The tasks that start with this claim, in task order, so two claimers never wait on each other's
    -- task rows in opposite orders.
    FOR starting IN SELECT DISTINCT t.id FROM subtasks s JOIN tasks t ON t.id = s.task_id
                     WHERE s.lease_token = ANY (won) AND t.status IN ('splitting', 'queued')
                     ORDER BY 1 LOOP
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = starting AND status IN ('splitting', 'queued');
    END LOOP;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    IF backup_tok IS NOT NULL THEN
        RETURN QUERY
        SELECT 'leased', ex.capabilities, ex.token_id, backup_tok,
               now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
               s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
               s.byte_start, s.byte_end, s.records,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, backup_tok), true
          FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
          JOIN tasks t ON t.id = s.task_id
         WHERE b.lease_token = backup_tok;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'leased', ex.capabilities, ex.token_id, s.lease_token,
           now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
           s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
           s.byte_start, s.byte_end, s.records,
           minion_output_key(s.task_id, s.subtask_id, s.attempts, s.lease_token), false
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = ANY (won)
     ORDER BY array_position(won, s.lease_token);
END $$;
