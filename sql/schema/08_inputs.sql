-- Inputs: who may read which input object, how many input bytes a team may store, which stored
-- objects are garbage, and the small inputs kept in the database.
--
-- Inline records of at most MINIONS_INPUT_IN_DATABASE_BYTES that are split at submission are
-- committed with the task (task_inputs), in minion_submit_task's own transaction, and each claim
-- takes its range from there in the claim's own statement. Larger inputs, inputs given by URI, and
-- tasks the splitter splits keep their input objects. A task's input lives in one place: an object
-- (tasks.input_uri) or its task_inputs row, never both and never neither; kept bytes never change,
-- and go with their task.

CREATE FUNCTION minion_normalize_input_prefix(p_prefix text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN right(p_prefix, 1) = '/' THEN p_prefix ELSE p_prefix || '/' END
$$;

-- Allow a team to read an S3 prefix; true when it was not allowed before.
CREATE FUNCTION minion_allow_input(p_team text, p_prefix text) RETURNS boolean LANGUAGE sql AS $$
    WITH added AS (
        INSERT INTO team_input_prefixes (team, prefix)
        VALUES (p_team, minion_normalize_input_prefix(p_prefix))
        ON CONFLICT DO NOTHING RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM added)
$$;

-- Withdraw it; true when it was allowed. Tasks already submitted keep their input.
CREATE FUNCTION minion_disallow_input(p_team text, p_prefix text) RETURNS boolean LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM team_input_prefixes
         WHERE team = p_team AND prefix = minion_normalize_input_prefix(p_prefix) RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

-- A submission of team p_team names p_uri as its input: 'ok' (and the object's grace restarts), or
-- 'not_allowed'. Allowed: an object the team owns; an unscoped upload when the submitter's token is
-- unscoped; an s3:// URI under a prefix allowed for the team; anything for an admin token.
-- Task results are not inputs (no chaining): outputs/ objects are never recorded here.
CREATE FUNCTION minion_input_use(p_team text, p_uri text, p_unscoped boolean, p_admin boolean)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE input_objects SET used_at = now()
     WHERE uri = p_uri AND (team = p_team OR (team IS NULL AND (p_unscoped OR p_admin)));
    IF FOUND OR p_admin THEN
        RETURN 'ok';
    END IF;
    -- No '.' or '..' segments: an HTTP client may normalise them away, reading outside the prefix.
    IF p_uri LIKE 's3://%' AND p_uri !~ '/\.\.?(/|$)' AND EXISTS (
        SELECT 1 FROM team_input_prefixes p WHERE p.team = p_team AND starts_with(p_uri, p.prefix)) THEN
        RETURN 'ok';
    END IF;
    RETURN 'not_allowed';
END $$;

-- Garbage collection, step 1: records of inputs no task reads, untouched for p_grace_s. Returns
-- their URIs (the caller deletes the objects); p_dry_run: only says which. Deleting the record
-- first, under its row lock, is what makes a concurrent submission safe: minion_input_use either
-- touched the row before (so it is not stale any more) or finds it gone and refuses.
CREATE FUNCTION minion_gc_input_records(p_grace_s double precision, p_dry_run boolean, p_limit integer)
RETURNS TABLE (uri text, bytes bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_dry_run THEN
        RETURN QUERY
        SELECT o.uri, max(o.bytes) FROM input_objects o
         WHERE o.used_at < now() - make_interval(secs => p_grace_s)
           AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_uri = o.uri)
         GROUP BY o.uri LIMIT p_limit;
        RETURN;
    END IF;
    RETURN QUERY
    WITH stale AS (
        SELECT o.ctid FROM input_objects o
         WHERE o.used_at < now() - make_interval(secs => p_grace_s)
           AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_uri = o.uri)
         LIMIT p_limit FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM input_objects o USING stale WHERE o.ctid = stale.ctid RETURNING o.uri, o.bytes)
    -- An object still owned by another team (or touched since) stays: only URIs with no owner left.
    SELECT g.uri, max(g.bytes) FROM gone g
     WHERE NOT EXISTS (SELECT 1 FROM input_objects o WHERE o.uri = g.uri)
     GROUP BY g.uri;
END $$;

-- Step 2: of these input objects (listed from the store, already older than the grace period),
-- those nobody owns and no task reads: left by a crash between write and record, or written before
-- ownership was recorded.
CREATE FUNCTION minion_gc_unowned_inputs(p_uris text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT u FROM unnest(p_uris) AS u
     WHERE NOT EXISTS (SELECT 1 FROM input_objects o WHERE o.uri = u)
       AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_uri = u)
$$;

-- Delete a finished task (completed, failed or cancelled) and, by cascade, its subtasks and their
-- history: 'deleted', 'not_finished' (cancel it first), or 'missing'. Its input and result objects
-- become garbage, which the collector deletes after the grace period (and the team's quota gets the
-- input's bytes back).
CREATE FUNCTION minion_delete_task(p_task_id bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    finished timestamptz;
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id ORDER BY subtask_id FOR UPDATE;
    SELECT finished_at INTO finished FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF finished IS NULL THEN
        RETURN 'not_finished';
    END IF;
    DELETE FROM tasks WHERE id = p_task_id;
    RETURN 'deleted';
END $$;

-- A task has its input in exactly one place, checked at commit (the task's row is written before its
-- kept bytes, in one transaction).
CREATE FUNCTION minion_task_input_placed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = NEW.id) THEN
        RETURN NULL;  -- deleted again in the same transaction: its input went with it
    END IF;
    IF (NEW.input_uri IS NULL) = NOT EXISTS (SELECT 1 FROM task_inputs i WHERE i.task_id = NEW.id) THEN
        RAISE EXCEPTION 'task % must have its input either as an object (input_uri) or kept in task_inputs, '
                        'not both or neither', NEW.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER tasks_input_placed AFTER INSERT OR UPDATE OF input_uri ON tasks
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION minion_task_input_placed();

-- Kept bytes are the task's input for its whole life: the subtasks' ranges, the complete's check and
-- the error lines of its results all read them. Only the task's own deletion removes them.
CREATE FUNCTION minion_task_input_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the kept input of task % cannot change', OLD.task_id USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER task_inputs_fixed BEFORE UPDATE ON task_inputs
    FOR EACH ROW EXECUTE FUNCTION minion_task_input_fixed();

-- Bytes [p_start, p_end) of a task's kept input; NULL when the task keeps none (its input is an
-- object). What a claim sends inline and a complete checks an output against. VOLATILE, so that it
-- reads with a snapshot of its own: the claim's statement began before minion_claim_batch (fresh
-- snapshots) may lease a subtask of a task committed meanwhile, whose kept input a STABLE function
-- would not see.
CREATE FUNCTION minion_kept_input(p_task_id bigint, p_start bigint, p_end bigint) RETURNS bytea
LANGUAGE sql VOLATILE AS $$
    SELECT substring(i.data FROM (p_start + 1)::integer FOR (p_end - p_start)::integer)
      FROM task_inputs i WHERE i.task_id = p_task_id
