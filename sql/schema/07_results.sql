-- Results: verified at complete, immutable once committed.
--
-- At complete the API reads the attempt's output once, checks it holds one line per input record
-- with the input's ids in order (and, for embeddings, one vector length), and keeps what it verified
-- where no URL names it: a copy under results/, or, for an output of at most
-- MINIONS_RESULT_IN_DATABASE_BYTES, the bytes in the subtask's row, in the complete's own
-- transaction. The subtask records its SHA-256 and size; results are served from it and checked
-- against them. The attempt's output key stays the record of which attempt committed; a writer still
-- holding that attempt's PUT URL can no longer change what users read.
--
-- Compaction: a completed task's results are copied in subtask order into a few large parts
-- (`parts/<task>/<part>-<nonce>.jsonl`) whose SHA-256 and size are recorded, so parts still serve
-- exactly the verified bytes and a client can fetch them by presigned GET straight from the store.
-- A part is written first and recorded after (minion_record_result_part); a part written but never
-- recorded is garbage (minion_gc_parts). A compaction resumes after the last recorded part. Only once
-- every subtask is covered (minion_finish_compaction) are the parts served and the per-subtask
-- objects (and kept bytes, after the grace period: minion_gc_kept_results) garbage.

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

CREATE FUNCTION minion_task_compacted(p_task_id bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM compacted_tasks WHERE task_id = p_task_id)
$$;

-- Completed tasks not yet compacted, oldest end first. Failed and cancelled tasks are not compacted:
-- their results (with an error line per lost record) keep being read per subtask.
CREATE FUNCTION minion_tasks_to_compact(p_limit integer) RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    SELECT t.id FROM tasks t
     WHERE t.status = 'completed'
       AND NOT EXISTS (SELECT 1 FROM compacted_tasks c WHERE c.task_id = t.id)
     ORDER BY t.finished_at, t.id
     LIMIT p_limit
$$;

