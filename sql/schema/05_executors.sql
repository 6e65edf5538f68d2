-- Executors: registration (one machine, one row, bounded per token), the model fingerprints they
-- serve with (and their history, so every attempt says which model it ran on), and their status.

-- What an executor is handed: 'kind:model' for each advertised kind and model, 'sleep:*' for sleep.
CREATE FUNCTION minion_capabilities(p_kinds text[], p_models text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(DISTINCT c ORDER BY c), '{}') FROM (
        SELECT minion_capability(k, m) AS c
          FROM unnest(p_kinds) AS k
         CROSS JOIN unnest(CASE WHEN cardinality(p_models) = 0 THEN ARRAY['*'] ELSE p_models END) AS m
         WHERE k = 'sleep' OR m <> '*'
    ) caps
$$;

-- Register, or register again (same token and name: the same row, updated, back online).
-- p_preferences: [{"team", "project", "task_name"}, ...] in order of preference.
CREATE FUNCTION minion_register_executor(p_token_id bigint, p_team text, p_name text, p_hardware jsonb,
                                         p_kinds text[], p_models text[], p_preferences jsonb)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    ex_id uuid;
BEGIN
    INSERT INTO executors AS e (token_id, team, name, hardware, kinds, models, capabilities, status)
    VALUES (p_token_id, p_team, p_name, p_hardware, p_kinds, p_models,
            minion_capabilities(p_kinds, p_models), 'online')
    ON CONFLICT (token_id, name) DO UPDATE
        SET team = excluded.team, hardware = excluded.hardware, kinds = excluded.kinds,
            models = excluded.models, capabilities = excluded.capabilities, status = 'online',
            registered_at = now()
    RETURNING e.id INTO ex_id;

    -- A process that registers holds no lease: any the row still holds belonged to a predecessor
    -- under the same name (a restarted agent), whose work is gone. Without this they would stay
    -- leased for good: the new process keeps the row's heartbeat fresh.
    PERFORM minion_end_executor_leases(ex_id, 'lost',
        'executor restarted (registered again) while holding this lease', true);

    DELETE FROM executor_preferences WHERE executor_id = ex_id;
    INSERT INTO executor_preferences (executor_id, position, team, project, task_name)
    SELECT ex_id, (p.ord - 1)::integer, p.value ->> 'team', p.value ->> 'project', p.value ->> 'task_name'
      FROM jsonb_array_elements(p_preferences) WITH ORDINALITY AS p(value, ord);

    PERFORM minion_beat(ex_id);
    RETURN ex_id;
END $$;

-- An executor as users see it. status: busy (holds a lease), idle (heartbeating, no lease),
-- offline (deregistered, or silent without a lease), lost (the watchdog took its work back).
CREATE FUNCTION minion_executor_status(p_status text, p_leases integer, p_beat_at timestamptz,
                                       p_lease_timeout_s double precision)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_status IN ('offline', 'lost') THEN p_status
                WHEN p_leases > 0 THEN 'busy'
                WHEN p_beat_at > now() - make_interval(secs => p_lease_timeout_s) THEN 'idle'
                ELSE 'offline' END
$$;

-- Once fixed, a task's fingerprint stays: its only writer is the claim's pin (minion_claim_pin_tasks), an UPDATE
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

-- `model` submitted as 'name@revision': the task's model is the name, its fingerprint the revision
-- (lower case, as agents report hashes), recorded as the submission's pin so it is never given back.
-- The API has checked the revision's form.
CREATE FUNCTION minion_task_model_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind <> 'sleep' AND strpos(NEW.model, '@') > 0 THEN
        NEW.fingerprint := lower(substring(NEW.model FROM '@([^@]*)$'));
        NEW.model := regexp_replace(NEW.model, '@[^@]*$', '');
        NEW.fingerprint_from_revision := true;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tasks_model_revision BEFORE INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION minion_task_model_revision();

-- Registration bounded per executor token. verdict: 'ok' (executor_id set), 'too_many_models' (its
-- executors would advertise more than 1,024 distinct models), 'too_many_executors' (the token holds
-- p_max_executors names in use already: registered in the last 7 days or heard from in the last
-- day), 'too_many_registrations' (it added p_per_minute names in the last minute; retry_after_s: when
-- the oldest of them leaves the window). Checked under a lock per token, because several API
-- processes register against one database. Registering a name the token already holds (an agent
-- restarting) is not counted against the names: it is the same row, updated.
CREATE FUNCTION minion_register_executor_bounded(p_token_id bigint, p_team text, p_name text,
                                                            p_hardware jsonb, p_kinds text[], p_models text[],
                                                            p_preferences jsonb, p_max_executors integer,
                                                            p_per_minute integer, OUT verdict text,
                                                            OUT executor_id uuid, OUT retry_after_s integer)
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
    recent integer;
    oldest timestamptz;