$$;

-- Both tables carry the team and the bytes it stores: one pair of statement triggers counts either,
-- one UPDATE per team a statement touches (not one per row: a garbage collector's sweep deletes
-- thousands), the teams taken in order. A statement deleting inputs of several teams (the sweep,
-- retention) locks their count rows in that one order, so two of them never wait on each other in
-- a cycle (row triggers would lock them in the order the rows came, and could deadlock).
-- (A decrease is an UPDATE: an upsert checks the row it would insert, a negative count, first. Never
-- below 0: a count that drifted low must not stop the garbage collector's or retention's deletes.)
CREATE FUNCTION minion_inputs_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO team_input_usage AS u (team, bytes)
    SELECT coalesce(a.team::text, ''), sum(a.bytes) FROM added a GROUP BY 1 ORDER BY 1
    ON CONFLICT (team) DO UPDATE SET bytes = u.bytes + excluded.bytes;
    RETURN NULL;
END $$;

CREATE TRIGGER input_objects_added AFTER INSERT ON input_objects REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_added();

CREATE TRIGGER task_inputs_added AFTER INSERT ON task_inputs REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_added();

CREATE FUNCTION minion_inputs_removed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(g.team::text, '') AS team, sum(g.bytes) AS bytes
               FROM removed g GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER input_objects_removed AFTER DELETE ON input_objects REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_removed();

