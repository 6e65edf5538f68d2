-- Model identity pinned per task: a task's results all come from one loaded model (invariant 7).
--
-- An agent reports, per model it serves, a fingerprint of what it loaded: the Hugging Face commit
-- of the snapshot it read, else a SHA-256 over the model folder's files, or Ollama's digest; with
-- the precision it runs the model in and its backend (docs/API.md, register). They are kept here per
-- executor and capability, replaced at each registration.
--
-- A task's fingerprint is fixed once and never changes: at submission when `model` names a revision
-- (`name@revision`, split by the trigger below), else by its first lease (sql/391's claim). From
-- then on only executors whose fingerprint for the task's capability is the same claim its subtasks.
-- An executor that reported none for a model (an agent from before fingerprints, or a model it had
-- not loaded when it registered) counts as its own fingerprint, 'unknown:<executor id>': it may start
-- a task no one has pinned yet, and then it alone serves that task. Sleep tasks have no model and
-- are never pinned.
--
-- Each attempt's fingerprint and precision are those its executor had registered when it claimed:
-- every registration's fingerprints are kept (executor_fingerprint_history, from when to when they
-- held), and an attempt reads the ones in force at its start (minion_attempt_model). Nothing is
-- written at claim or complete for it: a trigger filling two columns of subtask_attempts cost each
-- complete 0.05-0.1 ms (0.45 -> 0.5 ms a complete of one, alternating). The history is exact: a
-- registration ends the executor's leases before it closes its fingerprints (at clock_timestamp(),
-- after those leases' claims committed), and a claim leases only when the executor's fingerprint is
-- the task's.

CREATE TABLE executor_fingerprints (
    executor_id  uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    capability   text NOT NULL,   -- 'kind:model', as in executors.capabilities
    model        text NOT NULL,
    fingerprint  text NOT NULL CHECK (length(fingerprint) BETWEEN 1 AND 160),
    precision    text,
    backend      text,
    PRIMARY KEY (executor_id, capability)
);

-- Every registration's, from valid_from until the next registration (valid_to; NULL: in force).
CREATE TABLE executor_fingerprint_history (
    executor_id  uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    capability   text NOT NULL,
    model        text NOT NULL,
    fingerprint  text NOT NULL,
    precision    text,
    backend      text,
    valid_from   timestamptz NOT NULL,
    valid_to     timestamptz,
    PRIMARY KEY (executor_id, capability, valid_from)
);
CREATE INDEX executor_fingerprint_history_open ON executor_fingerprint_history (executor_id) WHERE valid_to IS NULL;

ALTER TABLE tasks ADD COLUMN fingerprint text CHECK (length(fingerprint) BETWEEN 1 AND 160);

-- A model named with a revision is claimed as the model itself: 'kind:name@revision' is
-- 'kind:name' (the revision pins the task's fingerprint instead). Same value as before for every
-- name without '@'.
CREATE OR REPLACE FUNCTION minion_capability(p_kind text, p_model text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_kind = 'sleep' THEN 'sleep:*'
                WHEN strpos(p_model, '@') = 0 THEN p_kind || ':' || p_model
                ELSE p_kind || ':' || regexp_replace(p_model, '@[^@]*$', '') END
$$;

-- `model` submitted as 'name@revision': the task's model is the name, its fingerprint the revision
-- (lower case, as agents report hashes). The API has checked the revision's form.
CREATE FUNCTION minion_task_model_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind <> 'sleep' AND strpos(NEW.model, '@') > 0 THEN
        NEW.fingerprint := lower(substring(NEW.model FROM '@([^@]*)$'));
        NEW.model := regexp_replace(NEW.model, '@[^@]*$', '');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tasks_model_revision BEFORE INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION minion_task_model_revision();

-- Once fixed, a task's fingerprint stays: its only writer is the claim's pin (sql/391), an UPDATE
-- conditional on the task having none. (Not a BEFORE UPDATE trigger: that would fetch the task row
-- once more in every update of a task, the claim's and the complete's included.)

-- The fingerprint an executor claims a capability with: what it reported, else its own
-- 'unknown:<id>'; NULL for sleep (nothing to pin).
CREATE FUNCTION minion_executor_fingerprint(p_executor uuid, p_cap text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_cap = 'sleep:*' THEN NULL
                ELSE coalesce((SELECT f.fingerprint FROM executor_fingerprints f
                                WHERE f.executor_id = p_executor AND f.capability = p_cap),
                              'unknown:' || p_executor::text) END
$$;

-- Registration: the executor's fingerprints replaced by those it reports now (the old ones closed in
-- the history),
-- p_fingerprints = [{"model", "fingerprint", "precision", "backend"}, ...] (checked by the API), one
-- row per non-sleep kind it serves. Run in the registration's transaction after
-- minion_register_executor_bounded, so leases that registration ended are recorded with the
-- fingerprints they ran with.
CREATE FUNCTION minion_set_executor_fingerprints(p_executor uuid, p_fingerprints jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    at timestamptz := clock_timestamp();  -- after this registration ended the executor's leases
BEGIN
    UPDATE executor_fingerprint_history SET valid_to = at WHERE executor_id = p_executor AND valid_to IS NULL;
    DELETE FROM executor_fingerprints WHERE executor_id = p_executor;
    INSERT INTO executor_fingerprints (executor_id, capability, model, fingerprint, precision, backend)
    SELECT DISTINCT ON (minion_capability(k, f.value ->> 'model'))
           p_executor, minion_capability(k, f.value ->> 'model'), f.value ->> 'model',
           lower(f.value ->> 'fingerprint'), f.value ->> 'precision', f.value ->> 'backend'
      FROM jsonb_array_elements(p_fingerprints) AS f(value)
      JOIN executors e ON e.id = p_executor
     CROSS JOIN unnest(e.kinds) AS k
     WHERE k <> 'sleep'
     ORDER BY minion_capability(k, f.value ->> 'model');
    GET DIAGNOSTICS n = ROW_COUNT;
    INSERT INTO executor_fingerprint_history (executor_id, capability, model, fingerprint, precision, backend,
                                              valid_from)
    SELECT f.executor_id, f.capability, f.model, f.fingerprint, f.precision, f.backend, at
      FROM executor_fingerprints f WHERE f.executor_id = p_executor;
    RETURN n;
END $$;

-- The fingerprint and precision of the model an attempt of capability p_cap, started at p_at on
-- p_executor, ran on: what the executor had registered then; 'unknown:<executor id>' (precision
-- NULL) where it had reported none; NULL for sleep.
CREATE FUNCTION minion_attempt_model(p_executor uuid, p_cap text, p_at timestamptz,
                                     OUT fingerprint text, OUT "precision" text)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_cap = 'sleep:*' OR p_executor IS NULL THEN NULL
                ELSE coalesce(h.fingerprint, 'unknown:' || p_executor::text) END,
           h.precision
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (
            SELECT x.fingerprint, x.precision FROM executor_fingerprint_history x
             WHERE x.executor_id = p_executor AND x.capability = p_cap AND x.valid_from <= p_at
               AND (x.valid_to IS NULL OR x.valid_to > p_at) AND p_cap <> 'sleep:*'
             ORDER BY x.valid_from DESC LIMIT 1) h ON true
$$;
