-- Issue 8, items 2 and 5: who may read which input object, how many input bytes a team may store,
-- and which stored objects are garbage.

-- Ownership of every input object the API wrote (uploads and inline records): a task may name an
-- object as its input only if its team owns it (minion_input_use). team NULL: uploaded by an
-- unscoped token without ?team=, usable only by unscoped submitters. One object may have several
-- owners (a content-addressed upload of the same bytes by two teams), one row each.
CREATE TABLE input_objects (
    uri         text NOT NULL CHECK (length(uri) BETWEEN 1 AND 2048),
    team        minion_name,
    bytes       bigint NOT NULL CHECK (bytes >= 0),
    created_by  bigint REFERENCES api_tokens (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Last time a submission named it: the garbage collector's grace runs from here, so an upload
    -- being submitted right now is never judged unreferenced.
    used_at     timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX input_objects_owner ON input_objects (uri, coalesce(team::text, ''));
CREATE INDEX input_objects_team ON input_objects (team);
CREATE INDEX input_objects_used ON input_objects (used_at);
-- "Does any task still read this object?" for the garbage collector.
CREATE INDEX tasks_input_uri ON tasks (input_uri);

-- S3 prefixes an operator allowed a team to read (`minions team allow-input TEAM s3://bucket/p`).
-- Stored with a trailing '/', so allowing s3://b/data never allows s3://b/data-other/x.
CREATE TABLE team_input_prefixes (
    team        minion_name NOT NULL,
    prefix      text NOT NULL CHECK (prefix ~ '^s3://[a-z0-9][a-z0-9.-]{1,62}/([^/]+/)*$'
                                     AND length(prefix) <= 1024),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team, prefix)
);

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

-- Record an input object the API wrote for a team, within the team's quota of stored input bytes
-- (p_quota 0: none). 'ok', or 'quota_exceeded' (nothing recorded). Recording an object the team
-- already owns is 'ok' and changes nothing. The advisory lock serializes one team's recordings, so
-- two concurrent uploads cannot both squeeze under the quota.
CREATE FUNCTION minion_record_input(p_uri text, p_team text, p_bytes bigint, p_token bigint, p_quota bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    used bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('minion_input_quota:' || coalesce(p_team, ''), 0));
    PERFORM 1 FROM input_objects WHERE uri = p_uri AND team IS NOT DISTINCT FROM p_team;
    IF FOUND THEN
        UPDATE input_objects SET used_at = now() WHERE uri = p_uri AND team IS NOT DISTINCT FROM p_team;
        RETURN 'ok';
    END IF;
    IF p_quota > 0 THEN
        SELECT coalesce(sum(bytes), 0) INTO used FROM input_objects WHERE team IS NOT DISTINCT FROM p_team;
        IF used + p_bytes > p_quota THEN
            RETURN 'quota_exceeded';
        END IF;
    END IF;
    INSERT INTO input_objects (uri, team, bytes, created_by) VALUES (p_uri, p_team, p_bytes, p_token);
    RETURN 'ok';
END $$;

-- Input bytes a team stores (what its quota is measured against).
CREATE FUNCTION minion_team_input_bytes(p_team text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(bytes), 0)::bigint FROM input_objects WHERE team IS NOT DISTINCT FROM p_team
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

-- Step 3: of these output keys (listed from the store, older than the grace period), the garbage:
-- outputs of tasks that no longer exist, and attempts that are neither the committed result nor a
-- live lease's (lost, failed, released, cancelled or superseded attempts). Keys of any other shape
-- are never garbage: what we do not recognise, we keep.
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
                                  AND b.lease_token = p.token)))
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
