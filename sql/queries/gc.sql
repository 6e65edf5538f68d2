-- Statements of the object-store garbage collector (`minions gc`, the watchdog's sweep).

-- name: stale_input_records
-- $1 grace (s), $2 dry run, $3 batch size
SELECT uri, bytes FROM minion_gc_input_records($1, $2, $3);

-- name: unowned_inputs
SELECT minion_gc_unowned_inputs AS uri FROM minion_gc_unowned_inputs($1);

-- name: garbage_outputs
SELECT minion_gc_outputs AS key FROM minion_gc_outputs($1)
UNION SELECT minion_gc_compacted FROM minion_gc_compacted($1);

-- name: garbage_results
SELECT minion_gc_results AS key FROM minion_gc_results($1)
UNION SELECT minion_gc_compacted FROM minion_gc_compacted($1);

-- name: kept_results
-- $1 grace (s), $2 dry run, $3 batch size: one task's batch of dropped bytes (a dry run: every task's)
SELECT task_id, subtasks, bytes FROM minion_gc_kept_results($1, $2, $3);

-- name: retention_lock
-- One retention run at a time across every watchdog and `minions gc --retention` (session lock,
-- released by retention_unlock or when the connection ends).
SELECT pg_try_advisory_lock(hashtext('minions.retention'));

-- name: retention_unlock
SELECT pg_advisory_unlock(hashtext('minions.retention'));

-- name: retention_step
-- $1 age (seconds), $2 batch size
SELECT task_id, subtasks_deleted, attempts_deleted, task_deleted
FROM minion_retention_step(make_interval(secs => $1), $2);

-- name: retention_backlog
-- Finished tasks older than $1 seconds and their subtasks: the job's work, for its progress.
SELECT count(*) AS tasks, coalesce(sum(subtasks_total), 0)::bigint AS subtasks
FROM tasks WHERE finished_at < now() - make_interval(secs => $1);

-- name: garbage_parts
SELECT minion_gc_parts AS key FROM minion_gc_parts($1);
