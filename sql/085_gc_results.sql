-- Garbage collection of committed results (`results/<task>/<subtask>/<attempt>-<token>-<nonce>.jsonl`,
-- the verified copies made at complete since 070): one is garbage when no subtask names it as its
-- result (its task was deleted, or its complete lost a race or was refused after the copy). A copy
-- is written just before its complete records it: the collector's grace period
-- (MINIONS_GC_GRACE_S) covers that. Outputs under `outputs/` keep minion_gc_outputs (080).
CREATE FUNCTION minion_gc_results(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT r.k FROM (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^results/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-'
                                  '[0-9a-f]{16}\.jsonl$') AS m
         WHERE m IS NOT NULL) r
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.task_id = r.task_id AND s.subtask_id = r.subtask_id AND s.result_key = r.k)
$$;
