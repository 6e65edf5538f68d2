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
