-- Small inputs kept in the database (issue 11: submit -> first lease).
--
-- The inline records of every submission were written to an input object first (recorded in
-- input_objects, then a file, an fsync and a rename on the local store, a PUT on S3), then the task
-- committed: three durable writes before a small task could be claimed, and every claim of it read
-- the object again (a GET on S3) to send its range inline. Inline records of at most
-- MINIONS_INPUT_IN_DATABASE_BYTES that are split at submission are now committed with the task
-- instead, in minion_submit_task's own transaction, and each claim takes its range from here in the
-- claim's own statement. Larger inputs, inputs given by URI, and tasks the splitter splits keep
-- their input objects, as before.
--
-- What the schema holds to: a task's input lives in one place: an object (tasks.input_uri) or its
-- task_inputs row, never both and never neither; kept bytes never change, and go with their task.

ALTER TABLE tasks ALTER COLUMN input_uri DROP NOT NULL;

CREATE TABLE task_inputs (
    task_id  bigint PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    team     minion_name NOT NULL,  -- the task's, for the team's quota when the task goes
    -- At most 1 MiB: the setting's bound (minions/config.py), so no claim answer carries more.
    data     bytea NOT NULL CHECK (length(data) BETWEEN 1 AND 1048576),
    bytes    bigint GENERATED ALWAYS AS (length(data)) STORED  -- as input_objects.bytes
);

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

-- Input bytes each team stores, what its quota is measured against: its input objects and the
-- inputs kept with its tasks, kept up to date by the triggers below. 080 summed the team's
-- input_objects at every recording; a team's kept inputs are one per small task, so that sum would
-- grow with every task it ever kept. team '': unscoped uploads (input_objects.team NULL).
CREATE TABLE team_input_usage (
    team   text PRIMARY KEY,
    bytes  bigint NOT NULL CHECK (bytes >= 0)
);
-- Locked until the triggers exist (the migration's transaction): an API still running the old code
-- cannot record an object between the count and the trigger that would have counted it.
LOCK TABLE input_objects IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO team_input_usage (team, bytes)
SELECT coalesce(team::text, ''), sum(bytes) FROM input_objects GROUP BY 1;

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
CREATE TRIGGER input_objects_added AFTER INSERT ON input_objects REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_added();
CREATE TRIGGER input_objects_removed AFTER DELETE ON input_objects REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_removed();
CREATE TRIGGER task_inputs_added AFTER INSERT ON task_inputs REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_added();
CREATE TRIGGER task_inputs_removed AFTER DELETE ON task_inputs REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_removed();
-- (input_objects.bytes never changes after its insert: only used_at does.)
CREATE FUNCTION minion_input_bytes_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the recorded size of input % cannot change', OLD.uri USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER input_objects_bytes_fixed BEFORE UPDATE OF bytes ON input_objects
    FOR EACH ROW WHEN (NEW.bytes IS DISTINCT FROM OLD.bytes) EXECUTE FUNCTION minion_input_bytes_fixed();

-- (Replaces 080's: read from the counts, not summed.)
CREATE OR REPLACE FUNCTION minion_team_input_bytes(p_team text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT u.bytes FROM team_input_usage u WHERE u.team = coalesce(p_team, '')), 0)
$$;

-- Serializes one team's input recordings (objects and kept inputs), so that two concurrent ones
-- cannot both squeeze under the quota.
CREATE FUNCTION minion_lock_team_inputs(p_team text) RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('minion_input_quota:' || coalesce(p_team, ''), 0))
$$;

-- (Replaces 080's: the quota counts kept inputs too, read from the counts. Same arguments and
-- verdicts.)
CREATE OR REPLACE FUNCTION minion_record_input(p_uri text, p_team text, p_bytes bigint, p_token bigint,
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

-- 181's minion_submit_task, with two arguments more (an overload: 181's own, of 16 arguments,
-- stays as it was). p_input_data: the inline records themselves when they are kept here;
-- p_input_uri is then NULL, and the task must be split now: p_input_data's ranges are given, and
-- they end where its bytes do. The splitter never reads a kept input. p_input_quota: the team's
-- quota of stored input bytes (MINIONS_TEAM_INPUT_QUOTA_BYTES, 0: none), which kept inputs count
-- against like objects: a kept input past it raises 'quota_exceeded' (SQLSTATE 53400), and nothing
-- is committed.
CREATE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
    p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer, p_input_uri text,
    p_request_hash text, p_created_by bigint, p_byte_starts bigint[], p_byte_ends bigint[],
    p_first_records bigint[], p_records integer[], p_input_data bytea, p_input_quota bigint DEFAULT 0)
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
BEGIN
    IF p_input_data IS NOT NULL AND NOT coalesce(p_input_uri IS NULL AND cardinality(p_byte_ends) > 0
                                                 AND p_byte_ends[cardinality(p_byte_ends)] = length(p_input_data),
                                                 false) THEN
        RAISE EXCEPTION 'a kept input needs no input_uri and the subtasks of all its bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO t FROM minion_submit_task(p_team, p_project, p_name, p_kind, p_model, p_params, p_priority,
                                            p_subtask_size, p_max_attempts, p_input_uri, p_request_hash,
                                            p_created_by, p_byte_starts, p_byte_ends, p_first_records, p_records);
    IF NOT FOUND THEN
        RETURN;  -- the name is taken: answered as a re-submission, quota or not
    END IF;
    IF p_input_data IS NOT NULL THEN
        -- Last, so the team's count is held locked for as little as can be.
        IF p_input_quota > 0 THEN
            PERFORM minion_lock_team_inputs(p_team);
            IF minion_team_input_bytes(p_team) + length(p_input_data) > p_input_quota THEN
                RAISE EXCEPTION 'quota_exceeded' USING ERRCODE = 'configuration_limit_exceeded';
            END IF;
        END IF;
        INSERT INTO task_inputs (task_id, team, data) VALUES (t.id, p_team, p_input_data);
    END IF;
    RETURN NEXT t;
END $$;
