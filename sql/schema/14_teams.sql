-- Teams: the share of the common pool an admin gives each team. A team is a name tokens, tasks and
-- executors carry; it exists once one of them names it.

-- Whether any token, task or executor names p_team (a typo must not make a team).
CREATE FUNCTION minion_team_known(p_team text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM api_tokens WHERE team = p_team)
        OR EXISTS (SELECT 1 FROM tasks WHERE team = p_team)
        OR EXISTS (SELECT 1 FROM executors WHERE team = p_team)
        OR EXISTS (SELECT 1 FROM team_shares WHERE team = p_team)
$$;

-- A team's share as in force: its row, else the defaults.
CREATE FUNCTION minion_team_share(p_team text) RETURNS team_shares LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT s FROM team_shares s WHERE s.team = p_team),
                    ROW(p_team, 1, 0, 0, NULL)::team_shares)
$$;

-- An admin sets a team's share; a NULL argument keeps that value. No row when the team is unknown
-- (nothing changed); the bounds are the table's CHECKs (check_violation naming the constraint).
CREATE FUNCTION minion_set_team_share(p_team text, p_weight double precision, p_priority_cap integer,
                                      p_max_leases integer)
RETURNS SETOF team_shares LANGUAGE plpgsql AS $$
BEGIN
    IF NOT minion_team_known(p_team) THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO team_shares AS s (team, weight, priority_cap, max_leases)
    VALUES (p_team, coalesce(p_weight, 1), coalesce(p_priority_cap, 0), coalesce(p_max_leases, 0))
    ON CONFLICT (team) DO UPDATE
       SET weight = coalesce(p_weight, s.weight), priority_cap = coalesce(p_priority_cap, s.priority_cap),
           max_leases = coalesce(p_max_leases, s.max_leases), updated_at = now()
    RETURNING s.*;
END $$;

-- The priority a task of p_team is submitted at: p_priority itself when its submitter may set it,
-- else 'priority_above_cap' raised (insufficient_privilege, the cap as its DETAIL) and nothing is
-- submitted. p_capped: the submitter is a user, held to the team's cap (an admin sets any priority),
-- and to the teams that exist: 'unknown_team' raised (insufficient_privilege) for one nothing names
-- yet, since only an admin makes a team (a token scoped to it, a share, a task of its own): a user
-- who could make teams by naming them would take a fair share per name (1,000 made-up
-- teams took 92% of the claims). The one team the server names itself, the OpenAI lane's default
-- `openai` (services/api/openai/batches.py), is always open to users.
-- Called as an argument of the submission, it reads the cap in the submission's own statement, with
-- no round trip of its own. -1000 is within every cap (the lowest one allowed); any other priority, 0
-- included, can be above one (a cap may be below 0), so each reads it: one primary-key probe.
CREATE FUNCTION minion_priority_within_cap(p_team text, p_priority integer, p_capped boolean)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_cap integer;
BEGIN
    IF p_capped AND p_team <> 'openai' AND NOT minion_team_known(p_team) THEN
        RAISE EXCEPTION 'unknown_team' USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_capped AND p_priority > -1000 THEN
        v_cap := (minion_team_share(p_team)).priority_cap;
        IF p_priority > v_cap THEN
            RAISE EXCEPTION 'priority_above_cap' USING ERRCODE = 'insufficient_privilege', DETAIL = v_cap::text;
        END IF;
    END IF;
    RETURN p_priority;
END $$;
