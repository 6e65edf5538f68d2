-- Every statement services/splitter runs. The split steps themselves are functions in
-- sql/schema/04_tasks.sql, so psql can do (and undo) what the splitter does.

-- name: store_signing_key
SELECT value FROM minion_settings WHERE key = 'store_signing_key';

-- name: unsplit_tasks
-- The sweep: tasks still waiting for (the rest of) their split. Served by the partial index
-- tasks_unsplit; NOTIFY only wakes the splitter, this query is the record of the work.
SELECT id
  FROM tasks
 WHERE NOT split_done AND status NOT IN ('completed', 'failed', 'cancelled')
 ORDER BY priority DESC, id
 LIMIT $1;

-- name: try_lock_task
-- Session-level, on the splitting connection: another splitter skips the task, and a splitter that
-- dies releases it with its connection.
SELECT pg_try_advisory_lock($1::bigint);

-- name: unlock_task
SELECT pg_advisory_unlock($1::bigint);

-- name: begin_split
-- One row; all NULL when the task is no longer splittable (split, cancelled, failed).
SELECT split_offset, split_records, next_subtask_id FROM minion_begin_split($1);

-- name: task_for_split
SELECT id, kind, subtask_size, input_uri FROM tasks WHERE id = $1;

-- name: task_status
SELECT status, split_done FROM tasks WHERE id = $1;

-- name: add_subtasks
-- Returns false (and inserts nothing) when the task was cancelled or failed meanwhile.
SELECT minion_add_subtasks($1, $2::bigint[], $3::bigint[], $4::bigint[], $5::integer[], $6, $7, $8);

-- name: finish_split
SELECT minion_finish_split($1);

-- name: fail_split
SELECT minion_fail_split($1, $2);

-- name: settle_candidates
-- Every open task that may have ended with closes that could not decide it
-- (sql/schema/04_tasks.sql): the safety-net sweep, on start and every sweep interval.
SELECT minion_settle_candidates($1) AS id;

-- name: settle_candidates_among
-- The same, among the tasks notifications named (sql/schema/04_tasks.sql).
SELECT minion_settle_candidates_among($1::bigint[]) AS id;

-- name: settle_waiting
SELECT minion_settle_waiting($1);
