-- A user's task priority held to its team's cap in the submission's own statement.

-- The priority a task of p_team is submitted at: p_priority itself when its submitter may set it,
-- else 'priority_above_cap' raised (insufficient_privilege, the cap as its DETAIL) and nothing is
-- submitted. p_capped: the submitter is a user, held to the team's cap (an admin sets any priority).
-- Called as an argument of the submission, it reads the cap in the submission's own statement, with
-- no round trip of its own. -1000 is within every cap (the lowest one allowed); any other priority, 0
-- included, can be above one (a cap may be below 0), so each reads it: one primary-key probe.
CREATE FUNCTION minion_priority_within_cap(p_team text, p_priority integer, p_capped boolean)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_cap integer;
BEGIN
    IF p_capped AND p_priority > -1000 THEN
        v_cap := (minion_team_share(p_team)).priority_cap;
        IF p_priority > v_cap THEN
            RAISE EXCEPTION 'priority_above_cap' USING ERRCODE = 'insufficient_privilege', DETAIL = v_cap::text;
        END IF;
    END IF;
    RETURN p_priority;
END $$;
