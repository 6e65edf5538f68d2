-- The statement minions/db/listen.py runs on a LISTEN connection.

-- name: probe
-- Liveness of an idle LISTEN connection: one trivial statement, not a poll for work.
SELECT 1;
