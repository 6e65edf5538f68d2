-- Statements behind the web UI's extra views (loaded by minions.db.queries as Queries("web")).

-- name: task_subtasks
-- One page of a task's subtasks in input order, with the current lease holder and the history of
-- attempts (ended ones from subtask_attempts, plus the running one of a leased subtask, outcome
-- 'running'), each with the fingerprint and precision of the model it ran on (sql/schema/05_executors.sql,
-- minion_attempt_model).
-- $1 task id, $2 cursor (subtask_id after which to list), $3 limit.
SELECT s.subtask_id, s.state, s.records, s.attempts, e.name AS executor, s.leased_at, s.done_at,
       s.last_error,
       coalesce((
           SELECT jsonb_agg(jsonb_build_object(
                      'attempt', h.attempt, 'executor', h.executor, 'outcome', h.outcome,
                      'error', h.error, 'started_at', h.started_at, 'ended_at', h.ended_at,
                      'seconds', h.seconds, 'fingerprint', h.fingerprint, 'precision', h.precision)
                  ORDER BY h.started_at, h.attempt, h.ended_at NULLS LAST)
             FROM (
                   SELECT a.attempt, ae.name AS executor, a.outcome, a.error, a.started_at, a.ended_at,
                          round(coalesce(a.seconds, extract(epoch FROM a.ended_at - a.started_at))::numeric,
                                3) AS seconds, m.fingerprint, m.precision
                     FROM subtask_attempts a
                     LEFT JOIN executors ae ON ae.id = a.executor_id
                    CROSS JOIN LATERAL minion_attempt_model(a.executor_id, s.capability, a.started_at) m
                    WHERE a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                   UNION ALL
                   SELECT s.attempts, e.name, 'running', NULL, s.leased_at, NULL,
                          round(extract(epoch FROM now() - s.leased_at)::numeric, 3), m.fingerprint, m.precision
                     FROM minion_attempt_model(s.lease_executor, s.capability, s.leased_at) m
                    WHERE s.state = 'leased'
                  ) h
       ), '[]') AS history
FROM subtasks s
LEFT JOIN executors e ON e.id = s.lease_executor
WHERE s.task_id = $1 AND s.subtask_id > $2
ORDER BY s.subtask_id
LIMIT $3;
