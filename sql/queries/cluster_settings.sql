-- The cluster-wide values (minion_settings, sql/schema/02_settings.sql), read and set by every process
-- the same way.

-- name: read
SELECT lease_timeout_s, max_attempts FROM minion_cluster_settings();

-- name: set
-- $1 key (lease_timeout_s or max_attempts), $2 value as text; validated by the function.
SELECT minion_set_cluster_setting($1, $2);
