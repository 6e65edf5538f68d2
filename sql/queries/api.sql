-- Every statement the API service runs, by name (loaded by minions.db.queries).

-- name: ping
SELECT 1;

-- name: token_by_hash
-- expires_in_s: how long the API may cache the answer at most (NULL: the token never expires).
SELECT id, role, team::text AS team, extract(epoch FROM expires_at - now())::double precision AS expires_in_s
FROM api_tokens
WHERE token_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now());

-- name: list_tokens
-- $1 status filter (NULL: all). Never the hash: a listing shows the prefix and id only.
SELECT * FROM minion_tokens WHERE $1::text IS NULL OR status = $1 ORDER BY id;

-- name: token_by_id
SELECT * FROM minion_tokens WHERE id = $1;

-- name: create_token
SELECT minion_create_token($1, $2, $3, $4, $5, $6, $7, $8);

-- name: revoke_token
SELECT minion_revoke_token($1);

-- name: store_signing_key
SELECT value FROM minion_settings WHERE key = 'store_signing_key';

-- name: submit_task
-- The new task as task_by_id shows it (a fresh task: nothing leased or ended yet), or no row when the
-- name is taken. $13-$16: the subtasks of a small task split at submission, or NULL; $17 its records
-- when they are kept in the database (sql/schema/08_inputs.sql), else NULL; $18 the team's input quota (0: none).
-- $19: the submitter is held to the team's priority cap (a user): a priority above it raises
-- priority_above_cap and nothing is submitted (sql/schema/14_teams.sql). $20: its placement ('any', 'trusted').
-- capability: what its subtasks are claimed as (the payload of their NOTIFY, sql/schema/03_notify.sql).
SELECT t.*, t.open_subtasks::bigint AS subtasks_pending, 0::bigint AS subtasks_leased, 0::bigint AS subtasks_checking,
       0::bigint AS subtasks_running,
       0::bigint AS subtasks_done, 0::bigint AS subtasks_failed, 0::bigint AS subtasks_cancelled,
       0::bigint AS records_done_live,
       minion_task_servable(t.team, t.kind, t.model) AS servable,
       minion_capability(t.kind, t.model) AS capability
FROM minion_submit_task($1, $2, $3, $4, $5, $6, minion_priority_within_cap($1, $7, $19), $8, $9, $10, $11,
                        $12, $13::bigint[], $14::bigint[], $15::bigint[], $16::integer[], $17::bytea, $18, $20) t;

-- name: priority_within_cap
-- $2 when a submitter ($3: held to the cap) may give it to a task of team $1; else raises priority_above_cap.
SELECT minion_priority_within_cap($1, $2, $3);

-- name: task_request_hash
SELECT id, request_hash FROM tasks WHERE team = $1 AND project = $2 AND name = $3;

-- name: task_by_name
SELECT t.*, c.subtasks_pending, c.subtasks_leased, c.subtasks_done, c.subtasks_failed, c.subtasks_cancelled,
       c.subtasks_checking, minion_task_running(t.id) AS subtasks_running,
       c.records_done AS records_done_live,  -- the row's counter plus the progress slots
       CASE WHEN t.finished_at IS NULL THEN minion_task_servable(t.team, t.kind, t.model) END AS servable,
       -- sql/schema/11_checks.sql: results it holds of executors quarantined after it ended
       (SELECT jsonb_agg(jsonb_build_object('executor_id', w.executor_id, 'subtasks', w.subtasks,
                                            'reason', w.reason) ORDER BY w.noted_at)
          FROM task_quarantine_warnings w WHERE w.task_id = t.id) AS quarantined_results,
       -- sql/schema/15_fair_share.sql: waiting with work pending while its executors serve others
       (SELECT w.since FROM task_starvation w WHERE w.task_id = t.id) AS starving_since,
       -- sql/schema/11_checks.sql: volunteers' results held past the check wait, no replica able to run
       (SELECT count(*) FROM subtask_checks k WHERE k.task_id = t.id AND k.overdue) AS held_for_check
FROM tasks t
CROSS JOIN LATERAL minion_task_counts(t.id) c
WHERE t.team = $1 AND t.project = $2 AND t.name = $3;