-- Record one written part: true, or false when it is not the next part of a completed, uncompacted
-- task (another compactor recorded this part first, the task was deleted): the caller's object is
-- then garbage. Parts follow each other without gaps, in subtask order.
CREATE FUNCTION minion_record_result_part(p_task_id bigint, p_part integer, p_first integer, p_last integer,
                                          p_key text, p_sha256 bytea, p_bytes bigint, p_records bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    prev result_parts;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status = 'completed' FOR SHARE;
    IF NOT FOUND OR minion_task_compacted(p_task_id) THEN
        RETURN false;
    END IF;
    SELECT * INTO prev FROM result_parts WHERE task_id = p_task_id ORDER BY part DESC LIMIT 1;
    IF p_part <> coalesce(prev.part + 1, 0) OR p_first <= coalesce(prev.last_subtask, -1) THEN
        RETURN false;
    END IF;
    INSERT INTO result_parts (task_id, part, first_subtask, last_subtask, key, sha256, bytes, records)
    VALUES (p_task_id, p_part, p_first, p_last, p_key, p_sha256, p_bytes, p_records)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

-- Mark a task compacted once its parts cover every subtask: true when it is (now or already).
CREATE FUNCTION minion_finish_compaction(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    covered integer;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status = 'completed' FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF minion_task_compacted(p_task_id) THEN
        RETURN true;
    END IF;
    SELECT coalesce(max(last_subtask), -1) INTO covered FROM result_parts WHERE task_id = p_task_id;
    IF EXISTS (SELECT 1 FROM subtasks WHERE task_id = p_task_id AND (subtask_id > covered OR state <> 'done')) THEN
        RETURN false;
    END IF;
    INSERT INTO compacted_tasks (task_id, parts, bytes)
    SELECT p_task_id, count(*), coalesce(sum(bytes), 0) FROM result_parts WHERE task_id = p_task_id
    ON CONFLICT DO NOTHING;
    RETURN true;
END $$;

-- Garbage among part keys: a part no row records (written by a compaction that crashed or lost a
-- race before recording it, or of a deleted task). The collector's grace period covers the moment
-- between a part's write and its record.
CREATE FUNCTION minion_gc_parts(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT k FROM unnest(p_keys) AS k
     WHERE k ~ '^parts/[0-9]{1,18}/[0-9]{1,9}-[0-9a-f]{16}\.jsonl$'
       AND NOT EXISTS (SELECT 1 FROM result_parts p WHERE p.key = k)
$$;

-- Garbage among per-subtask keys (`outputs/<task>/…`, `results/<task>/…`) once their task is
-- compacted: a compacted task is completed (no live lease) and its committed bytes are in its recorded
-- parts, which is what results are read from. The collector asks this beside minion_gc_outputs
-- and minion_gc_results, which judge the keys of tasks not compacted.
CREATE FUNCTION minion_gc_compacted(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT k FROM unnest(p_keys) AS k,
                  regexp_match(k, '^(outputs|results)/([0-9]{1,18})/[0-9]{1,9}/[0-9A-Za-z._-]+\.jsonl$') AS m
     WHERE m IS NOT NULL AND minion_task_compacted(m[2]::bigint)
$$;

-- Drop the kept bytes of the next p_limit subtasks (by id) that have some, of one such task: (task,
-- rows, bytes), no row when no task is due. p_dry_run: what would be dropped, task by task, nothing changed.
CREATE FUNCTION minion_gc_kept_results(p_grace_s double precision, p_dry_run boolean, p_limit integer)
RETURNS TABLE (task_id bigint, subtasks bigint, bytes bigint) LANGUAGE plpgsql AS $$
DECLARE
    due bigint;
    from_id integer;
    last_id integer;
BEGIN
    IF p_dry_run THEN
        RETURN QUERY
            SELECT c.task_id, count(s.subtask_id), coalesce(sum(s.result_bytes), 0)::bigint
              FROM compacted_tasks c JOIN subtasks s ON s.task_id = c.task_id AND s.result_data IS NOT NULL
             WHERE NOT c.kept_results_dropped AND c.compacted_at < now() - make_interval(secs => p_grace_s)
             GROUP BY c.task_id;
        RETURN;
    END IF;
    SELECT c.task_id, c.kept_results_from INTO due, from_id FROM compacted_tasks c
     WHERE NOT c.kept_results_dropped AND c.compacted_at < now() - make_interval(secs => p_grace_s)
     ORDER BY c.compacted_at LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    task_id := due;
    WITH pick AS (
        SELECT v.subtask_id FROM subtasks v
         WHERE v.task_id = due AND v.subtask_id >= from_id AND v.result_data IS NOT NULL
         ORDER BY v.subtask_id LIMIT p_limit),
    dropped AS (
        UPDATE subtasks s SET result_data = NULL FROM pick
         WHERE s.task_id = due AND s.subtask_id = pick.subtask_id
        RETURNING s.subtask_id, s.result_bytes)
    SELECT count(*), coalesce(sum(d.result_bytes), 0)::bigint, max(d.subtask_id)
      INTO subtasks, bytes, last_id FROM dropped d;
    -- Done when the walk found fewer than it could take, or nothing kept lies past its last row (the
    -- probe stops at the next kept row, where the next call starts: the task is still walked once).
    UPDATE compacted_tasks c
       SET kept_results_from = coalesce(last_id + 1, from_id),
           kept_results_dropped = subtasks < p_limit
                                  OR NOT EXISTS (SELECT 1 FROM subtasks v
                                                  WHERE v.task_id = due AND v.subtask_id > last_id
                                                    AND v.result_data IS NOT NULL)
     WHERE c.task_id = due;
    RETURN NEXT;
END $$;

-- Whether task p_task_id's vectors may have p_dimension elements: fixed by the first caller
-- (the caller has locked one of the task's subtasks, as every complete does: the lock order is
-- subtasks, then the task).
CREATE FUNCTION minion_pin_dimension(p_task_id bigint, p_dimension integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    pinned integer;
BEGIN
    SELECT embedding_dimension INTO pinned FROM tasks WHERE id = p_task_id;
    IF pinned IS NULL THEN
        UPDATE tasks SET embedding_dimension = p_dimension WHERE id = p_task_id AND embedding_dimension IS NULL;
        IF FOUND THEN
            RETURN true;
        END IF;
        -- A concurrent first complete fixed it meanwhile (this statement waited for its commit).
        SELECT embedding_dimension INTO pinned FROM tasks WHERE id = p_task_id;
    END IF;
    RETURN pinned = p_dimension;
END $$;

-- minion_complete for each lease of a batch, in one statement; the tasks it touched settle once,
-- after the last close (minion_settle_after_batch).
CREATE FUNCTION minion_complete_batch(p_tokens uuid[], p_records integer[], p_seconds double precision[],
                                      p_result_keys text[], p_sha256s bytea[], p_bytes bigint[],
                                      p_result_data bytea[] DEFAULT NULL, p_dimensions integer[] DEFAULT NULL)
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_complete(p_tokens[i], p_records[i], p_seconds[i], p_result_keys[i], p_sha256s[i],
                                   p_bytes[i], p_result_data[i], p_dimensions[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;

-- Commits a lease's verified result: 'ok', 'repeat' (a retried complete of a result already
-- committed or held), 'lost' / 'cancelled' (the token is no longer current: nothing changes), or
-- 'records_mismatch' (not one result line per record), or 'dimension_mismatch' (its vectors' length is not the task's: refused, nothing changed, the lease
-- still live). The referee row is deleted by token.
-- A lease chosen for a check (s.check_token) holds its result as a candidate instead of committing it:
-- 'held'; its subtask stays open, 'checking', until a replica votes. A held result fixes no vector
-- length (only a committed one does), but must fit the length fixed. A replica's complete changes
-- nothing here: 'replica', the API then compares and calls minion_check_vote.
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                           p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                           p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL,
                                           p_dimension integer DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    held boolean;
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
    IF role = 'held' THEN
        RETURN 'repeat';  -- this very lease's result is held for its check already
    END IF;
    IF role NOT IN ('primary', 'backup', 'replica') THEN
        RETURN role;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    IF role = 'replica' THEN
        -- Compared, then voted, whatever its vectors' length: a replica that disagrees with the length
        -- a liar's committed result fixed must count against it, not be refused.
        RETURN 'replica';
    END IF;
    -- Held: the lease chosen for a check, or a straggler backup of an executor not trusted yet
    -- (its first results are all checked, whichever way it got the lease).
    held := coalesce(s.check_token = s.lease_token, false)
            OR (role = 'backup' AND minion_untrusted_backup(s, p_token));
    IF p_dimension IS NOT NULL AND NOT (CASE WHEN held THEN minion_dimension_fits(s.task_id, p_dimension)
                                             ELSE minion_pin_dimension(s.task_id, p_dimension) END) THEN
        RETURN 'dimension_mismatch';
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
    IF held THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        VALUES (s.task_id, s.subtask_id, 1, p_token, winner_executor, s.attempts,
                minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
                p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, winner_started);
        UPDATE subtasks
           SET state = 'checking', lease_executor = NULL, lease_token = p_token, check_token = NULL
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_drop_referee_row(s.lease_token);
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'candidate',
                p_records, p_seconds);
        RETURN 'held';
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

-- Garbage collection of committed results (`results/<task>/<subtask>/<attempt>-<token>-<nonce>.jsonl`,
-- the verified copies made at complete): one is garbage when no subtask names it as its result and no
-- held candidate does (its task was deleted, or its complete lost a race or was refused after the
-- copy). A copy is written just before its complete records it: the collector's grace period
-- (MINIONS_GC_GRACE_S) covers that. Outputs under `outputs/` are judged by minion_gc_outputs.
CREATE FUNCTION minion_gc_results(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT r.k FROM (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^results/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-'
                                  '[0-9a-f]{16}\.jsonl$') AS m
         WHERE m IS NOT NULL) r
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.task_id = r.task_id AND s.subtask_id = r.subtask_id AND s.result_key = r.k)
       AND NOT EXISTS (SELECT 1 FROM subtask_checks c
                        WHERE c.task_id = r.task_id AND c.subtask_id = r.subtask_id AND c.result_key = r.k)
$$;
