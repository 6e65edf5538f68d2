-- Statements of the result compactor (minions.result_parts: the watchdog's loop, `minions compact`).

-- name: tasks_to_compact
SELECT minion_tasks_to_compact AS task_id FROM minion_tasks_to_compact($1);

-- name: try_lock_task
-- One compactor per task at a time; a session lock, so a killed compactor's lock goes with its connection.
-- (Ids past 2^31 share a key with a smaller one: at worst one waits for the next round.)
SELECT pg_try_advisory_lock(21014, ($1::bigint % 2147483647)::integer);

-- name: unlock_task
SELECT pg_advisory_unlock(21014, ($1::bigint % 2147483647)::integer);

-- name: last_part
SELECT part, last_subtask FROM result_parts WHERE task_id = $1 ORDER BY part DESC LIMIT 1;

-- name: done_subtasks
-- One page of a task's committed subtasks in input order, after subtask $2.
SELECT subtask_id, output_key, result_key, result_sha256, result_bytes, result_data, records
FROM subtasks WHERE task_id = $1 AND subtask_id > $2 AND state = 'done'
ORDER BY subtask_id LIMIT $3;

-- name: record_part
SELECT minion_record_result_part($1, $2, $3, $4, $5, $6, $7, $8);

-- name: finish_compaction
SELECT minion_finish_compaction($1);