-- name: task_by_id
SELECT t.*, c.subtasks_pending, c.subtasks_leased, c.subtasks_done, c.subtasks_failed, c.subtasks_cancelled,
       c.subtasks_checking, minion_task_running(t.id) AS subtasks_running,
       c.records_done AS records_done_live,  -- the row's counter plus the progress slots
       CASE WHEN t.finished_at IS NULL THEN minion_task_servable(t.team, t.kind, t.model) END AS servable,
       -- sql/schema/11_checks.sql: results it holds of executors quarantined after it ended
       (SELECT jsonb_agg(jsonb_build_object('executor_id', w.executor_id, 'subtasks', w.subtasks,
                                            'reason', w.reason) ORDER BY w.noted_at)
          FROM task_quarantine_warnings w WHERE w.task_id = t.id) AS quarantined_results,
       -- sql/schema/15_fair_share.sql: waiting with work pending while its executors serve others
       (SELECT w.since FROM task_starvation w WHERE w.task_id = t.id) AS starving_since,
       -- sql/schema/11_checks.sql: volunteers' results held past the check wait, no replica able to run
       (SELECT count(*) FROM subtask_checks k WHERE k.task_id = t.id AND k.overdue) AS held_for_check
FROM tasks t
CROSS JOIN LATERAL minion_task_counts(t.id) c
WHERE t.id = $1;

-- name: list_tasks
-- $1 team (NULL: all), $2 project, $3 status, $4 cursor (id below which to list), $5 limit,
-- $6 the OpenAI interactive lane's requests (tasks at its priority, sql/schema/10_openai.sql):
-- 'false' leaves them out, 'true' lists only them, 'all' both.
SELECT t.*, c.subtasks_pending, c.subtasks_leased, c.subtasks_done, c.subtasks_failed, c.subtasks_cancelled,
       c.subtasks_checking, minion_task_running(t.id) AS subtasks_running,
       c.records_done AS records_done_live,  -- the row's counter plus the progress slots
       CASE WHEN t.finished_at IS NULL THEN minion_task_servable(t.team, t.kind, t.model) END AS servable
FROM tasks t
CROSS JOIN LATERAL minion_task_counts(t.id) c
WHERE ($1::text IS NULL OR t.team = $1)
  AND ($2::text IS NULL OR t.project = $2)
  AND ($3::text IS NULL OR t.status = $3)
  AND ($4::bigint IS NULL OR t.id < $4)
  AND ($6::text = 'all' OR (t.priority = minion_openai_interactive_priority()) = ($6::text = 'true'))
ORDER BY t.id DESC
LIMIT $5;

-- name: cancel_task
SELECT minion_cancel_task($1);

-- name: result_subtasks
-- One page of a task's subtasks in input order, for streaming results in constant memory.
SELECT subtask_id, state, output_key, result_key, result_sha256, result_bytes, result_data, last_error, byte_start,
       byte_end, records
FROM subtasks WHERE task_id = $1 AND subtask_id > $2
ORDER BY subtask_id LIMIT $3;

-- name: executor_for_token
SELECT id, token_id, team::text AS team, capabilities, status FROM executors WHERE id = $1;

-- name: register_executor
-- verdict, executor_id, retry_after_s (sql/schema/05_executors.sql: bounded per token).
SELECT * FROM minion_register_executor_bounded($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: lease_info
SELECT * FROM minion_lease_info($1);

-- name: lease_to_complete
-- As lease_info, with input_data: the range of a kept input (sql/schema/08_inputs.sql), for the complete's check.
SELECT i.*, CASE WHEN i.input_uri IS NULL THEN minion_kept_input(i.task_id, i.byte_start, i.byte_end) END
       AS input_data
FROM minion_lease_info($1) i;

-- name: kept_input
-- Bytes [$2, $3) of task $1's kept input (sql/schema/08_inputs.sql), NULL when its input is an object.
SELECT minion_kept_input($1, $2, $3);

-- name: output_writable
-- The local store takes a PUT of an output key only while its lease is live.
SELECT minion_output_writable($1);

-- name: input_readable
-- The local store serves a lease's input URL (token $1, bytes [$2, $3)) only while that lease is live.
SELECT minion_input_readable($1, $2, $3);

-- name: lease_inputs
-- The input object and range of each live lease among tokens $1 (a heartbeat renews their input URLs).
SELECT t.token AS lease_token, i.input_uri, i.byte_start, i.byte_end
  FROM unnest($1::uuid[]) AS t(token), minion_lease_info(t.token) AS i;

-- name: complete
-- $4-$7: the verified copy of the output (result key, SHA-256, size, the bytes when kept in the row);
-- $8: the length of its vectors (an embedding output), pinned for the task (sql/schema/07_results.sql)
SELECT minion_complete($1, $2, $3, $4, $5, $6, $7, $8);

-- name: check_candidates
-- The results held for the check of the subtask whose replica token is $1 (sql/schema/11_checks.sql), by round.
SELECT c.round, c.result_key, c.result_sha256, c.result_bytes, c.result_data
  FROM subtask_backups b
  JOIN subtask_checks c ON c.task_id = b.task_id AND c.subtask_id = b.subtask_id
 WHERE b.lease_token = $1
 ORDER BY c.round;

-- name: check_vote
-- A replica's vote (sql/schema/11_checks.sql): $1 its token, $2 records, $3 seconds, $4-$8 its verified copy (key,
-- SHA-256, size, kept bytes, vector length), $9 the round of the held result it agrees with (NULL: none).
SELECT minion_check_vote($1, $2, $3, $4, $5, $6, $7, $8, $9::smallint);