CREATE TRIGGER task_inputs_removed AFTER DELETE ON task_inputs REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_removed();

-- (input_objects.bytes never changes after its insert: only used_at does.)
CREATE FUNCTION minion_input_bytes_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the recorded size of input % cannot change', OLD.uri USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER input_objects_bytes_fixed BEFORE UPDATE OF bytes ON input_objects
    FOR EACH ROW WHEN (NEW.bytes IS DISTINCT FROM OLD.bytes) EXECUTE FUNCTION minion_input_bytes_fixed();

-- Input bytes a team stores (what its quota is measured against), read from the counts the
-- triggers keep.
CREATE FUNCTION minion_team_input_bytes(p_team text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT u.bytes FROM team_input_usage u WHERE u.team = coalesce(p_team, '')), 0)
$$;

-- Serializes one team's input recordings (objects and kept inputs), so that two concurrent ones
-- cannot both squeeze under the quota.
CREATE FUNCTION minion_lock_team_inputs(p_team text) RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('minion_input_quota:' || coalesce(p_team, ''), 0))
$$;

-- Record an input object the API wrote for a team, within the team's quota of stored input bytes
-- (p_quota 0: none; kept inputs and batch files count too, read from team_input_usage). 'ok', or
-- 'quota_exceeded' (nothing recorded). Recording an object the team already owns is 'ok' and changes
-- nothing. The advisory lock serializes one team's recordings, so two concurrent uploads cannot both
-- squeeze under the quota.
CREATE FUNCTION minion_record_input(p_uri text, p_team text, p_bytes bigint, p_token bigint,
                                               p_quota bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM minion_lock_team_inputs(p_team);
    PERFORM 1 FROM input_objects WHERE uri = p_uri AND team IS NOT DISTINCT FROM p_team;
    IF FOUND THEN
        UPDATE input_objects SET used_at = now() WHERE uri = p_uri AND team IS NOT DISTINCT FROM p_team;
        RETURN 'ok';
    END IF;
    IF p_quota > 0 AND minion_team_input_bytes(p_team) + p_bytes > p_quota THEN
        RETURN 'quota_exceeded';
    END IF;
    INSERT INTO input_objects (uri, team, bytes, created_by) VALUES (p_uri, p_team, p_bytes, p_token);
    RETURN 'ok';
END $$;

CREATE FUNCTION minion_input_readable(p_token uuid, p_start bigint, p_end bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM minion_lease_info(p_token) i
                    WHERE i.input_uri IS NOT NULL AND i.byte_start = p_start AND i.byte_end = p_end);
$$;

-- Garbage collection, step 3: of these output keys (listed from the store, older than the grace
-- period), the garbage: outputs of tasks that no longer exist, and attempts that are neither the
-- committed result, a live lease's nor a held candidate's (lost, failed, released, cancelled or
-- superseded attempts). Keys of any other shape are never garbage: what we do not recognise, we keep.
CREATE FUNCTION minion_gc_outputs(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH parsed AS (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id, m[4]::uuid AS token
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^outputs/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$') AS m
         WHERE m IS NOT NULL)
    SELECT p.k FROM parsed p
     WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = p.task_id)
        OR NOT EXISTS (
            SELECT 1 FROM subtasks s
             WHERE s.task_id = p.task_id AND s.subtask_id = p.subtask_id
               AND (s.output_key = p.k
                    OR (s.state = 'leased' AND s.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_backups b
                                WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                  AND b.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_checks c
                                WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
                                  AND c.lease_token = p.token)))
$$;
