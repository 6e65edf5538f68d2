-- The migrator's own bookkeeping (minions/db/migrate.py), by name. The lock key is fixed: split
-- locks use positive task ids.

-- name: lock
SELECT pg_advisory_lock(-707101);

-- name: unlock
SELECT pg_advisory_unlock(-707101);

-- name: create_ledger
-- What was applied, with each file's checksum: an applied file that later changed is reported.
CREATE TABLE IF NOT EXISTS minion_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied
SELECT name, checksum FROM minion_migrations;

-- name: record
INSERT INTO minion_migrations (name, checksum) VALUES ($1, $2);
