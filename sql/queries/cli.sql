-- Statements the `minions` CLI runs, by name.

-- name: insert_token
-- $1 hash, $2 prefix, $3 role, $4 team, $5 label, $6 seconds until it expires (NULL: never), $7 owner
-- (NULL: the token's own), $8 trusted
SELECT minion_create_token($1, $2, $3, $4, $5, $6, $7, $8);

-- name: list_tokens
-- $1 status filter (NULL: all). Never the hash: a listing shows the prefix and id only.
SELECT * FROM minion_tokens WHERE $1::text IS NULL OR status = $1 ORDER BY id;

-- name: revoke_token
SELECT minion_revoke_token($1);

