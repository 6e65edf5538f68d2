-- Garbage collection also judges committed results (`results/<task>/<subtask>/<attempt>-<token>-
-- <nonce>.jsonl`, the verified copies made at complete since 070): one is garbage when its task was
-- deleted, or when no subtask names it as its result (a copy whose complete lost a race, or was
-- refused after the copy). Outputs under `outputs/` are judged as before. A copy is written just
-- before its complete records it: the collector's grace period (MINIONS_GC_GRACE_S) covers that.
CREATE OR REPLACE FUNCTION minion_gc_outputs(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH parsed AS (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id, m[4]::uuid AS token
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^outputs/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$') AS m
         WHERE m IS NOT NULL),
    results AS (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^results/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-'
                                  '[0-9a-f]{16}\.jsonl$') AS m
         WHERE m IS NOT NULL)
    SELECT p.k FROM parsed p
     WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = p.task_id)
        OR NOT EXISTS (
            SELECT 1 FROM subtasks s
             WHERE s.task_id = p.task_id AND s.subtask_id = p.subtask_id
               AND (s.output_key = p.k
                    OR (s.state = 'leased' AND s.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_backups b
                                WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                  AND b.lease_token = p.token)))
    UNION ALL
    SELECT r.k FROM results r
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.task_id = r.task_id AND s.subtask_id = r.subtask_id AND s.result_key = r.k)
$$;