BEGIN
    -- The models a token's executors advertise, together: each is a row of the pool's known models
    -- and a capability every claim and /v1/models weighs, so one token may not advertise more than
    -- 1,024 distinct ones over the names it holds (10 names of 1,024 models each made
    -- /v1/models take 5.9 s). Judged under the token's lock, so concurrent registrations cannot both
    -- squeeze under it.
    PERFORM pg_advisory_xact_lock(hashtextextended('minion_register:' || p_token_id::text, 0));
    IF (SELECT count(DISTINCT m) FROM (
            SELECT unnest(e.models) AS m FROM executors e
             WHERE e.token_id = p_token_id AND e.name <> p_name AND e.status <> 'offline'
            UNION ALL SELECT unnest(p_models)) all_models) > 1024 THEN
        verdict := 'too_many_models';
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
        -- One new name of a token at a time (the lock above), so two API processes cannot both
        -- squeeze under a bound.
        -- Read again under the lock: a registration of this very name may have committed meanwhile.
        IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
            SELECT count(*) FILTER (WHERE e.registered_at > now() - interval '7 days'
                                       OR h.alive_at > now() - interval '1 day'),
                   count(*) FILTER (WHERE e.created_at > now() - interval '1 minute'),
                   min(e.created_at) FILTER (WHERE e.created_at > now() - interval '1 minute')
              INTO held, recent, oldest
              FROM executors e LEFT JOIN heartbeats h ON h.executor_id = e.id
             WHERE e.token_id = p_token_id;
            IF held >= p_max_executors THEN
                verdict := 'too_many_executors';
                RETURN;
            END IF;
            IF recent >= p_per_minute THEN
                verdict := 'too_many_registrations';
                retry_after_s := greatest(1, ceil(extract(epoch FROM oldest + interval '1 minute' - now())))::integer;
                RETURN;
            END IF;
        END IF;
    END IF;
    verdict := 'ok';
    executor_id := minion_register_executor(p_token_id, p_team, p_name, p_hardware, p_kinds, p_models,
                                            p_preferences);
END $$;

-- Registration: the executor's fingerprints replaced by those it reports now (the old ones closed in
-- the history), p_fingerprints = [{"model", "fingerprint", "precision", "backend", "proofs"}, ...]
-- (checked by the API), one row per non-sleep kind it serves. Run in the registration's transaction
-- after minion_register_executor_bounded, so leases that registration ended are recorded with the
-- fingerprints they ran with. A registration that reports what the executor already has changes
-- nothing; one that changes its fingerprints, or the proofs it makes, resets its trust. An executor
-- keeps its latest 64 history periods (registrations of a held name are not rate-limited): an
-- attempt older than all of them reads as `unknown:<executor id>`.
CREATE FUNCTION minion_set_executor_fingerprints(p_executor uuid, p_fingerprints jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();  -- after this registration ended the executor's leases
    fresh jsonb;
    held jsonb;
    oldest_kept timestamptz;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_array(x.capability, x.model, x.fingerprint, x.precision, x.backend,
                                                x.proofs)
                              ORDER BY x.capability), '[]')
      INTO fresh
      FROM (SELECT DISTINCT ON (minion_capability(k, f.value ->> 'model'))
                   minion_capability(k, f.value ->> 'model') AS capability, f.value ->> 'model' AS model,
                   lower(f.value ->> 'fingerprint') AS fingerprint, f.value ->> 'precision' AS precision,
                   f.value ->> 'backend' AS backend, (f.value ->> 'proofs')::smallint AS proofs
              FROM jsonb_array_elements(p_fingerprints) AS f(value)
              JOIN executors e ON e.id = p_executor
             CROSS JOIN unnest(e.kinds) AS k
             WHERE k <> 'sleep'
             ORDER BY minion_capability(k, f.value ->> 'model')) x;
    SELECT coalesce(jsonb_agg(jsonb_build_array(f.capability, f.model, f.fingerprint, f.precision, f.backend,
                                                f.proofs)
                              ORDER BY f.capability), '[]')
      INTO held
      FROM executor_fingerprints f WHERE f.executor_id = p_executor;
    IF fresh = held THEN
        RETURN jsonb_array_length(fresh);
    END IF;

    -- New fingerprints: trust starts again (its next results are checked until it agrees again).
    UPDATE executors SET agreements = 0, trusted = false WHERE id = p_executor;
    UPDATE executor_fingerprint_history SET valid_to = at WHERE executor_id = p_executor AND valid_to IS NULL;
    DELETE FROM executor_fingerprints WHERE executor_id = p_executor;
    INSERT INTO executor_fingerprints (executor_id, capability, model, fingerprint, precision, backend, proofs)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, (r ->> 5)::smallint
      FROM jsonb_array_elements(fresh) AS r;
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

-- Each capability an executor advertises joins the models the pool knows (known_models), once: a
-- registration that repeats what is known writes nothing. 'sleep:*' needs no model and is left out.
-- A model may hold ':' (Ollama's 'llama3:8b'); a kind never does.
CREATE FUNCTION minion_note_known_models() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO known_models (capability, kind, model)
    SELECT c, split_part(c, ':', 1), substr(c, strpos(c, ':') + 1)
      FROM unnest(NEW.capabilities) AS c
     WHERE c <> 'sleep:*' AND strpos(c, ':') > 0
       AND NOT EXISTS (SELECT 1 FROM known_models k WHERE k.capability = c)
     ORDER BY c
    ON CONFLICT (capability) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER executors_known_models AFTER INSERT OR UPDATE OF capabilities ON executors
    FOR EACH ROW EXECUTE FUNCTION minion_note_known_models();

-- Whether an executor has ever advertised kind p_kind with model p_model (a revision, 'name@rev',
-- is the model itself, as minion_capability has it).
CREATE FUNCTION minion_model_known(p_kind text, p_model text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM known_models WHERE capability = minion_capability(p_kind, p_model))
$$;
