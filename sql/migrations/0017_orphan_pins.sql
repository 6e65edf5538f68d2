-- A model pin whose fingerprint no online executor has reported for a while (MINIONS_PIN_RELEASE_S)
-- is released while work waits on it, the volunteers' results under it run again, and the task is
-- warned (pin_released). The revoke of a committed result is one function, shared with quarantines.
ALTER TABLE tasks ADD COLUMN pin_released_at timestamptz, ADD COLUMN pin_released_fingerprint text;

CREATE OR REPLACE FUNCTION minion_revoke_result(p_task_id bigint, p_subtask_id integer, p_records integer, p_lease_token uuid,
                                     p_why text, p_attempt_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE subtasks
       SET state = 'pending', lease_token = NULL, output_key = NULL, result_key = NULL, result_sha256 = NULL,
           result_bytes = NULL, result_data = NULL, done_at = NULL, check_token = NULL, last_error = p_why
     WHERE task_id = p_task_id AND subtask_id = p_subtask_id;
    UPDATE subtask_attempts SET outcome = 'revoked', error = p_attempt_error
     WHERE task_id = p_task_id AND subtask_id = p_subtask_id AND lease_token = p_lease_token
       AND outcome IN ('done', 'unchecked');
    INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
    VALUES (p_task_id, pg_backend_pid(), -1, 0, -p_records)
    ON CONFLICT (task_id, slot) DO UPDATE
       SET closed = p.closed - 1, records_done = p.records_done - p_records;
    UPDATE tasks SET embedding_dimension = NULL
     WHERE id = p_task_id AND embedding_dimension IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM subtasks x WHERE x.task_id = p_task_id AND x.state = 'done');
END $$;

CREATE OR REPLACE FUNCTION minion_settle_quarantines() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    q record;
    c record;
    d record;
    n integer := 0;
BEGIN
    FOR q IN SELECT e.id, e.quarantine_reason AS reason FROM executors e
              WHERE NOT e.quarantine_settled ORDER BY e.id LOOP
        PERFORM minion_end_executor_leases(q.id, 'released', 'executor quarantined: ' || q.reason, false);
        FOR c IN SELECT k.task_id, k.subtask_id, k.lease_token FROM subtask_checks k
                  WHERE k.executor_id = q.id ORDER BY k.task_id, k.subtask_id LOOP
            PERFORM 1 FROM subtasks WHERE task_id = c.task_id AND subtask_id = c.subtask_id FOR UPDATE;
            DELETE FROM subtask_checks WHERE lease_token = c.lease_token;
            CONTINUE WHEN NOT FOUND;
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'executor quarantined'
             WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND lease_token = c.lease_token
               AND outcome = 'candidate';
            IF NOT EXISTS (SELECT 1 FROM subtask_checks WHERE task_id = c.task_id AND subtask_id = c.subtask_id) THEN
                DELETE FROM subtask_backups WHERE task_id = c.task_id AND subtask_id = c.subtask_id;
                UPDATE subtasks SET state = 'pending', lease_token = NULL, check_token = NULL
                 WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND state = 'checking';
                n := n + 1;
            ELSE
                UPDATE subtasks s SET lease_token = k.lease_token
                  FROM subtask_checks k
                 WHERE s.task_id = c.task_id AND s.subtask_id = c.subtask_id
                   AND k.task_id = s.task_id AND k.subtask_id = s.subtask_id AND s.lease_token = c.lease_token;
            END IF;
        END LOOP;
        -- Its committed results in tasks that have not ended: revoked, run again (a reopened subtask
        -- counts as open again through this backend's progress slot, under the task row's lock, which
        -- a settle takes too: the task cannot end meanwhile). A task left with no committed result
        -- has its vector length fixed again by the next one (it may have been the liar's).
        FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
                   FROM subtask_attempts a
                   JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
                                  AND s.state = 'done' AND s.lease_token = a.lease_token
                   JOIN tasks t ON t.id = a.task_id
                  WHERE a.executor_id = q.id AND a.outcome IN ('done', 'unchecked')
                    AND t.status IN ('splitting', 'queued', 'running')
                  ORDER BY s.task_id, s.subtask_id
                    FOR UPDATE OF s LOOP
            PERFORM 1 FROM tasks WHERE id = d.task_id AND status IN ('splitting', 'queued', 'running') FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            PERFORM minion_revoke_result(d.task_id, d.subtask_id, d.records, d.lease_token,
                                         'its result came from a quarantined executor',
                                         'executor quarantined: ' || q.reason);
            n := n + 1;
        END LOOP;
        -- Tasks that ended with its results (after the revokes: a task that ended meanwhile is warned).
        INSERT INTO task_quarantine_warnings (task_id, executor_id, subtasks, reason)
        SELECT a.task_id, q.id, count(*), q.reason
          FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.executor_id = q.id AND a.outcome IN ('done', 'unchecked')
           AND t.status IN ('completed', 'failed', 'cancelled')
         GROUP BY a.task_id
        ON CONFLICT (task_id, executor_id) DO UPDATE SET subtasks = excluded.subtasks, reason = excluded.reason;
        UPDATE executors SET quarantine_settled = true WHERE id = q.id;
    END LOOP;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION minion_release_orphan_pins(p_after_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    t record;
    d record;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.id, k.fingerprint FROM tasks k
              WHERE k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision AND k.kind <> 'sleep'
                AND k.status IN ('queued', 'running')
                AND EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = k.id AND s.state IN ('pending', 'checking'))
                AND NOT EXISTS (SELECT 1 FROM executor_fingerprints f
                                  JOIN executors e ON e.id = f.executor_id
                                  JOIN heartbeats h ON h.executor_id = f.executor_id
                                 WHERE f.capability = minion_capability(k.kind, k.model)
                                   AND f.fingerprint = k.fingerprint AND e.quarantined_at IS NULL
                                   AND h.alive_at > now() - make_interval(secs => p_after_s))
              ORDER BY k.id LOOP
        -- Subtasks first, then the task: the lock order of every function that ends an attempt.
        FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
                   FROM subtasks s JOIN subtask_attempts a ON a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                                                         AND a.lease_token = s.lease_token
                  WHERE s.task_id = t.id AND s.state = 'done' AND a.outcome IN ('done', 'unchecked')
                    AND NOT minion_executor_vouched(a.executor_id)
                  ORDER BY s.subtask_id
                    FOR UPDATE OF s LOOP
            PERFORM 1 FROM tasks WHERE id = t.id AND status IN ('queued', 'running') FOR UPDATE;
            EXIT WHEN NOT FOUND;
            PERFORM minion_revoke_result(d.task_id, d.subtask_id, d.records, d.lease_token,
                                         'its result was a volunteer''s under a model pin released',
                                         format('model pin %s released: no executor reported it for %s s',
                                                t.fingerprint, p_after_s));
        END LOOP;
        UPDATE tasks SET fingerprint = NULL, pin_released_at = now(), pin_released_fingerprint = t.fingerprint
         WHERE id = t.id AND fingerprint = t.fingerprint AND status IN ('queued', 'running');
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

