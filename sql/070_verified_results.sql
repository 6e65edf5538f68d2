-- Verified, immutable results (issue 8, items 3 and 4).
--
-- At complete the API reads the attempt's output once, checks it holds one line per input record
-- with the input's ids in order, and copies it as it reads to a result key that no URL ever names
-- (results/…). The subtask records that key with the SHA-256 and size of the bytes it verified;
-- results are served from it and checked against them. The attempt's output key (output_key) stays
-- the record of which attempt committed; a writer still holding that attempt's PUT URL can no longer
-- change what users read.

ALTER TABLE subtasks
    ADD COLUMN result_key    text,    -- the verified copy results are read from (NULL: committed before 070)
    ADD COLUMN result_sha256 bytea CHECK (result_sha256 IS NULL OR length(result_sha256) = 32),
    ADD COLUMN result_bytes  bigint CHECK (result_bytes IS NULL OR result_bytes >= 0),
    ADD CONSTRAINT subtasks_result_complete
        CHECK ((result_key IS NULL) = (result_sha256 IS NULL) AND (result_key IS NULL) = (result_bytes IS NULL));

-- The live lease a token names, with everything the API needs to verify its output: the API token of
-- the executor holding it, the object it must have written, and the input records it answers for.
-- No row when the token is no longer current. (Replaces 030's version, which returned only the first
-- two columns.)
DROP FUNCTION minion_lease_info(uuid);
CREATE FUNCTION minion_lease_info(p_token uuid, OUT owner bigint, OUT output_key text, OUT task_id bigint,
                                  OUT subtask_id integer, OUT attempt integer, OUT kind text,
                                  OUT input_uri text, OUT byte_start bigint, OUT byte_end bigint,
                                  OUT records integer)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtasks s JOIN executors e ON e.id = s.lease_executor JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = p_token AND s.state = 'leased'
    UNION ALL
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtask_backups b
      JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
      JOIN executors e ON e.id = b.executor_id
      JOIN tasks t ON t.id = s.task_id
     WHERE b.lease_token = p_token AND s.state = 'leased'
    LIMIT 1
$$;

-- Whether `p_key` is the output key of a live lease: the local store takes a PUT of an output key
-- only then, so an output URL stops working the moment its lease ends (complete, fail, release,
-- lost, cancel). The token is read from the key (minion_output_key's layout) and looked up.
CREATE FUNCTION minion_output_writable(p_key text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    tok text := substring(p_key FROM '^outputs/[0-9]+/[0-9]+/[0-9]+-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$');
BEGIN
    IF tok IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM minion_lease_info(tok::uuid) i WHERE i.output_key = p_key);
END $$;

-- Commit a result: 'ok'; 'repeat' when this very lease committed already (a retried complete, whose
-- answer the API gives as 200 again, committing nothing); or why not ('lost', 'cancelled',
-- 'records_mismatch'). Exactly one complete per subtask can succeed (a straggler's or its backup's);
-- a stale token changes nothing. p_result_key, p_sha256, p_bytes: the verified copy of the output
-- (the API always passes them; NULL only from psql, for an operator who vouches for the output).
-- (Replaces 030's three-argument version, which recorded no verified copy.)
DROP FUNCTION minion_complete(uuid, integer, double precision);
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                p_bytes bigint DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    winner_executor uuid;
    winner_started timestamptz;
BEGIN
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
           result_key = p_result_key, result_sha256 = p_sha256, result_bytes = p_bytes
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;
