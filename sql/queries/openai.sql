-- Every statement of the OpenAI adapter (/v1, services/api/openai), by name.

-- name: add_file
SELECT minion_openai_add_file($1, $2, $3, $4, $5, $6, $7);

-- name: add_file_within_quota
-- 'ok', or 'quota_exceeded' (nothing recorded): $8 is the team's input quota (sql/schema/10_openai.sql).
SELECT minion_openai_add_file($1, $2, $3, $4, $5, $6, $7, $8);

-- name: file_by_id
SELECT id, team::text AS team, purpose, filename, bytes, uri, created_at
FROM openai_files WHERE id = $1 AND deleted_at IS NULL;

-- name: list_files
-- $1 team scope (NULL: every team), $2 purpose (NULL: any), $3 after (a file id; NULL: from the
-- newest), $4 limit. Newest first.
SELECT id, team::text AS team, purpose, filename, bytes, uri, created_at
FROM openai_files
WHERE deleted_at IS NULL
  AND ($1::text IS NULL OR team = $1)
  AND ($2::text IS NULL OR purpose = $2)
  AND ($3::text IS NULL OR seq < (SELECT seq FROM openai_files WHERE id = $3))
ORDER BY seq DESC
LIMIT $4;

-- name: delete_file
SELECT minion_openai_delete_file($1);

-- name: model_known
-- Whether an executor has ever advertised kind $1 with model $2 (sql/schema/05_executors.sql): a
-- batch of a known model waits for an executor within its window.
SELECT minion_model_known($1, $2);

-- name: priority_within_cap
-- $2 when a submitter ($3: held to the cap) may give it to a task of team $1; else raises priority_above_cap.
SELECT minion_priority_within_cap($1, $2, $3);

-- name: submit_batch
-- $18 the task's priority, $19 whether the submitter is held to team $2's cap: above it raises
-- priority_above_cap in this statement and nothing is submitted (sql/schema/14_teams.sql).
SELECT minion_openai_submit_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                                  minion_priority_within_cap($2, $18, $19));

-- name: reject_batch
SELECT minion_openai_reject_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: batch_by_id
SELECT b.*, b.team::text AS team, t.status AS task_status, t.finished_at AS task_finished_at,
       t.records_done + (minion_task_slot_sums(t.id)).records_done AS task_records_done  -- 180: plus the slots
FROM openai_batches b LEFT JOIN tasks t ON t.id = b.task_id
WHERE b.id = $1;

-- name: list_batches
-- $1 team scope (NULL: every team), $2 after (a batch id; NULL: from the newest), $3 limit.
SELECT b.*, b.team::text AS team, t.status AS task_status, t.finished_at AS task_finished_at,
       t.records_done + (minion_task_slot_sums(t.id)).records_done AS task_records_done  -- 180: plus the slots
FROM openai_batches b LEFT JOIN tasks t ON t.id = b.task_id
WHERE ($1::text IS NULL OR b.team = $1)
  AND ($2::text IS NULL OR b.seq < (SELECT seq FROM openai_batches WHERE id = $2))
ORDER BY b.seq DESC
LIMIT $3;

-- name: end_batch
SELECT minion_openai_end_batch($1, $2);

-- name: begin_finalize
SELECT coalesce(minion_openai_begin_finalize($1, $2), false);

-- name: finish_batch
SELECT minion_openai_finish_batch($1, $2, $3, $4, $5);

-- name: task_row
SELECT t.*, c.subtasks_pending, c.subtasks_leased, c.subtasks_done, c.subtasks_failed, c.subtasks_cancelled,
       c.subtasks_checking,
       c.records_done AS records_done_live  -- 180: the row's counter plus the progress slots
FROM tasks t
CROSS JOIN LATERAL minion_task_counts(t.id) c
WHERE t.id = $1;

-- name: model_availability
-- Whether kind $1 with model $2 is known (an executor ever advertised it), and whether an executor
-- that is online now (heard from within the cluster's lease timeout) serves it (minion_capability).
SELECT minion_model_known($1, $2) AS known,
       EXISTS (SELECT 1 FROM executors e JOIN heartbeats h ON h.executor_id = e.id
                WHERE e.capabilities @> ARRAY[minion_capability($1, $2)] AND e.status = 'online'
                  AND h.alive_at > now() - make_interval(secs => minion_lease_timeout_s())) AS online;

-- name: known_models
-- The models the pool knows, one row per model ($1: that model only; NULL: all): the kinds it is
-- known for, when it was first advertised, and whether an executor online now serves it.
-- The capabilities online now are gathered once and joined by hash: a probe of every executor's
-- capabilities per known model took 5.9 s for 10 x 1,024 models.
WITH online AS (
    SELECT DISTINCT c.capability
      FROM executors e JOIN heartbeats h ON h.executor_id = e.id
     CROSS JOIN unnest(e.capabilities) AS c(capability)
     WHERE e.status = 'online' AND h.alive_at > now() - make_interval(secs => minion_lease_timeout_s()))
SELECT k.model, array_agg(k.kind ORDER BY k.kind) AS kinds, min(k.advertised_at) AS advertised_at,
       bool_or(o.capability IS NOT NULL) AS online
FROM known_models k LEFT JOIN online o ON o.capability = k.capability
WHERE $1::text IS NULL OR k.model = $1
GROUP BY k.model
ORDER BY k.model;

-- name: submit_interactive
-- The task's id, and what its subtask is claimed as (the payload of its NOTIFY, sql/schema/03_notify.sql).
SELECT minion_openai_submit_interactive($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS task_id,
       minion_capability($4, $5) AS capability;

-- name: cancel_task
SELECT minion_cancel_task($1);

-- name: team_input_bytes
-- Input bytes team $1 stores (what its quota is measured against).
SELECT minion_team_input_bytes($1);
