-- Statements the `minions` CLI runs, by name.

-- name: insert_token
INSERT INTO api_tokens (token_hash, role, team, label) VALUES ($1, $2, $3, $4)
ON CONFLICT (token_hash) DO NOTHING
RETURNING id;