-- name: settle_quarantines
-- The rest of each quarantine a vote flagged (sql/schema/11_checks.sql): leases released, results run again.
SELECT minion_settle_quarantines();

-- name: release_quarantine
-- An admin lifts executor $1's quarantine (sql/schema/11_checks.sql); NULL when it was not quarantined.
SELECT minion_release_quarantine($1);

-- name: quarantine_reason
-- Why executor $1 is quarantined (NULL: it is not).
SELECT quarantine_reason FROM executors WHERE id = $1;

-- name: task_dimension
-- The length every vector of task $1 has (sql/schema/07_results.sql), NULL before its first committed one.
SELECT embedding_dimension FROM tasks WHERE id = $1;

-- name: fail
SELECT minion_fail($1, $2, $3);

-- name: release
SELECT minion_release($1);

-- name: deregister
SELECT minion_deregister($1);

-- name: list_executors
-- $1 team filter (NULL: all), $2 the viewer's team scope
-- (NULL: sees all). A scoped viewer sees of an executor outside its team (a shared one) neither its
-- hardware nor other teams' preferences and work: its own team's only.
SELECT e.id, e.name, e.team::text AS team, e.kinds, e.models, e.registered_at,
       CASE WHEN $2::text IS NULL OR e.team = $2 THEN e.hardware ELSE '{}'::jsonb END AS hardware,
       ($2::text IS NOT NULL AND e.team IS DISTINCT FROM $2) AS details_hidden,
       h.alive_at AS last_heartbeat_at,
       minion_executor_status(e.status, minion_lease_count(e.id), h.alive_at, minion_lease_timeout_s()) AS status,
       coalesce((SELECT jsonb_agg(jsonb_build_object('team', p.team, 'project', p.project,
                                                     'task_name', p.task_name) ORDER BY p.position)
                   FROM executor_preferences p WHERE p.executor_id = e.id
                    AND ($2::text IS NULL OR p.team = $2)), '[]') AS preferences,
       coalesce((SELECT jsonb_agg(jsonb_build_object('team', s.team, 'project', s.project,
                                                     'task_name', s.task_name, 'subtask_id', s.subtask_id,
                                                     'attempt', s.attempts, 'leased_at', s.leased_at)
                                  ORDER BY s.leased_at)
                   FROM subtasks s WHERE s.lease_executor = e.id AND s.state = 'leased'
                    AND ($2::text IS NULL OR s.team = $2)), '[]') AS current,
       -- What it loads for each model (sql/schema/05_executors.sql); none: an agent that reports none.
       coalesce((SELECT jsonb_agg(DISTINCT jsonb_build_object('model', f.model, 'fingerprint', f.fingerprint,
                                                              'precision', f.precision, 'backend', f.backend,
                                                              'proofs', f.proofs))
                   FROM executor_fingerprints f WHERE f.executor_id = e.id), '[]') AS fingerprints,
       -- Trust (sql/schema/11_checks.sql): results agreed with and outvoted by other executors', and a quarantine.
       -- Vouched: its token's (api_tokens.trusted); its results are never run again, it never loses a vote.
       e.agreements, e.disagreements, e.trusted, e.quarantined_at, e.quarantine_reason,
       minion_executor_vouched(e.id) AS vouched, minion_token_owner(e.token_id) AS owner
FROM executors e LEFT JOIN heartbeats h ON h.executor_id = e.id
WHERE $1::text IS NULL OR e.team = $1 OR e.team IS NULL
ORDER BY e.name;

