-- Executors: registration (one machine, one row) and the view of their state.

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
