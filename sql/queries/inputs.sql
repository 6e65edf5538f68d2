-- Operator statements about input objects (`minions team ...`).

-- name: allow_input
SELECT minion_allow_input($1, $2);

-- name: disallow_input
SELECT minion_disallow_input($1, $2);

-- name: input_prefixes
SELECT prefix, created_at FROM team_input_prefixes WHERE team = $1 ORDER BY prefix;

-- name: team_input_bytes
SELECT minion_team_input_bytes($1);