-- name: record_input
-- $1 uri, $2 team (NULL: an unscoped upload), $3 bytes, $4 token id, $5 the team's quota (0: none)
SELECT minion_record_input($1, $2, $3, $4, $5);

-- name: team_input_bytes
SELECT minion_team_input_bytes($1);

-- name: input_use
-- $1 the task's team, $2 the input URI, $3 the submitter's token is unscoped, $4 it is an admin's
SELECT minion_input_use($1, $2, $3, $4);

-- name: delete_task
SELECT minion_delete_task($1);

-- name: claim_batch
-- $1 executor, $2 the caller's API token id (NULL: an admin), $3 at most this many, $4 straggler factor.
-- input_data: the range of a kept input (sql/schema/08_inputs.sql), read in the claim's own statement.
WITH c AS (SELECT * FROM minion_claim_batch($1, $2, $3, $4))
SELECT c.*, CASE WHEN c.verdict = 'leased' AND c.input_uri IS NULL
                 THEN minion_kept_input(c.task_id, c.byte_start, c.byte_end) END AS input_data
FROM c;

-- name: heartbeat_as
-- $1 executor, $2 the caller's API token id (NULL: an admin), $3 the lease tokens it names
SELECT * FROM minion_heartbeat_as($1, $2, $3);

-- name: complete_batch
-- Parallel arrays: tokens, records, seconds, and each verified copy (result key, SHA-256, size, kept bytes,
-- vector length)
SELECT * FROM minion_complete_batch($1, $2, $3, $4, $5, $6, $7, $8);

-- name: fail_batch
SELECT * FROM minion_fail_batch($1, $2, $3);

-- name: release_batch
SELECT * FROM minion_release_batch($1);

-- name: result_parts
-- A compacted task's result parts in order; no row while it is not (fully) compacted.
SELECT p.part, p.first_subtask, p.last_subtask, p.key, p.sha256, p.bytes, p.records
FROM result_parts p WHERE p.task_id = $1 AND minion_task_compacted($1)
ORDER BY p.part;

-- name: set_executor_fingerprints
-- $1 executor id, $2 [{model, fingerprint, precision, backend}] (sql/schema/05_executors.sql), in the registration's transaction.
SELECT minion_set_executor_fingerprints($1, $2::jsonb);

-- name: verify_task
-- A verification task of finished task $1 named $2 (sql/schema/11_checks.sql): $3 every done subtask, else those whose
-- result came from an executor now quarantined; $4 the caller's token. task_id NULL: nothing to
-- verify (subtasks 0), or the name is taken (subtasks -1).
SELECT * FROM minion_verify_task($1, $2, $3, $4);

-- name: replica_checks
-- The held results each of the leases $1 checks, in round order: none for a lease that is not a
-- spot check's replica (sql/schema/11_checks.sql). Sent with a completion replica, to verify their proofs.
SELECT b.lease_token, c.round, c.result_key, c.result_sha256, c.result_bytes, c.result_data
  FROM subtask_backups b
  JOIN subtask_checks c ON c.task_id = b.task_id AND c.subtask_id = b.subtask_id
 WHERE b.lease_token = ANY ($1::uuid[])
 ORDER BY b.lease_token, c.round;

-- name: usage
-- Compute-seconds and records of the attempts that ended at $1 or later, of team $2 (NULL: every
-- team), grouped by $3 ('team', 'executor' or 'owner'): sql/schema/16_usage.sql.
SELECT * FROM minion_usage($1, $2, $3);
-- name: team_shares
-- Each known team (one a token, task, executor or share names; $1: only that one) with its share in
-- force (sql/schema/14_teams.sql), by name; updated_at NULL: the defaults, never set.
SELECT s.team, s.weight, s.priority_cap, s.max_leases, s.updated_at
  FROM (SELECT team FROM api_tokens WHERE team IS NOT NULL
        UNION SELECT team FROM tasks
        UNION SELECT team FROM executors WHERE team IS NOT NULL
        UNION SELECT team FROM team_shares) k
 CROSS JOIN LATERAL minion_team_share(k.team) s
 WHERE $1::text IS NULL OR k.team = $1
 ORDER BY s.team;

-- name: set_team_share
-- The team's share after the change (a NULL keeps that value), or no row when no token, task or
-- executor names the team; a value out of bounds is a check_violation naming its constraint.
SELECT team, weight, priority_cap, max_leases, updated_at FROM minion_set_team_share($1, $2, $3, $4);

-- name: retry_task
SELECT verdict, subtasks FROM minion_retry_task($1);
