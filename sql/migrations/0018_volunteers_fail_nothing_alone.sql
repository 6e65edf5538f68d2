-- A volunteer's word alone never fails a subtask for good while checks are on: its non-retryable
-- failure is retried, and of one owner's failed or lost attempts of a subtask only the first counts
-- towards max_attempts (one hostile executor failed any task it could claim).
CREATE OR REPLACE FUNCTION minion_end_attempt(s subtasks, p_outcome text, p_error text, p_counts boolean,
                                   p_retry boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_att integer;
    backup subtask_backups%ROWTYPE;
    counts boolean := p_counts;
    retry boolean := p_retry;
BEGIN
    IF (counts OR NOT retry) AND p_outcome IN ('failed', 'lost') AND minion_trust_setting('trust_agreements', 0) > 0
       AND NOT minion_executor_vouched(s.lease_executor) THEN
        retry := true;
        counts := counts AND NOT EXISTS (
            SELECT 1 FROM subtask_attempts a
             WHERE a.task_id = s.task_id AND a.subtask_id = s.subtask_id AND a.outcome IN ('failed', 'lost')
               AND minion_executor_owner(a.executor_id) = minion_executor_owner(s.lease_executor));
    END IF;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
            p_outcome, p_error);

    -- A running backup takes over the lease: its work goes on, nothing is requeued.
    SELECT * INTO backup FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    IF FOUND THEN
        DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE subtasks
           SET lease_token = backup.lease_token, lease_executor = backup.executor_id,
               leased_at = backup.leased_at, last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE minion_subtask_acquirement SET executor_id = backup.executor_id, lease_token = backup.lease_token
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        RETURN;
    END IF;

    DELETE FROM minion_subtask_acquirement WHERE lease_token = s.lease_token;
    SELECT max_attempts INTO max_att FROM tasks WHERE id = s.task_id;

    IF retry AND (NOT counts OR s.attempts < max_att) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, lease_executor = NULL, leased_at = NULL,
               attempts = attempts - (NOT counts)::int,
               last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    ELSE
        UPDATE subtasks
           SET state = 'failed', lease_executor = NULL, done_at = now(),
               last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_subtask_closed(s.task_id, true,
            format('subtask %s failed after %s attempt(s): %s', s.subtask_id, s.attempts,
                   coalesce(p_error, s.last_error)));
    END IF;
END $$;

