-- Only an admin makes a team: a user's submission to a team nothing names yet is refused
-- with 'unknown_team' by the function that already judges a user's priority in the submission's own
-- statement. The OpenAI lane's default team `openai`, named by the server, is always open.
CREATE OR REPLACE FUNCTION minion_priority_within_cap(p_team text, p_priority integer, p_capped boolean)
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
