-- Cluster-wide values, one home: the minion_settings table. SQL functions read them through these
-- accessors (never a parameter each caller passes in, so every process agrees by construction);
-- services read the same rows. The defaults here are the only defaults. Values are set through one
-- validating function, and every change is announced (NOTIFY minion_settings) so running services
-- re-read it without a restart.

INSERT INTO minion_settings (key, value)
VALUES ('store_signing_key', md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text)),
       ('lease_timeout_s', '120'),
       ('max_attempts', '3');

-- Any change to a cluster-wide value wakes the services that keep a copy (payload: the key).
CREATE FUNCTION minion_settings_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text := CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END;
BEGIN
    IF changed IN ('lease_timeout_s', 'max_attempts') THEN
        PERFORM pg_notify('minion_settings', changed);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER minion_settings_changed AFTER INSERT OR UPDATE OR DELETE ON minion_settings
    FOR EACH ROW EXECUTE FUNCTION minion_settings_notify();

-- Seconds without a heartbeat after which an executor's leases are lost.
CREATE FUNCTION minion_lease_timeout_s() RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value::double precision FROM minion_settings WHERE key = 'lease_timeout_s'), 120)
$$;

-- Attempts a subtask gets before it fails its task, for tasks submitted without their own.
CREATE FUNCTION minion_max_attempts() RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value::integer FROM minion_settings WHERE key = 'max_attempts'), 3)
$$;

-- Set one cluster-wide value, checked: an unknown key or a value that cannot work is refused
-- (check_violation, with a message naming the key). Returns the value stored.
CREATE FUNCTION minion_set_cluster_setting(p_key text, p_value text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    stored text;
BEGIN
    IF p_key = 'lease_timeout_s' THEN
        IF p_value !~ '^\s*[0-9]+(\.[0-9]+)?\s*$' OR p_value::double precision <= 0 THEN
            RAISE EXCEPTION 'lease_timeout_s must be a number of seconds > 0, not %', p_value
                USING ERRCODE = 'check_violation';
        END IF;
        stored := (p_value::double precision)::text;
    ELSIF p_key = 'max_attempts' THEN
        IF p_value !~ '^\s*[0-9]+\s*$' OR p_value::integer < 1 THEN
            RAISE EXCEPTION 'max_attempts must be an integer >= 1, not %', p_value
                USING ERRCODE = 'check_violation';
        END IF;
        stored := (p_value::integer)::text;
    ELSE
        RAISE EXCEPTION 'unknown cluster setting %: lease_timeout_s or max_attempts', p_key
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO minion_settings (key, value) VALUES (p_key, stored)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    RETURN stored;
END $$;

-- The cluster-wide values as one row, for services and `minions settings show`.
CREATE FUNCTION minion_cluster_settings(OUT lease_timeout_s double precision, OUT max_attempts integer)
LANGUAGE sql STABLE AS $$
    SELECT minion_lease_timeout_s(), minion_max_attempts()
$$;

-- The number p_pairs ('key=value,key=value': a setting of several, as MINIONS_SPOT_CHECK_TEAM_SHARES
-- or MINIONS_LEASE_AGE_CEILINGS) gives p_key; NULL when none.
CREATE FUNCTION minion_pair_value(p_key text, p_pairs text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT split_part(kv, '=', 2)::double precision
      FROM unnest(string_to_array(p_pairs, ',')) AS kv
     WHERE btrim(split_part(kv, '=', 1)) = p_key
     LIMIT 1
$$;
