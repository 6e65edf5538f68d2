-- A complete removes its lease's referee row through an index, whatever the cached plan (issue 11).
--
-- minion_complete (230's) deleted the lease's row of minion_subtask_acquirement by (task_id,
-- subtask_id), a pair no index of that table leads with: a sequential scan. The table holds one live
-- row per lease, a few dozen, but every claim inserts a row and every complete deletes one, so
-- between two vacuums it grows by a page every ~60 leases, and the scan reads every page: 43 pages
-- per complete at 20,000 subtasks in bench/drain.py's sql-new arm (pg_stat_statements), more the
-- longer autovacuum waits (it wakes once a minute at most). An index alone does not fix it: each
-- connection caches a generic plan on its first calls, when the table is one page, and a scan of
-- one page beats any index there, so the cached plan keeps scanning as the table grows.
--
-- The row is deleted by its lease token (the table's UNIQUE (lease_token), the key the release
-- path deletes by, sql/030: a leased subtask's token is its row's) in a statement of its own that
-- plans with sequential scans off, so its cached plan reads the index whatever the table's size when
-- it was made.

CREATE FUNCTION minion_drop_referee_row(p_token uuid) RETURNS void
LANGUAGE sql SET enable_seqscan = off AS $$
    DELETE FROM minion_subtask_acquirement WHERE lease_token = p_token
$$;

-- (Replaces 230's: the referee row deleted by token; nothing else changes.)
CREATE OR REPLACE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    winner_executor uuid;
    winner_started timestamptz;
BEGIN
    IF p_sha256 IS NOT NULL AND p_result_key IS NULL AND p_result_data IS NULL THEN
        RAISE EXCEPTION 'a committed result needs its bytes: a result key or the bytes themselves'
            USING ERRCODE = 'check_violation';
    END IF;
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'lost' AND s.state = 'done' AND s.lease_token = p_token THEN
        RETURN 'repeat';  -- this very lease committed already: a retried complete is answered the same
    END IF;
    IF role NOT IN ('primary', 'backup') THEN
        RETURN role;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id RETURNING * INTO b;
    IF role = 'primary' THEN
        winner_executor := s.lease_executor;
        winner_started := s.leased_at;
        IF b.lease_token IS NOT NULL THEN
            INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                          started_at, outcome)
            VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at,
                    'superseded');
        END IF;
    ELSE
        winner_executor := b.executor_id;
        winner_started := b.leased_at;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                      started_at, outcome)
        VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
                'superseded');
    END IF;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = p_token,
           output_key = minion_output_key(task_id, subtask_id, attempts, p_token),
           result_key = p_result_key, result_sha256 = p_sha256, result_bytes = p_bytes,
           result_data = p_result_data
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    PERFORM minion_drop_referee_row(s.lease_token);
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;
