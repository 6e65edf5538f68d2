-- A /v1 file a team uploads (purpose 'batch') is input it stores, like an upload to
-- POST /api/v1/inputs: it counts against the team's quota of stored input bytes (team_input_usage,
-- sql/240) from its upload until it is deleted. Output and error files (purpose 'batch_output') are
-- results, and do not count.

-- Counted by statement triggers, as input_objects and task_inputs are (240): one UPDATE per team a
-- statement touches, the teams in order. A file stops counting when it is deleted (deleted_at set)
-- or its row goes.
CREATE FUNCTION minion_openai_files_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO team_input_usage AS u (team, bytes)
    SELECT coalesce(a.team::text, ''), sum(a.bytes) FROM added a
     WHERE a.purpose = 'batch' AND a.deleted_at IS NULL
     GROUP BY 1 ORDER BY 1
    ON CONFLICT (team) DO UPDATE SET bytes = u.bytes + excluded.bytes;
    RETURN NULL;
END $$;

CREATE FUNCTION minion_openai_files_removed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(g.team::text, '') AS team, sum(g.bytes) AS bytes
               FROM removed g WHERE g.purpose = 'batch' AND g.deleted_at IS NULL GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

-- A live file marked deleted gives its bytes back (a deleted one never counts again).
CREATE FUNCTION minion_openai_files_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(o.team::text, '') AS team, sum(o.bytes) AS bytes
               FROM before_rows o JOIN after_rows n ON n.id = o.id
              WHERE o.purpose = 'batch' AND o.deleted_at IS NULL AND n.deleted_at IS NOT NULL
              GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

-- What a file counts is fixed once it is stored: only deleted_at may change.
CREATE FUNCTION minion_openai_file_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the team, purpose and size of file % cannot change', OLD.id USING ERRCODE = 'check_violation';
END $$;

-- Locked until the triggers exist (the migration's transaction): an API still running the old code
-- cannot add a file between the count and the trigger that would have counted it.
LOCK TABLE openai_files IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO team_input_usage AS u (team, bytes)
SELECT coalesce(team::text, ''), sum(bytes) FROM openai_files
 WHERE purpose = 'batch' AND deleted_at IS NULL GROUP BY 1 ORDER BY 1
ON CONFLICT (team) DO UPDATE SET bytes = u.bytes + excluded.bytes;

CREATE TRIGGER openai_files_added AFTER INSERT ON openai_files REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_added();
CREATE TRIGGER openai_files_removed AFTER DELETE ON openai_files REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_removed();
CREATE TRIGGER openai_files_deleted AFTER UPDATE ON openai_files
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_deleted();
CREATE TRIGGER openai_files_fixed BEFORE UPDATE ON openai_files
    FOR EACH ROW WHEN (NEW.team IS DISTINCT FROM OLD.team OR NEW.purpose IS DISTINCT FROM OLD.purpose
                       OR NEW.bytes IS DISTINCT FROM OLD.bytes OR (OLD.deleted_at IS NOT NULL
                                                                   AND NEW.deleted_at IS NULL))
    EXECUTE FUNCTION minion_openai_file_fixed();

-- 140's minion_openai_add_file with the team's quota (MINIONS_TEAM_INPUT_QUOTA_BYTES, 0: none): an
-- overload (140's own, of 7 arguments, stays). 'ok', or 'quota_exceeded' and nothing recorded. A
-- 'batch_output' file is never refused: it is a result. The lock is minion_record_input's, so an
-- upload here and one to POST /api/v1/inputs cannot both squeeze under the quota.
CREATE FUNCTION minion_openai_add_file(p_id text, p_team text, p_purpose text, p_filename text, p_bytes bigint,
                                       p_uri text, p_created_by bigint, p_quota bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_purpose = 'batch' AND p_quota > 0 THEN
        PERFORM minion_lock_team_inputs(p_team);
        IF minion_team_input_bytes(p_team) + p_bytes > p_quota THEN
            RETURN 'quota_exceeded';
        END IF;
    END IF;
    INSERT INTO openai_files (id, team, purpose, filename, bytes, uri, created_by)
    VALUES (p_id, p_team, p_purpose, p_filename, p_bytes, p_uri, p_created_by);
    RETURN 'ok';
END $$;
