-- Cluster-wide values, one home: the minion_settings table. SQL functions read them through these
-- accessors (never a parameter each caller passes in, so every process agrees by construction);
-- services read the same rows. The defaults here are the only defaults.

INSERT INTO minion_settings (key, value) VALUES ('lease_timeout_s', '120'), ('max_attempts', '3')
ON CONFLICT (key) DO NOTHING;

-- Seconds without a heartbeat after which an executor's leases are lost.
CREATE FUNCTION minion_lease_timeout_s() RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value::double precision FROM minion_settings WHERE key = 'lease_timeout_s'), 120)
$$;

-- Attempts a subtask gets before it fails its task, for tasks submitted without their own.
CREATE FUNCTION minion_max_attempts() RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value::integer FROM minion_settings WHERE key = 'max_attempts'), 3)
$$;
