-- Replicated spot checks and earned trust.
--
-- One way to run a subtask twice is the straggler backup (leases.sql). A lease chosen for a check (at
-- claim: every lease of an executor not trusted yet, and a random share of the others) commits
-- nothing when it completes: its verified result is held as a candidate (subtask_checks) and the
-- subtask moves to 'checking' (open: its task cannot end). A replica of a checking subtask is a
-- backup row taken by another executor (one that produced none of its candidates; another API token
-- wherever one could run it) of the task's fingerprint; to the executor it is a lease like any
-- (`backup` false: nothing tells an embedding executor that it is checking another's work; a
-- completion replica is sent the held results, `check`, to verify their proofs of generation
-- with a prefill pass instead of generating, answering a result whose proof holds as it is, so
-- that the two agree). A lost or released replica deletes its row, which re-offers the subtask. The
-- API compares the replica's verified output with the candidates (services/api/leasing/spot_check.py:
-- embeddings by cosine per record, greedy completions by text similarity, sleep by ids) and hands
-- its verdict to minion_check_vote:
--   agrees with a candidate  -> that candidate commits (the subtask is done, as any complete);
--   disagrees with the one   -> it is held as a second candidate; a third executor runs it;
--   disagrees with both      -> no quorum: both dropped, the subtask runs again from the queue
--                               (failed for good once out of attempts), nobody blamed.
-- Trusted machines and volunteers. An executor token is a volunteer's unless an admin
-- vouched for it (api_tokens.trusted: `minions token create --trusted`; `minions up`'s local agents),
-- and every token has an owner (the person or organisation it was issued to; itself by default).
-- Quorums count owners, not tokens or names: a replica is never of a candidate's owner, so one owner's
-- machines (a token's many names, or several tokens issued to one owner) cannot check each other or
-- outvote another. A vouched executor's leases are never chosen for a check (its results commit at
-- once, so volunteers' votes can never reach it), and it is the trusted voice: the replica of a
-- volunteer's held result goes to a vouched executor wherever one could run it (another volunteer
-- only when none could), and a vouched replica's result settles the check (agreeing, the candidate
-- commits; disagreeing, its own result commits and the candidates are outvoted). Volunteers earn
-- trust only by agreeing with a trusted executor (vouched, or one that earned trust so): two
-- strangers agreeing with each other earn nothing.
--
-- Trust: each executor counts agreements and disagreements; `trusted` once it has agreed
-- minions.trust_agreements times with model fingerprints reported (reset when they change). The
-- losing side of a 2-to-1 quorum gains a disagreement, and at minions.quarantine_after it is
-- quarantined: flagged in the vote's transaction (its claims are refused from then on), its leases,
-- candidates and results in open tasks dealt with by minion_settle_quarantines, in a transaction of
-- its own (the API calls it after each vote, the watchdog's sweep too), so a vote locks one subtask
-- and its voters' rows, in id order, and nothing else.
--
-- What is never checked: a sampled completion (temperature not 0: two honest runs differ) without
-- proofs of generation (an Ollama backend's). Everything else chosen is held until checked, even when
-- no other executor could replicate it now: a lone volunteer commits nothing (it once committed its
-- random vectors `unchecked` whenever no replica could run). A check that cannot finish (its replicas
-- keep failing, or every executor that could run one left) is looked at after
-- minions.spot_check_wait_s (minion_settle_stale_checks, the watchdog's sweep): a volunteer's lone
-- candidate stays held, marked overdue (its task's `held_for_check` warning), until an executor of
-- another owner can run its replica (a vouched one settles it alone); a dispute runs again from the
-- queue.
--
-- The settings are session settings (custom GUCs) the API and the watchdog set on their connections
-- from MINIONS_SPOT_CHECK_SHARE, MINIONS_SPOT_CHECK_TEAM_SHARES, MINIONS_TRUST_AGREEMENTS and
-- MINIONS_QUARANTINE_AFTER (defaults 0.02, none, 5, 2): reading one costs no table access, so a claim
-- of a trusted executor pays nothing for them. A session that sets none (psql, a SQL test) checks
-- nothing: share 0, trust 0.
--
-- Cost on the hot path: a complete compares s.check_token with the token of the row it already
-- locks; a claim marks its chosen leases with one UPDATE only when the share chose some, and probes
-- the partial index of checking subtasks (empty while nothing is checked) once.

-- A trust setting: the session's minions.<name>, else the default.
CREATE FUNCTION minion_trust_setting(p_name text, p_default double precision) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('minions.' || p_name, true), '')::double precision, p_default)
$$;

-- Whether two honest runs of a task's subtask give results a check can compare: not a sampled
-- completion (a temperature other than 0 given, or none: the agents' default samples).
CREATE FUNCTION minion_checkable(p_kind text, p_params jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_kind <> 'completion'
        OR CASE WHEN jsonb_typeof(p_params -> 'temperature') = 'number'
                THEN (p_params ->> 'temperature')::numeric = 0 ELSE false END
$$;

-- Whether p_executor's results of capability p_cap carry proofs of generation that another executor
-- of the same fingerprint verifies with a prefill pass (it registered `proofs`: the agent's
-- transformers completion backend, agents/macos/runners/completion_proof.py): then even a sampled
-- completion can be checked. Ollama exposes no hidden states: its sampled completions cannot be.
CREATE FUNCTION minion_executor_proves(p_executor uuid, p_cap text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT p_cap LIKE 'completion:%'
       AND EXISTS (SELECT 1 FROM executor_fingerprints f
                    WHERE f.executor_id = p_executor AND f.capability = p_cap AND f.proofs IS NOT NULL)
$$;

-- Whether an executor may be trusted: agreed often enough, and (serving a model) reported what it loaded.
CREATE FUNCTION minion_executor_earns_trust(p_executor uuid, p_agreements integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_agreements >= minion_trust_setting('trust_agreements', 0)
       AND (EXISTS (SELECT 1 FROM executor_fingerprints f WHERE f.executor_id = p_executor)
            OR NOT EXISTS (SELECT 1 FROM executors e, unnest(e.kinds) k WHERE e.id = p_executor AND k <> 'sleep'))
$$;

-- The owner executor p_executor counts as (its token's: minion_token_owner).
CREATE FUNCTION minion_executor_owner(p_executor uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT minion_token_owner(e.token_id) FROM executors e WHERE e.id = p_executor
$$;

-- Whether an admin vouched for executor p_executor's token (a trusted machine, not a volunteer's).
CREATE FUNCTION minion_executor_vouched(p_executor uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT t.trusted FROM executors e JOIN api_tokens t ON t.id = e.token_id
                      WHERE e.id = p_executor), false)
$$;

-- Whether p_executor's word counts toward another's trust: vouched for, or trusted by agreeing so.
CREATE FUNCTION minion_executor_trusted(p_executor uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT minion_executor_vouched(p_executor)
        OR coalesce((SELECT e.trusted FROM executors e WHERE e.id = p_executor), false)
$$;

-- The executors a replica of a subtask (capability p_cap, team p_team, task fingerprint p_fp) could
-- go to, other than p_not and every executor of their owners: the executors whose claim
-- minion_claim_replica would serve it. Online and heard from within the lease timeout, not
-- quarantined, serving p_cap, of p_team's scope, of the task's fingerprint when it has one.
-- vouched: an admin vouched for its token.
CREATE FUNCTION minion_replica_executors(p_cap text, p_team text, p_fp text, p_not uuid[])
RETURNS TABLE (id uuid, token_id bigint, vouched boolean) LANGUAGE sql STABLE AS $$
    SELECT e.id, e.token_id, t.trusted FROM executors e JOIN heartbeats h ON h.executor_id = e.id
      JOIN api_tokens t ON t.id = e.token_id
     WHERE e.status = 'online' AND e.quarantined_at IS NULL AND p_cap = ANY (e.capabilities)
       AND NOT (e.id = ANY (p_not))
       AND coalesce(t.owner, 'token:' || t.id) <> ALL (ARRAY(SELECT minion_executor_owner(x) FROM unnest(p_not) x))
       AND (e.team IS NULL OR e.team = p_team)
       AND h.alive_at > now() - make_interval(secs => minion_lease_timeout_s())
       AND (p_fp IS NULL OR p_cap = 'sleep:*' OR minion_executor_fingerprint(e.id, p_cap) = p_fp)
$$;

-- Whether executor p_executor may run the replica of checking subtask (p_task_id, p_subtask_id): it
-- is of none of its candidates' owners (one owner's machines never check each other, however many
-- names or tokens it has), and it is vouched for or no vouched executor could run it now (strangers
-- check strangers only where no trusted voice can).
CREATE FUNCTION minion_replica_allowed(p_executor uuid, p_token_id bigint, p_task_id bigint, p_subtask_id integer,
                                       p_cap text, p_team text, p_fp text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH held AS (SELECT c.executor_id FROM subtask_checks c
                   WHERE c.task_id = p_task_id AND c.subtask_id = p_subtask_id)
    SELECT minion_token_owner(p_token_id) <> ALL (ARRAY(SELECT minion_executor_owner(executor_id) FROM held))
       AND (minion_executor_vouched(p_executor)
            OR NOT EXISTS (SELECT 1 FROM minion_replica_executors(p_cap, p_team, p_fp,
                                                                   ARRAY(SELECT executor_id FROM held)) o
                            WHERE o.vouched))
$$;

-- Whether the task's pinned vector length admits p_dimension, without fixing it (a held result
-- fixes nothing: only a committed one does).
CREATE FUNCTION minion_dimension_fits(p_task_id bigint, p_dimension integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_dimension IS NULL OR coalesce((SELECT t.embedding_dimension = p_dimension FROM tasks t
                                             WHERE t.id = p_task_id), true)
$$;

-- A replica for p_executor: a checking subtask of its capabilities (its team's, if it has one) with
-- no replica running, that it may replicate (minion_replica_allowed), of its fingerprint (or of a
-- task not pinned: one run so far by executors that report none). Returns the replica's
-- token (a backup row), or NULL. A replica pins nothing.
CREATE FUNCTION minion_claim_replica(p_executor uuid, p_token_id bigint, p_caps text[], p_team text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    -- Nothing held for a check (the usual case): one probe of an empty table, whatever plan the
    -- queue's statistics gave the search below (one made while nothing was in flight reads every
    -- lease through the in-flight index).
    IF NOT EXISTS (SELECT 1 FROM subtask_checks) THEN
        RETURN NULL;
    END IF;
    -- The first 64 checking subtasks in claim order are looked at, no more: a backlog of checks (an
    -- untrusted executor's held results, replicas running) costs a claim a bounded scan, and the
    -- subtasks further back come forward as those ahead resolve.
    FOR cand IN
        SELECT h.task_id, h.subtask_id
          FROM (SELECT s.task_id, s.subtask_id, s.capability, s.team, s.priority FROM subtasks s
                 WHERE s.state = 'checking' AND s.capability = ANY (p_caps) AND (p_team IS NULL OR s.team = p_team)
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id
                 LIMIT 64) h
          JOIN tasks t ON t.id = h.task_id
         WHERE NOT EXISTS (SELECT 1 FROM subtask_backups b WHERE b.task_id = h.task_id AND b.subtask_id = h.subtask_id)
           AND (h.capability = 'sleep:*' OR t.fingerprint IS NULL
                OR t.fingerprint = minion_executor_fingerprint(p_executor, h.capability))
           AND (t.placement = 'any' OR minion_executor_vouched(p_executor))
           AND minion_replica_allowed(p_executor, p_token_id, h.task_id, h.subtask_id, h.capability, h.team::text,
                                      t.fingerprint)
         ORDER BY h.priority DESC, h.task_id, h.subtask_id
         LIMIT 4
    LOOP
        tok := minion_take_second_run(cand.task_id, cand.subtask_id, 'checking', p_executor);
        IF tok IS NOT NULL THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- Whether backup p_token of subtask s is of an executor not trusted yet (neither vouched for nor
-- trusted by agreeing): its first results are all checked, whichever way it got the lease, and held
-- until a replica can run.
CREATE FUNCTION minion_untrusted_backup(s subtasks, p_token uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT minion_trust_setting('trust_agreements', 0) > 0
       AND EXISTS (SELECT 1 FROM subtask_backups k
                    WHERE k.lease_token = p_token AND k.task_id = s.task_id AND k.subtask_id = s.subtask_id
                      AND NOT minion_executor_trusted(k.executor_id))
$$;

-- Commits candidate w of checking subtask s (locked by the caller): the subtask done with w's
-- result, as if w's lease had completed unchecked; the attempt's outcome is p_outcome ('done' when
-- agreed, 'unchecked' when no check could finish). False, with nothing changed, when w's vectors
-- no longer fit the task's length (another result fixed another one meanwhile).
CREATE FUNCTION minion_commit_candidate(s subtasks, w subtask_checks, p_outcome text, p_note text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF w.dimension IS NOT NULL AND NOT minion_pin_dimension(s.task_id, w.dimension) THEN
        RETURN false;
    END IF;
    DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = w.round;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = w.lease_token,
           output_key = w.output_key, result_key = w.result_key, result_sha256 = w.result_sha256,
           result_bytes = w.result_bytes, result_data = w.result_data, check_token = NULL
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    UPDATE subtask_attempts SET outcome = p_outcome, ended_at = now(), error = p_note
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = w.lease_token
       AND outcome = 'candidate';
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN true;
END $$;

-- Checking subtask s (locked by the caller) runs again from the queue, its candidates dropped as
-- outvoted with p_error (or fails for good once out of attempts). Nobody is blamed.
CREATE FUNCTION minion_recheck_subtask(s subtasks, p_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE subtask_attempts a SET outcome = 'outvoted', error = p_error
      FROM subtask_checks c
     WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
       AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id AND a.lease_token = c.lease_token
       AND a.outcome = 'candidate';
    DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    IF s.attempts < (SELECT max_attempts FROM tasks WHERE id = s.task_id) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, lease_executor = NULL, leased_at = NULL, check_token = NULL,
               last_error = 'spot check: ' || p_error
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    ELSE
        UPDATE subtasks
           SET state = 'failed', done_at = now(), check_token = NULL, last_error = 'spot check: ' || p_error
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_subtask_closed(s.task_id, true,
            format('subtask %s failed: %s (spot check)', s.subtask_id, p_error));
    END IF;
END $$;

-- The voters of a quorum gain (p_agreed) or lose (p_outvoted) trust, their rows locked in id order
-- (two votes at once take them in one order, never a deadlock). One outvoted minions.quarantine_after
-- times is quarantined here (flagged: its claims are refused from now on; the rest of its quarantine
-- is minion_settle_quarantines, in a transaction of its own).
CREATE FUNCTION minion_executors_voted(p_agreed uuid[], p_outvoted uuid[], p_task_id bigint, p_subtask_id integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e executors%ROWTYPE;
BEGIN
    PERFORM 1 FROM executors WHERE id = ANY (p_agreed || p_outvoted) ORDER BY id FOR UPDATE;
    FOR e IN UPDATE executors SET agreements = agreements + 1
              WHERE id = ANY (p_agreed) AND quarantined_at IS NULL RETURNING * LOOP
        IF NOT e.trusted AND minion_executor_earns_trust(e.id, e.agreements) THEN
            UPDATE executors SET trusted = true WHERE id = e.id;
        END IF;
    END LOOP;
    UPDATE executors SET disagreements = disagreements + 1, trusted = false, agreements = 0
     WHERE id = ANY (p_outvoted);
    -- A vouched executor is never quarantined by votes (none of its results is checked, and its own
    -- vote settles a check: no quorum can outvote it); an admin's word put it there.
    UPDATE executors
       SET quarantined_at = now(), quarantine_settled = false,
           quarantine_reason = format('outvoted %s times by other executors'' results (last: task %s, subtask %s)',
                                      disagreements, p_task_id, p_subtask_id)
     WHERE id = ANY (p_outvoted) AND quarantined_at IS NULL AND NOT minion_executor_vouched(id)
       AND disagreements >= minion_trust_setting('quarantine_after', 2);
END $$;

-- A replica's vote, after the API compared its verified output with the candidates of its subtask:
-- p_agrees_with the round of the candidate it matches, NULL for none. Returns 'agreed' (that
-- candidate committed), 'settled' (a vouched replica agreeing with none: its own result committed,
-- the candidates outvoted), 'disputed' (this result held as the second candidate: a third executor
-- runs the subtask), 'no_quorum' (three different answers: the subtask runs again, or fails once out
-- of attempts), or what minion_complete would ('lost', 'cancelled', 'records_mismatch',
-- 'dimension_mismatch').
CREATE FUNCTION minion_check_vote(p_token uuid, p_records integer, p_seconds double precision,
                                  p_result_key text, p_sha256 bytea, p_bytes bigint, p_result_data bytea,
                                  p_dimension integer, p_agrees_with smallint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    w subtask_checks%ROWTYPE;
    l subtask_checks%ROWTYPE;
    n integer;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role <> 'replica' THEN
        RETURN CASE WHEN role = 'held' THEN 'repeat' ELSE role END;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    SELECT count(*) INTO n FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;

    IF p_agrees_with IS NOT NULL THEN
        SELECT * INTO w FROM subtask_checks
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = p_agrees_with;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'subtask %/% has no candidate of round %', s.task_id, s.subtask_id, p_agrees_with
                USING ERRCODE = 'check_violation';
        END IF;
        SELECT * INTO l FROM subtask_checks
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round <> p_agrees_with;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'agreed',
                p_records, p_seconds);
        -- The quorum stands whatever happens to the result: the loser is blamed. Trust is earned only
        -- by agreeing with a trusted executor (vouched, or trusted so already): two strangers agreeing
        -- earn nothing. A completion replica was shown the held results to verify their proofs (it
        -- could echo them without work), so its agreement earns it nothing: trust comes from one's own
        -- results agreed with.
        PERFORM minion_executors_voted(CASE WHEN minion_executor_trusted(b.executor_id) THEN ARRAY[w.executor_id]
                                            ELSE '{}'::uuid[] END
                                       || CASE WHEN s.capability LIKE 'completion:%'
                                                    OR NOT minion_executor_trusted(w.executor_id) THEN '{}'::uuid[]
                                               ELSE ARRAY[b.executor_id] END,
                                       CASE WHEN l.lease_token IS NULL THEN '{}'::uuid[] ELSE ARRAY[l.executor_id] END,
                                       s.task_id, s.subtask_id);
        IF l.lease_token IS NOT NULL THEN
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'its result was outvoted 2 to 1'
             WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = l.lease_token
               AND outcome = 'candidate';
            DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = l.round;
        END IF;
        IF NOT minion_commit_candidate(s, w, 'done', NULL) THEN
            -- The agreed vectors' length is not the one a committed result fixed (a liar's, revoked
            -- when its quarantine is settled): the subtask runs again.
            PERFORM minion_recheck_subtask(s, 'the agreed vectors'' length is not the task''s');
        END IF;
        RETURN 'agreed';
    END IF;

    IF minion_executor_vouched(b.executor_id) THEN
        -- The trusted voice: a vouched replica that agrees with no candidate settles the check with
        -- its own result; every candidate is outvoted (and blamed).
        PERFORM minion_executors_voted('{}'::uuid[],
                                       ARRAY(SELECT c.executor_id FROM subtask_checks c
                                              WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id),
                                       s.task_id, s.subtask_id);
        UPDATE subtask_attempts a SET outcome = 'outvoted', error = 'a trusted executor''s result differs'
          FROM subtask_checks c
         WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
           AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id AND a.lease_token = c.lease_token
           AND a.outcome = 'candidate';
        DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        VALUES (s.task_id, s.subtask_id, 1, p_token, b.executor_id, s.attempts,
                minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
                p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, b.leased_at)
        RETURNING * INTO w;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'candidate',
                p_records, p_seconds);
        IF NOT minion_commit_candidate(s, w, 'done', NULL) THEN
            PERFORM minion_recheck_subtask(s, 'the trusted executor''s vectors'' length is not the task''s');
        END IF;
        RETURN 'settled';
    END IF;

    IF n = 1 THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        SELECT s.task_id, s.subtask_id, 3 - c.round, p_token, b.executor_id, s.attempts,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
               p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, b.leased_at
          FROM subtask_checks c WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'candidate',
                p_records, p_seconds);
        RETURN 'disputed';  -- still checking, no replica: offered to a third executor
    END IF;

    -- Three different answers: no majority, no one to blame. Run it again.
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'outvoted',
            'no two results agreed', p_records, p_seconds);
    PERFORM minion_recheck_subtask(s, 'no two results agreed');
    RETURN 'no_quorum';
END $$;

-- A committed result revoked: done subtask (p_task_id, p_subtask_id) of p_records records, committed
-- by lease p_lease_token, runs again from the queue (p_why its last error, p_attempt_error its attempt's,
-- now 'revoked'). The caller holds the subtask's and its open task's locks; the reopened subtask counts
-- as open again through this backend's progress slot, and a task left with no committed result has its
-- vector length fixed again by the next one (it may have been the revoked result's).
CREATE FUNCTION minion_revoke_result(p_task_id bigint, p_subtask_id integer, p_records integer, p_lease_token uuid,
                                     p_why text, p_attempt_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE subtasks
       SET state = 'pending', lease_token = NULL, output_key = NULL, result_key = NULL, result_sha256 = NULL,
           result_bytes = NULL, result_data = NULL, done_at = NULL, check_token = NULL, last_error = p_why
     WHERE task_id = p_task_id AND subtask_id = p_subtask_id;
    UPDATE subtask_attempts SET outcome = 'revoked', error = p_attempt_error
     WHERE task_id = p_task_id AND subtask_id = p_subtask_id AND lease_token = p_lease_token
       AND outcome IN ('done', 'unchecked');
    INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
    VALUES (p_task_id, pg_backend_pid(), -1, 0, -p_records)
    ON CONFLICT (task_id, slot) DO UPDATE
       SET closed = p.closed - 1, records_done = p.records_done - p_records;
    UPDATE tasks SET embedding_dimension = NULL
     WHERE id = p_task_id AND embedding_dimension IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM subtasks x WHERE x.task_id = p_task_id AND x.state = 'done');
END $$;

-- The rest of each quarantine flagged by a vote (or by minion_quarantine_executor): the executor's
-- leases and replicas released, the results it holds for checks dropped (a subtask left with none
-- runs again from the queue), every result it committed in a task not ended yet revoked and run
-- again, and the ended tasks holding its results warned. One executor per transaction step, in id
-- order; idempotent (each step finds nothing the second time). Returns the subtasks run again.
CREATE FUNCTION minion_settle_quarantines() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    q record;
    c record;
    d record;
    n integer := 0;
BEGIN
    FOR q IN SELECT e.id, e.quarantine_reason AS reason FROM executors e
              WHERE NOT e.quarantine_settled ORDER BY e.id LOOP
        PERFORM minion_end_executor_leases(q.id, 'released', 'executor quarantined: ' || q.reason, false);
        FOR c IN SELECT k.task_id, k.subtask_id, k.lease_token FROM subtask_checks k
                  WHERE k.executor_id = q.id ORDER BY k.task_id, k.subtask_id LOOP
            PERFORM 1 FROM subtasks WHERE task_id = c.task_id AND subtask_id = c.subtask_id FOR UPDATE;
            DELETE FROM subtask_checks WHERE lease_token = c.lease_token;
            CONTINUE WHEN NOT FOUND;
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'executor quarantined'
             WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND lease_token = c.lease_token
               AND outcome = 'candidate';
            IF NOT EXISTS (SELECT 1 FROM subtask_checks WHERE task_id = c.task_id AND subtask_id = c.subtask_id) THEN
                DELETE FROM subtask_backups WHERE task_id = c.task_id AND subtask_id = c.subtask_id;
                UPDATE subtasks SET state = 'pending', lease_token = NULL, check_token = NULL
                 WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND state = 'checking';
                n := n + 1;
            ELSE
                UPDATE subtasks s SET lease_token = k.lease_token
                  FROM subtask_checks k
                 WHERE s.task_id = c.task_id AND s.subtask_id = c.subtask_id
                   AND k.task_id = s.task_id AND k.subtask_id = s.subtask_id AND s.lease_token = c.lease_token;
            END IF;
        END LOOP;
        -- Its committed results in tasks that have not ended: revoked, run again (a reopened subtask
        -- counts as open again through this backend's progress slot, under the task row's lock, which
        -- a settle takes too: the task cannot end meanwhile). A task left with no committed result
        -- has its vector length fixed again by the next one (it may have been the liar's).
        FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
                   FROM subtask_attempts a
                   JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
                                  AND s.state = 'done' AND s.lease_token = a.lease_token
                   JOIN tasks t ON t.id = a.task_id
                  WHERE a.executor_id = q.id AND a.outcome IN ('done', 'unchecked')
                    AND t.status IN ('splitting', 'queued', 'running')
                  ORDER BY s.task_id, s.subtask_id
                    FOR UPDATE OF s LOOP
            PERFORM 1 FROM tasks WHERE id = d.task_id AND status IN ('splitting', 'queued', 'running') FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            PERFORM minion_revoke_result(d.task_id, d.subtask_id, d.records, d.lease_token,
                                         'its result came from a quarantined executor',
                                         'executor quarantined: ' || q.reason);
            n := n + 1;
        END LOOP;
        -- Tasks that ended with its results (after the revokes: a task that ended meanwhile is warned).
        INSERT INTO task_quarantine_warnings (task_id, executor_id, subtasks, reason)
        SELECT a.task_id, q.id, count(*), q.reason
          FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.executor_id = q.id AND a.outcome IN ('done', 'unchecked')
           AND t.status IN ('completed', 'failed', 'cancelled')
         GROUP BY a.task_id
        ON CONFLICT (task_id, executor_id) DO UPDATE SET subtasks = excluded.subtasks, reason = excluded.reason;
        UPDATE executors SET quarantine_settled = true WHERE id = q.id;
    END LOOP;
    RETURN n;
END $$;

-- An executor quarantined by hand (and by tests): flagged, then settled at once. Returns the
-- subtasks run again; NULL when it was quarantined already.
CREATE FUNCTION minion_quarantine_executor(p_executor uuid, p_reason text) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE executors SET quarantined_at = now(), quarantine_reason = p_reason, trusted = false,
                         quarantine_settled = false
     WHERE id = p_executor AND quarantined_at IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN minion_settle_quarantines();
END $$;

-- An admin lifts a quarantine: the executor starts again as new (its results checked until it earns
-- trust). Returns false when it was not quarantined.
CREATE FUNCTION minion_release_quarantine(p_executor uuid) RETURNS boolean LANGUAGE sql AS $$
    UPDATE executors SET quarantined_at = NULL, quarantine_reason = NULL, agreements = 0, disagreements = 0,
                         trusted = false, quarantine_settled = true
     WHERE id = p_executor AND quarantined_at IS NOT NULL
    RETURNING true
$$;

-- Checks that could not finish within p_wait_s of their first held result (replicas kept failing,
-- or every executor that could run one left). A volunteer's lone candidate is never committed
-- unchecked: it stays held, marked overdue (its task's warning), and its replica is offered on (an
-- executor of another owner runs it when one comes; a vouched one settles it alone). A vouched
-- executor's lone candidate (none is held today: its results commit at once) commits unchecked
-- ('unchecked' in its attempt, trust unchanged). A dispute runs again from the queue, its replica
-- still running dropped ('superseded'). Returns the subtasks settled or newly marked overdue. The
-- watchdog's sweep runs it.
CREATE FUNCTION minion_settle_stale_checks(p_wait_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    k record;
    s subtasks;
    w subtask_checks%ROWTYPE;
    tok uuid;
    n integer := 0;
    note text := format('unchecked: no replica agreed or disagreed within %s s', p_wait_s);
BEGIN
    -- An overdue candidate's wait is over: a dispute it then gets waits its own (the newer result's).
    FOR k IN SELECT c.task_id, c.subtask_id FROM subtask_checks c
              GROUP BY c.task_id, c.subtask_id
             HAVING min(c.held_at) FILTER (WHERE NOT c.overdue) < now() - make_interval(secs => p_wait_s)
              ORDER BY c.task_id, c.subtask_id LOOP
        w := NULL;  -- this group's lone candidate, if it has one (never the last group's)
        SELECT * INTO s FROM subtasks
         WHERE task_id = k.task_id AND subtask_id = k.subtask_id AND state = 'checking' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF (SELECT count(*) FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id) = 1 THEN
            SELECT * INTO w FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id;
            IF NOT minion_executor_vouched(w.executor_id) THEN
                UPDATE subtask_checks SET overdue = true WHERE lease_token = w.lease_token;
                n := n + 1;
                CONTINUE;
            END IF;
        END IF;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.task_id = k.task_id AND b.subtask_id = k.subtask_id LOOP
            PERFORM minion_end_backup(tok, 'superseded', note);
        END LOOP;
        IF w.lease_token IS NOT NULL THEN
            IF NOT minion_commit_candidate(s, w, 'unchecked', note) THEN
                PERFORM minion_recheck_subtask(s, 'its vectors'' length is not the task''s');
            END IF;
        ELSE
            PERFORM minion_recheck_subtask(s, format('two results disagreed and no third came within %s s',
                                                     p_wait_s));
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- A replica wanted: a result held (or a second one, disputed), or a replica's row gone (lost,
-- released, failed) while its subtask is still checking. Woken like a requeue: executors waiting on
-- the capability claim again.
CREATE FUNCTION minion_notify_replica_wanted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cap text;
BEGIN
    IF TG_TABLE_NAME = 'subtask_checks' THEN
        SELECT s.capability INTO cap FROM subtasks s WHERE s.task_id = NEW.task_id AND s.subtask_id = NEW.subtask_id;
    ELSE
        SELECT s.capability INTO cap FROM subtasks s
         WHERE s.task_id = OLD.task_id AND s.subtask_id = OLD.subtask_id AND s.state = 'checking';
    END IF;
    IF cap IS NOT NULL THEN
        PERFORM pg_notify('subtasks', cap);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER subtask_checks_notify AFTER INSERT ON subtask_checks
    FOR EACH ROW EXECUTE FUNCTION minion_notify_replica_wanted();

CREATE TRIGGER subtask_backups_notify_replica AFTER DELETE ON subtask_backups
    FOR EACH ROW EXECUTE FUNCTION minion_notify_replica_wanted();

-- The verification task of task p_task_id, named p_name in the same team and project, and how many
-- subtasks it holds. task_id NULL: nothing to verify (subtasks 0), or p_name is taken (subtasks -1).
-- Suspect (without p_all): a result of an executor quarantined since, one committed unchecked, and a
-- volunteer's that no vouched executor agreed with (a stranger's word, or none). The verification
-- runs on vouched executors only (placement 'trusted'): never on the volunteers that made the results
-- or their owners' machines, and pinned by a vouched executor's fingerprint, not a made-up one.
CREATE FUNCTION minion_verify_task(p_task_id bigint, p_name text, p_all boolean, p_created_by bigint,
                                   OUT task_id bigint, OUT subtasks integer)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
    picked record;
    new_id bigint;
BEGIN
    SELECT * INTO t FROM tasks WHERE id = p_task_id;
    SELECT array_agg(s.byte_start ORDER BY s.subtask_id) AS starts, array_agg(s.byte_end ORDER BY s.subtask_id) AS ends,
           array_agg(s.first_record ORDER BY s.subtask_id) AS firsts, array_agg(s.records ORDER BY s.subtask_id) AS counts,
           count(*)::integer AS n, max(s.byte_end) AS last_byte, sum(s.records)::bigint AS records
      INTO picked
      FROM subtasks s
     WHERE s.task_id = p_task_id AND s.state = 'done'
       AND (p_all OR EXISTS (SELECT 1 FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                              WHERE a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                                AND a.lease_token = s.lease_token AND a.outcome IN ('done', 'unchecked')
                                AND (e.quarantined_at IS NOT NULL OR a.outcome = 'unchecked'
                                     OR (NOT minion_executor_vouched(e.id)
                                         AND NOT EXISTS (SELECT 1 FROM subtask_attempts v
                                                          WHERE v.task_id = s.task_id AND v.subtask_id = s.subtask_id
                                                            AND v.attempt = a.attempt AND v.outcome = 'agreed'
                                                            AND minion_executor_vouched(v.executor_id))))));
    subtasks := picked.n;
    IF subtasks = 0 THEN
        RETURN;
    END IF;
    new_id := minion_create_task(t.team, t.project, p_name, t.kind,
                                 CASE WHEN t.fingerprint_from_revision THEN t.model || '@' || t.fingerprint
                                      ELSE t.model END,
                                 t.params, t.priority, t.subtask_size, t.max_attempts, t.input_uri,
                                 'verify:' || t.request_hash, p_created_by, 'trusted');
    IF new_id IS NULL THEN
        subtasks := -1;
        RETURN;
    END IF;
    INSERT INTO task_inputs (task_id, team, data) SELECT new_id, i.team, i.data FROM task_inputs i WHERE i.task_id = p_task_id;
    PERFORM minion_begin_split(new_id);
    PERFORM minion_add_subtasks(new_id, picked.starts, picked.ends, picked.firsts, picked.counts, 0,
                                picked.last_byte, picked.records);
    PERFORM minion_finish_split(new_id);
    task_id := new_id;
END $$;
