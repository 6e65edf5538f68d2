-- The fingerprint history stays bounded, whatever an executor token sends.
--
-- Registering a name the token already holds is not rate-limited (sql/360: an agent restarting), so
-- sql/390's minion_set_executor_fingerprints, which added a history period at every registration,
-- let one token grow executor_fingerprint_history by up to 2,048 rows a request (1,024 models, two
-- kinds). Now a registration that reports what the executor already has changes nothing, and an
-- executor keeps its latest 64 periods: an attempt older than all of them (an executor whose
-- fingerprints changed 64 times since) reads as `unknown:<executor id>`.

CREATE OR REPLACE FUNCTION minion_set_executor_fingerprints(p_executor uuid, p_fingerprints jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();  -- after this registration ended the executor's leases
    fresh jsonb;
    held jsonb;
    oldest_kept timestamptz;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_array(x.capability, x.model, x.fingerprint, x.precision, x.backend)
                              ORDER BY x.capability), '[]')
      INTO fresh
      FROM (SELECT DISTINCT ON (minion_capability(k, f.value ->> 'model'))
                   minion_capability(k, f.value ->> 'model') AS capability, f.value ->> 'model' AS model,
                   lower(f.value ->> 'fingerprint') AS fingerprint, f.value ->> 'precision' AS precision,
                   f.value ->> 'backend' AS backend
              FROM jsonb_array_elements(p_fingerprints) AS f(value)
              JOIN executors e ON e.id = p_executor
             CROSS JOIN unnest(e.kinds) AS k
             WHERE k <> 'sleep'
             ORDER BY minion_capability(k, f.value ->> 'model')) x;
    SELECT coalesce(jsonb_agg(jsonb_build_array(f.capability, f.model, f.fingerprint, f.precision, f.backend)
                              ORDER BY f.capability), '[]')
      INTO held
      FROM executor_fingerprints f WHERE f.executor_id = p_executor;
    IF fresh = held THEN
        RETURN jsonb_array_length(fresh);
    END IF;

    UPDATE executor_fingerprint_history SET valid_to = at WHERE executor_id = p_executor AND valid_to IS NULL;
    DELETE FROM executor_fingerprints WHERE executor_id = p_executor;
    INSERT INTO executor_fingerprints (executor_id, capability, model, fingerprint, precision, backend)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4 FROM jsonb_array_elements(fresh) AS r;
    INSERT INTO executor_fingerprint_history (executor_id, capability, model, fingerprint, precision, backend,
                                              valid_from)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, at FROM jsonb_array_elements(fresh) AS r;

    SELECT p.valid_from INTO oldest_kept
      FROM (SELECT DISTINCT h.valid_from FROM executor_fingerprint_history h
             WHERE h.executor_id = p_executor ORDER BY h.valid_from DESC OFFSET 63 LIMIT 1) p;
    IF oldest_kept IS NOT NULL THEN
        DELETE FROM executor_fingerprint_history h WHERE h.executor_id = p_executor AND h.valid_from < oldest_kept;
    END IF;
    RETURN jsonb_array_length(fresh);
END $$;
