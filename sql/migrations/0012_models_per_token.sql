-- One executor token may advertise at most 1,024 distinct models over the names it holds:
-- registration's verdict 'too_many_models'.
CREATE OR REPLACE FUNCTION minion_register_executor_bounded(p_token_id bigint, p_team text, p_name text,
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
