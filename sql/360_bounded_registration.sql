-- Registration is bounded per executor token: how many executor names one token may hold, and how
-- many new ones it may add a minute. A token could otherwise fill `executors` (and every admin's
-- `GET /api/v1/executors`) at the API's speed. Both bounds are checked here, under a lock per token,
-- because several API processes register against one database. The API caps the size of
-- `hardware` before it gets this far (services/api/routes/executors.py).
--
-- Registering a name the token already holds (an agent restarting) is neither counted nor locked:
-- it is the same row, updated (minion_register_executor).

-- When a name was first registered (registered_at moves with every registration of it).
ALTER TABLE executors ADD COLUMN created_at timestamptz;
UPDATE executors SET created_at = registered_at;
ALTER TABLE executors ALTER COLUMN created_at SET NOT NULL, ALTER COLUMN created_at SET DEFAULT now();

-- A hardware object larger than any the API now accepts can only be one sent to fill the table;
-- its executor keeps its row and reports its hardware again when it next registers.
UPDATE executors SET hardware = '{}' WHERE octet_length(hardware::text) > 65536;

-- verdict: 'ok' (executor_id set), 'too_many_executors' (the token holds p_max_executors names
-- already), 'too_many_registrations' (it added p_per_minute names in the last minute; retry_after_s:
-- when the oldest of them leaves the window).
CREATE FUNCTION minion_register_executor_bounded(p_token_id bigint, p_team text, p_name text, p_hardware jsonb,
                                                 p_kinds text[], p_models text[], p_preferences jsonb,
                                                 p_max_executors integer, p_per_minute integer,
                                                 OUT verdict text, OUT executor_id uuid, OUT retry_after_s integer)
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
    recent integer;
    oldest timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
        -- One new name of a token at a time, so two API processes cannot both squeeze under a bound.
        PERFORM pg_advisory_xact_lock(hashtextextended('minion_register:' || p_token_id::text, 0));
        -- Read again under the lock: a registration of this very name may have committed meanwhile.
        IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
            SELECT count(*), count(*) FILTER (WHERE e.created_at > now() - interval '1 minute'),
                   min(e.created_at) FILTER (WHERE e.created_at > now() - interval '1 minute')
              INTO held, recent, oldest
              FROM executors e WHERE e.token_id = p_token_id;
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
