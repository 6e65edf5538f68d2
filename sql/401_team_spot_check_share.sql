-- A team's own spot-check share (issue 26, item 3: "per team overridable").
--
-- MINIONS_SPOT_CHECK_TEAM_SHARES ('team=share,team=share', checked by the API's settings) is set on
-- the API's sessions like the other spot-check settings (sql/400), as minions.spot_check_team_shares.
-- A trusted executor's claim then checks each lease with its task's team's share where the team has
-- one, else MINIONS_SPOT_CHECK_SHARE. Unset (the default), the claim is sql/400's: nothing read.
-- Set, a claim of a trusted executor reads its won leases' teams by token (rows it just wrote).

-- The share p_shares gives team p_team, NULL when none.
CREATE FUNCTION minion_team_spot_check_share(p_team text, p_shares text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT split_part(kv, '=', 2)::double precision
      FROM unnest(string_to_array(p_shares, ',')) AS kv
     WHERE btrim(split_part(kv, '=', 1)) = p_team
     LIMIT 1
$$;

-- (Replaces 400's, with its settings: the chosen leases as above; nothing else changes.)
CREATE OR REPLACE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
                                              p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (verdict text, capabilities text[], owner bigint, lease_token uuid, expires_at timestamptz,
               task_id bigint, subtask_id integer, attempt integer, team text, project text,
               task_name text, kind text, model text, params jsonb, input_uri text, byte_start bigint,
               byte_end bigint, records integer, output_key text, backup boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    wanted integer := greatest(p_max, 1);
    won uuid[] := '{}';  -- the leases won, in claim order
    backup_tok uuid;
    replica_tok uuid;
    checked uuid[];
    share double precision;
    team_shares text;
    starting bigint;
    ex executors%ROWTYPE;
    pref record;
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := minion_executor_refusal(ex, p_token_id);
    IF verdict IS NULL AND ex.status = 'offline' THEN
        verdict := 'deregistered';
    END IF;
    IF verdict IS NULL AND ex.quarantined_at IS NOT NULL THEN
        verdict := 'quarantined';
    END IF;
    IF verdict IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    replica_tok := minion_claim_replica(p_executor, ex.token_id, ex.capabilities, ex.team);
    IF replica_tok IS NOT NULL THEN
        wanted := wanted - 1;
    END IF;
    FOR pref IN (SELECT p.position, p.team, p.project, p.task_name FROM executor_preferences p
                  WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                 ORDER BY 1 LOOP
        EXIT WHEN cardinality(won) >= wanted;
        won := won || minion_claim_some_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name,
                                           wanted - cardinality(won), cardinality(won));
    END LOOP;
    IF cardinality(won) = 0 AND replica_tok IS NULL AND p_backup_factor > 0 THEN
        backup_tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
    END IF;
    IF cardinality(won) = 0 AND backup_tok IS NULL AND replica_tok IS NULL THEN
        verdict := 'empty';
        capabilities := ex.capabilities;
        RETURN NEXT;
        RETURN;
    END IF;

    IF cardinality(won) > 0 THEN
        share := CASE WHEN ex.trusted OR minion_trust_setting('trust_agreements', 0) <= 0
                      THEN minion_trust_setting('spot_check_share', 0) ELSE 1 END;
        -- Teams with a share of their own (a trusted executor's leases only: an untrusted one's are all
        -- checked): the leases' teams read by token, only when any team has one.
        team_shares := CASE WHEN share < 1 THEN nullif(current_setting('minions.spot_check_team_shares', true), '') END;
        IF team_shares IS NOT NULL THEN
            checked := ARRAY(SELECT s.lease_token FROM subtasks s
                              WHERE s.lease_token = ANY (won)
                                AND random() < coalesce(minion_team_spot_check_share(s.team, team_shares), share));
        ELSIF share > 0 THEN
            checked := ARRAY(SELECT w FROM unnest(won) AS w WHERE share >= 1 OR random() < share);
        END IF;
        IF cardinality(checked) > 0 THEN
            -- Checked only where another executor could run the replica (else the result would wait
            -- for one for ever): one online, not quarantined, serving one of these capabilities.
            IF EXISTS (SELECT 1 FROM executors o
                        WHERE o.id <> p_executor AND o.status = 'online' AND o.quarantined_at IS NULL
                          AND o.capabilities && ex.capabilities
                          AND (ex.team IS NULL OR o.team IS NULL OR o.team = ex.team)) THEN
                UPDATE subtasks s SET check_wanted = true WHERE s.lease_token = ANY (checked);
            END IF;
        END IF;
    END IF;

    FOR starting IN SELECT DISTINCT t.id FROM subtasks s JOIN tasks t ON t.id = s.task_id
                     WHERE s.lease_token = ANY (won) AND t.status IN ('splitting', 'queued')
                     ORDER BY 1 LOOP
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = starting AND status IN ('splitting', 'queued');
    END LOOP;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    IF backup_tok IS NOT NULL OR replica_tok IS NOT NULL THEN
        RETURN QUERY
        SELECT 'leased', ex.capabilities, ex.token_id, b.lease_token,
               now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
               s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
               s.byte_start, s.byte_end, s.records,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, b.lease_token), true
          FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
          JOIN tasks t ON t.id = s.task_id
         WHERE b.lease_token = coalesce(replica_tok, backup_tok);
    END IF;
    RETURN QUERY
    SELECT 'leased', ex.capabilities, ex.token_id, s.lease_token,
           now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
           s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
           s.byte_start, s.byte_end, s.records,
           minion_output_key(s.task_id, s.subtask_id, s.attempts, s.lease_token), false
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = ANY (won)
     ORDER BY array_position(won, s.lease_token);
END $$;
