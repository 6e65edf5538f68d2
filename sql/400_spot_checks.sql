-- Replicated spot checks and earned trust.
--
-- One way to run a subtask twice: the straggler backup (sql/030). A lease chosen for a check (at
-- claim: every lease of an executor not trusted yet, and a random share of the others) commits
-- nothing when it completes: its verified result is held as a candidate (subtask_checks) and the
-- subtask moves to 'checking' (open: its task cannot end). A replica of a checking subtask is a
-- backup row taken by another executor (one that produced none of its candidates; another API token
-- wherever one could run it) of the task's fingerprint; to the executor it is a lease like any
-- (`backup` false: nothing tells an embedding executor that it is checking another's work; a
-- completion replica is sent the held results, `check`, to verify their proofs of generation
-- with a prefill pass instead of generating, answering a result whose proof holds as it is, so
-- that the two agree). A lost or released replica
-- deletes its row, which re-offers the subtask. The API compares the replica's verified output with
-- the candidates (services/api/spot_check.py: embeddings by cosine per record, greedy completions by
-- text similarity, sleep by ids) and hands its verdict to minion_check_vote:
--   agrees with a candidate  -> that candidate commits (the subtask is done, as any complete);
--   disagrees with the one   -> it is held as a second candidate; a third executor runs it;
--   disagrees with both      -> no quorum: both dropped, the subtask runs again from the queue
--                               (failed for good once out of attempts), nobody blamed.
-- Trust: each executor counts agreements and disagreements; `trusted` once it has agreed
-- minions.trust_agreements times with model fingerprints reported (reset when they change). The
-- losing side of a 2-to-1 quorum gains a disagreement, and at minions.quarantine_after it is
-- quarantined: flagged in the vote's transaction (its claims are refused from then on), its leases,
-- candidates and results in open tasks dealt with by minion_settle_quarantines, in a transaction of
-- its own (the API calls it after each vote, the watchdog's sweep too), so a vote locks one subtask
-- and its voters' rows, in id order, and nothing else.
--
-- What is never checked: a lease no other executor could replicate now (online within the lease
-- timeout, not quarantined, serving its capability, of its task's fingerprint, of its team: the
-- executors a replica claim would serve), so a lone executor's results commit as before; and a
-- sampled completion (temperature not 0: two honest runs differ) without proofs of generation (an
-- Ollama backend's). A check that cannot finish (its
-- replicas keep failing, or every executor that could run one left) ends after
-- minions.spot_check_wait_s (minion_settle_stale_checks, the watchdog's sweep): a lone candidate
-- commits unchecked (its attempt says so), a dispute runs again from the queue.
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

-- 'checking': completed once, its result held until a replica agrees.
ALTER TABLE subtasks DROP CONSTRAINT subtasks_state_check;
ALTER TABLE subtasks ADD CONSTRAINT subtasks_state_check
    CHECK (state IN ('pending', 'leased', 'checking', 'done', 'failed', 'cancelled'));
-- The lease chosen for a check: checked while it is the subtask's lease (a requeue gives the
-- subtask a new token, so a stale choice never holds another lease's result).
ALTER TABLE subtasks ADD COLUMN check_token uuid;
ALTER TABLE subtasks ADD CONSTRAINT subtasks_checking_token CHECK (state <> 'checking' OR lease_token IS NOT NULL);
CREATE INDEX subtasks_checking ON subtasks (capability, priority DESC, task_id, subtask_id) WHERE state = 'checking';
-- A task's subtasks in flight, leased or checking (the settle probe, the task's counts). It replaces
-- subtasks_leased_task (001), whose queries it serves too (state = 'leased' implies its predicate),
-- so a claim or a complete maintains as many indexes as before.
DROP INDEX subtasks_leased_task;
CREATE INDEX subtasks_in_flight_task ON subtasks (task_id) WHERE state IN ('leased', 'checking');

-- candidate: a result held for a check; agreed: a replica that matched the committed one;
-- outvoted: a result on the losing side of a quorum (or of no quorum); revoked: a committed result
-- of an executor later quarantined, run again; unchecked: a held result committed because no check
-- could finish in time.
ALTER TABLE subtask_attempts DROP CONSTRAINT subtask_attempts_outcome_check;
ALTER TABLE subtask_attempts ADD CONSTRAINT subtask_attempts_outcome_check
    CHECK (outcome IN ('done', 'failed', 'lost', 'released', 'cancelled', 'superseded', 'candidate', 'agreed',
                       'outvoted', 'revoked', 'unchecked'));
-- A quarantine revokes an executor's committed results: found by executor, not by a scan of history.
CREATE INDEX subtask_attempts_executor_done ON subtask_attempts (executor_id) WHERE outcome IN ('done', 'unchecked');

-- The results held for a check: round 1 the first, round 2 a replica that disagreed. At most two,
-- only while the subtask is 'checking' (its functions delete them when it leaves that state).
CREATE TABLE subtask_checks (
    task_id        bigint NOT NULL,
    subtask_id     integer NOT NULL,
    round          smallint NOT NULL CHECK (round IN (1, 2)),
    lease_token    uuid NOT NULL UNIQUE,
    executor_id    uuid NOT NULL REFERENCES executors (id),
    attempt        integer NOT NULL,
    output_key     text NOT NULL,
    result_key     text,
    result_sha256  bytea,
    result_bytes   bigint,
    result_data    bytea,
    dimension      integer CHECK (dimension > 0),  -- its vectors' length (embeddings), pinned if it commits
    records        integer NOT NULL,
    seconds        double precision,
    started_at     timestamptz NOT NULL,
    held_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, subtask_id, round),
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE,
    CHECK ((result_key IS NULL) = (result_sha256 IS NULL) OR result_data IS NOT NULL)
);
CREATE INDEX subtask_checks_executor ON subtask_checks (executor_id);
CREATE INDEX subtask_checks_held_at ON subtask_checks (held_at);

-- Ended tasks that hold results of an executor quarantined after they ended (written by the
-- quarantine: tasks still open have those results run again instead). Shown as the task's warnings.
CREATE TABLE task_quarantine_warnings (
    task_id      bigint NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    executor_id  uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    subtasks     integer NOT NULL CHECK (subtasks > 0),
    reason       text NOT NULL,
    noted_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, executor_id)
);

-- Trust, per executor (reset when its model fingerprints change). quarantine_settled: its leases,
-- candidates and results were dealt with (minion_settle_quarantines).
ALTER TABLE executors
    ADD COLUMN agreements integer NOT NULL DEFAULT 0 CHECK (agreements >= 0),
    ADD COLUMN disagreements integer NOT NULL DEFAULT 0 CHECK (disagreements >= 0),
    ADD COLUMN trusted boolean NOT NULL DEFAULT false,
    ADD COLUMN quarantined_at timestamptz,
    ADD COLUMN quarantine_reason text,
    ADD COLUMN quarantine_settled boolean NOT NULL DEFAULT true,
    ADD CONSTRAINT executors_quarantine_reason CHECK ((quarantined_at IS NULL) = (quarantine_reason IS NULL)),
    ADD CONSTRAINT executors_quarantined_untrusted CHECK (quarantined_at IS NULL OR NOT trusted);
CREATE INDEX executors_quarantine_unsettled ON executors (id) WHERE NOT quarantine_settled;

-- The version of the proofs of generation an executor's results of a capability carry, as it
-- registered (NULL: none; an agent from before proofs reports none, so its sampled completions
-- are not checked and nobody expects proofs from it).
ALTER TABLE executor_fingerprints ADD COLUMN proofs smallint CHECK (proofs > 0);

-- A trust setting: the session's minions.<name>, else the default.
CREATE FUNCTION minion_trust_setting(p_name text, p_default double precision) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('minions.' || p_name, true), '')::double precision, p_default)
$$;

-- The share p_shares ('team=share,team=share') gives team p_team, NULL when none.
CREATE FUNCTION minion_team_spot_check_share(p_team text, p_shares text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT split_part(kv, '=', 2)::double precision
      FROM unnest(string_to_array(p_shares, ',')) AS kv
     WHERE btrim(split_part(kv, '=', 1)) = p_team
     LIMIT 1
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

-- The executors a replica of a subtask (capability p_cap, team p_team, task fingerprint p_fp) could
-- go to, other than p_not: the executors whose claim minion_claim_replica would serve it. Online and
-- heard from within the lease timeout, not quarantined, serving p_cap, of p_team's scope, of the
-- task's fingerprint when it has one.
CREATE FUNCTION minion_replica_executors(p_cap text, p_team text, p_fp text, p_not uuid[])
RETURNS TABLE (id uuid, token_id bigint) LANGUAGE sql STABLE AS $$
    SELECT e.id, e.token_id FROM executors e JOIN heartbeats h ON h.executor_id = e.id
     WHERE e.status = 'online' AND e.quarantined_at IS NULL AND p_cap = ANY (e.capabilities)
       AND NOT (e.id = ANY (p_not))
       AND (e.team IS NULL OR e.team = p_team)
       AND h.alive_at > now() - make_interval(secs => minion_lease_timeout_s())
       AND (p_fp IS NULL OR p_cap = 'sleep:*' OR minion_executor_fingerprint(e.id, p_cap) = p_fp)
$$;

-- Whether executor p_executor (of API token p_token_id) may run the replica of checking subtask
-- (p_task_id, p_subtask_id): it produced none of its candidates, and it is of another token than
-- theirs unless no executor of another token could run it (one owner's machines do not form a
-- quorum while another owner's could).
CREATE FUNCTION minion_replica_allowed(p_executor uuid, p_token_id bigint, p_task_id bigint, p_subtask_id integer,
                                       p_cap text, p_team text, p_fp text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH held AS (SELECT c.executor_id, e.token_id FROM subtask_checks c JOIN executors e ON e.id = c.executor_id
                   WHERE c.task_id = p_task_id AND c.subtask_id = p_subtask_id)
    SELECT NOT EXISTS (SELECT 1 FROM held WHERE held.executor_id = p_executor)
       AND (NOT EXISTS (SELECT 1 FROM held WHERE held.token_id = p_token_id)
            OR NOT EXISTS (SELECT 1 FROM minion_replica_executors(p_cap, p_team, p_fp,
                                                                   ARRAY(SELECT executor_id FROM held)) o
                            WHERE o.token_id <> ALL (ARRAY(SELECT token_id FROM held))))
$$;

-- Whether the task's pinned vector length admits p_dimension, without fixing it (a held result
-- fixes nothing: only a committed one does).
CREATE FUNCTION minion_dimension_fits(p_task_id bigint, p_dimension integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_dimension IS NULL OR coalesce((SELECT t.embedding_dimension = p_dimension FROM tasks t
                                             WHERE t.id = p_task_id), true)
$$;

-- A token as the subtask it names sees it (locked by the caller): 'primary' or 'backup' while
-- current; 'replica' (a backup of a checking subtask); 'held' (a candidate awaiting its check);
-- else 'cancelled' or 'lost'. (Replaces 030's.)
CREATE OR REPLACE FUNCTION minion_token_role(s subtasks, p_token uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.task_id IS NULL THEN 'lost'
                WHEN s.state = 'cancelled' AND s.lease_token = p_token THEN 'cancelled'
                WHEN s.state = 'checking' THEN
                    CASE WHEN EXISTS (SELECT 1 FROM subtask_backups b
                                       WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                         AND b.lease_token = p_token) THEN 'replica'
                         WHEN EXISTS (SELECT 1 FROM subtask_checks c WHERE c.lease_token = p_token) THEN 'held'
                         ELSE 'lost' END
                WHEN s.state <> 'leased' THEN 'lost'
                WHEN s.lease_token = p_token THEN 'primary'
                WHEN EXISTS (SELECT 1 FROM subtask_backups b
                              WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                AND b.lease_token = p_token) THEN 'backup'
                ELSE 'lost' END
$$;

-- (Replaces 070's: a replica's lease is live while its subtask is checking.)
CREATE OR REPLACE FUNCTION minion_lease_info(p_token uuid, OUT owner bigint, OUT output_key text, OUT task_id bigint,
                                             OUT subtask_id integer, OUT attempt integer, OUT kind text,
                                             OUT input_uri text, OUT byte_start bigint, OUT byte_end bigint,
                                             OUT records integer)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtasks s JOIN executors e ON e.id = s.lease_executor JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = p_token AND s.state = 'leased'
    UNION ALL
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtask_backups b
      JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
      JOIN executors e ON e.id = b.executor_id
      JOIN tasks t ON t.id = s.task_id
     WHERE b.lease_token = p_token AND s.state IN ('leased', 'checking')
    LIMIT 1
$$;

-- (Replaces 030's: a replica's token is answered 'ok' while its subtask is checking.)
CREATE OR REPLACE FUNCTION minion_heartbeat(p_executor uuid, p_tokens uuid[], p_grace_s double precision DEFAULT NULL)
RETURNS TABLE (lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s subtasks;
    tok uuid;
    forgotten text := 'executor no longer names this lease in its heartbeats (it never received it, or lost it)';
BEGIN
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status = 'lost';
    PERFORM minion_beat(p_executor);
    IF p_grace_s IS NOT NULL THEN
        FOR s IN SELECT * FROM subtasks sub
                  WHERE sub.lease_executor = p_executor AND sub.state = 'leased'
                    AND sub.leased_at < now() - make_interval(secs => p_grace_s)
                    AND NOT (sub.lease_token = ANY (p_tokens))
                  ORDER BY sub.task_id, sub.subtask_id FOR UPDATE LOOP
            PERFORM minion_end_attempt(s, 'lost', forgotten, true, true);
        END LOOP;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.executor_id = p_executor
                      AND b.leased_at < now() - make_interval(secs => p_grace_s)
                      AND NOT (b.lease_token = ANY (p_tokens)) LOOP
            PERFORM minion_end_backup(tok, 'lost', forgotten);
        END LOOP;
    END IF;
    RETURN QUERY
    SELECT t.tok,
           CASE WHEN s2.state = 'leased' AND s2.lease_executor = p_executor THEN 'ok'
                WHEN bs.state IN ('leased', 'checking') AND b.executor_id = p_executor THEN 'ok'
                WHEN s2.state = 'cancelled' THEN 'cancelled'
                ELSE 'lost' END
      FROM unnest(p_tokens) AS t(tok)
      LEFT JOIN subtasks s2 ON s2.lease_token = t.tok
      LEFT JOIN subtask_backups b ON b.lease_token = t.tok
      LEFT JOIN subtasks bs ON bs.task_id = b.task_id AND bs.subtask_id = b.subtask_id;
END $$;

-- (Replaces 030's: a held candidate's token ends nothing; a replica ends as a backup, which
-- re-offers its subtask.)
CREATE OR REPLACE FUNCTION minion_end_lease(p_token uuid, p_outcome text, p_error text, p_counts boolean,
                                            p_retry boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'primary' THEN
        PERFORM minion_end_attempt(s, p_outcome, p_error, p_counts, p_retry);
    ELSIF role IN ('backup', 'replica') THEN
        PERFORM minion_end_backup(p_token, p_outcome, p_error);
    ELSIF role = 'held' THEN
        RETURN 'lost';
    ELSE
        RETURN role;
    END IF;
    RETURN 'ok';
END $$;

-- (Replaces 030's: the subtask is locked before its backup row is deleted, the order every
-- function that ends a lease or votes takes (subtask, then its rows); deleting first deadlocked
-- with a replica's vote, which locks the subtask and then deletes the same row.)
CREATE OR REPLACE FUNCTION minion_end_backup(p_token uuid, p_outcome text, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b subtask_backups%ROWTYPE;
    att integer;
BEGIN
    PERFORM 1 FROM subtasks s JOIN subtask_backups k ON k.task_id = s.task_id AND k.subtask_id = s.subtask_id
      WHERE k.lease_token = p_token FOR UPDATE OF s;
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT attempts INTO att FROM subtasks WHERE task_id = b.task_id AND subtask_id = b.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (b.task_id, b.subtask_id, att, b.executor_id, b.lease_token, b.leased_at, p_outcome, p_error);
END $$;

-- A replica for p_executor: a checking subtask of its capabilities (its team's, if it has one) with
-- no replica running, that it may replicate (minion_replica_allowed), of its fingerprint (or of a
-- task not pinned: one run so far by executors that report none, sql/393). Returns the replica's
-- token (a backup row), or NULL. A replica pins nothing.
CREATE FUNCTION minion_claim_replica(p_executor uuid, p_token_id bigint, p_caps text[], p_team text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
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
           AND minion_replica_allowed(p_executor, p_token_id, h.task_id, h.subtask_id, h.capability, h.team::text,
                                      t.fingerprint)
         ORDER BY h.priority DESC, h.task_id, h.subtask_id
         LIMIT 4
    LOOP
        PERFORM 1 FROM subtasks
          WHERE task_id = cand.task_id AND subtask_id = cand.subtask_id AND state = 'checking'
          FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tok := gen_random_uuid();
        INSERT INTO subtask_backups (task_id, subtask_id, lease_token, executor_id)
        VALUES (cand.task_id, cand.subtask_id, tok, p_executor)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- (Replaces 320's, with its settings: a quarantined executor is refused ('quarantined'); a replica
-- wanted of its capabilities comes first (one at most a claim, answered as a lease like any:
-- `backup` false); and the leases won that are chosen for a check are marked (check_token), in one
-- UPDATE when the share may choose any: all of an executor not trusted, else each with its team's
-- share (minions.spot_check_team_shares) or minions.spot_check_share; only checkable ones
-- (minion_checkable, or a sampled completion with proofs: minion_executor_proves) that another
-- executor could replicate now (minion_replica_executors).
-- Otherwise as before.)
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
        team_shares := CASE WHEN share < 1 THEN nullif(current_setting('minions.spot_check_team_shares', true), '') END;
        IF share > 0 OR team_shares IS NOT NULL THEN
            UPDATE subtasks s SET check_token = s.lease_token
              FROM tasks t
             WHERE s.lease_token = ANY (won) AND t.id = s.task_id
               AND random() < CASE WHEN share >= 1 THEN 2
                                   ELSE coalesce(minion_team_spot_check_share(s.team::text, team_shares), share) END
               AND (minion_checkable(t.kind, t.params) OR minion_executor_proves(p_executor, s.capability))
               AND EXISTS (SELECT 1 FROM minion_replica_executors(s.capability, s.team::text, t.fingerprint,
                                                                  ARRAY[p_executor]));
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
               minion_output_key(s.task_id, s.subtask_id, s.attempts, b.lease_token), replica_tok IS NULL
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

-- Whether backup p_token of subtask s is of an executor not trusted yet, whose result another
-- executor could check now (its first results are all checked, whichever way it got the lease).
CREATE FUNCTION minion_untrusted_backup(s subtasks, p_token uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT minion_trust_setting('trust_agreements', 0) > 0
       AND EXISTS (SELECT 1 FROM subtask_backups k JOIN executors e ON e.id = k.executor_id
                    WHERE k.lease_token = p_token AND NOT e.trusted
                      AND EXISTS (SELECT 1 FROM minion_replica_executors(
                                      s.capability, s.team::text, (SELECT t.fingerprint FROM tasks t WHERE t.id = s.task_id),
                                      ARRAY[e.id])))
$$;

-- (Replaces 380's: a lease chosen for a check (s.check_token) holds its result as a candidate
-- instead of committing it: 'held'; its subtask stays open, 'checking', until a replica votes. A
-- held result fixes no vector length (only a committed one does), but must fit the length fixed.
-- A replica's complete changes nothing here: 'replica', the API then compares and calls
-- minion_check_vote. A retried complete of a held candidate is answered 'repeat'. Otherwise
-- unchanged.)
CREATE OR REPLACE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                           p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                           p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL,
                                           p_dimension integer DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    held boolean;
    b subtask_backups%ROWTYPE;
    winner_executor uuid;
    winner_started timestamptz;
BEGIN
    IF p_sha256 IS NOT NULL AND p_result_key IS NULL AND p_result_data IS NULL THEN
        RAISE EXCEPTION 'a committed result needs its bytes: a result key or the bytes themselves'
            USING ERRCODE = 'check_violation';
    END IF;
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'lost' AND s.state = 'done' AND s.lease_token = p_token THEN
        RETURN 'repeat';  -- this very lease committed already: a retried complete is answered the same
    END IF;
    IF role = 'held' THEN
        RETURN 'repeat';  -- this very lease's result is held for its check already
    END IF;
    IF role NOT IN ('primary', 'backup', 'replica') THEN
        RETURN role;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    IF role = 'replica' THEN
        -- Compared, then voted, whatever its vectors' length: a replica that disagrees with the length
        -- a liar's committed result fixed must count against it, not be refused.
        RETURN 'replica';
    END IF;
    -- Held: the lease chosen for a check, or a straggler backup of an executor not trusted yet
    -- (its first results are all checked, whichever way it got the lease).
    held := coalesce(s.check_token = s.lease_token, false)
            OR (role = 'backup' AND minion_untrusted_backup(s, p_token));
    IF p_dimension IS NOT NULL AND NOT (CASE WHEN held THEN minion_dimension_fits(s.task_id, p_dimension)
                                             ELSE minion_pin_dimension(s.task_id, p_dimension) END) THEN
        RETURN 'dimension_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id RETURNING * INTO b;
    IF role = 'primary' THEN
        winner_executor := s.lease_executor;
        winner_started := s.leased_at;
        IF b.lease_token IS NOT NULL THEN
            INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                          started_at, outcome)
            VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at,
                    'superseded');
        END IF;
    ELSE
        winner_executor := b.executor_id;
        winner_started := b.leased_at;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                      started_at, outcome)
        VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
                'superseded');
    END IF;
    IF held THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        VALUES (s.task_id, s.subtask_id, 1, p_token, winner_executor, s.attempts,
                minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
                p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, winner_started);
        UPDATE subtasks
           SET state = 'checking', lease_executor = NULL, lease_token = p_token, check_token = NULL
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_drop_referee_row(s.lease_token);
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'candidate',
                p_records, p_seconds);
        RETURN 'held';
    END IF;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = p_token,
           output_key = minion_output_key(task_id, subtask_id, attempts, p_token),
           result_key = p_result_key, result_sha256 = p_sha256, result_bytes = p_bytes,
           result_data = p_result_data
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    PERFORM minion_drop_referee_row(s.lease_token);
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;

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
    UPDATE executors
       SET quarantined_at = now(), quarantine_settled = false,
           quarantine_reason = format('outvoted %s times by other executors'' results (last: task %s, subtask %s)',
                                      disagreements, p_task_id, p_subtask_id)
     WHERE id = ANY (p_outvoted) AND quarantined_at IS NULL
       AND disagreements >= minion_trust_setting('quarantine_after', 2);
END $$;

-- A replica's vote, after the API compared its verified output with the candidates of its subtask:
-- p_agrees_with the round of the candidate it matches, NULL for none. Returns 'agreed' (that
-- candidate committed), 'disputed' (this result held as the second candidate: a third executor
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
        -- The quorum stands whatever happens to the result: the loser is blamed. A completion replica
        -- was shown the held results to verify their proofs (it could echo them without work), so its
        -- agreement earns it nothing: trust comes from one's own results agreed with.
        PERFORM minion_executors_voted(ARRAY[w.executor_id]
                                       || CASE WHEN s.capability LIKE 'completion:%' THEN '{}'::uuid[]
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
            UPDATE subtasks
               SET state = 'pending', lease_token = NULL, output_key = NULL, result_key = NULL, result_sha256 = NULL,
                   result_bytes = NULL, result_data = NULL, done_at = NULL, check_token = NULL,
                   last_error = 'its result came from a quarantined executor'
             WHERE task_id = d.task_id AND subtask_id = d.subtask_id;
            UPDATE subtask_attempts SET outcome = 'revoked', error = 'executor quarantined: ' || q.reason
             WHERE task_id = d.task_id AND subtask_id = d.subtask_id AND lease_token = d.lease_token
               AND outcome IN ('done', 'unchecked');
            INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
            VALUES (d.task_id, pg_backend_pid(), -1, 0, -d.records)
            ON CONFLICT (task_id, slot) DO UPDATE
               SET closed = p.closed - 1, records_done = p.records_done - d.records;
            UPDATE tasks SET embedding_dimension = NULL
             WHERE id = d.task_id AND embedding_dimension IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM subtasks x WHERE x.task_id = d.task_id AND x.state = 'done');
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
-- or every executor that could run one left): a lone candidate commits unchecked ('unchecked' in its
-- attempt, trust unchanged), a dispute runs again from the queue; a replica still running is
-- dropped ('superseded'). Returns the subtasks settled. The watchdog's sweep runs it.
CREATE FUNCTION minion_settle_stale_checks(p_wait_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    k record;
    s subtasks;
    w subtask_checks%ROWTYPE;
    tok uuid;
    n integer := 0;
    note text := format('unchecked: no replica agreed or disagreed within %s s', p_wait_s);
BEGIN
    FOR k IN SELECT c.task_id, c.subtask_id FROM subtask_checks c
              GROUP BY c.task_id, c.subtask_id
             HAVING min(c.held_at) < now() - make_interval(secs => p_wait_s)
              ORDER BY c.task_id, c.subtask_id LOOP
        SELECT * INTO s FROM subtasks
         WHERE task_id = k.task_id AND subtask_id = k.subtask_id AND state = 'checking' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.task_id = k.task_id AND b.subtask_id = k.subtask_id LOOP
            PERFORM minion_end_backup(tok, 'superseded', note);
        END LOOP;
        IF (SELECT count(*) FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id) = 1 THEN
            SELECT * INTO w FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id;
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

-- (Replaces 392's: a registration that changes the executor's fingerprints, or the proofs it makes,
-- resets its trust.)
CREATE OR REPLACE FUNCTION minion_set_executor_fingerprints(p_executor uuid, p_fingerprints jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();  -- after this registration ended the executor's leases
    fresh jsonb;
    held jsonb;
    oldest_kept timestamptz;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_array(x.capability, x.model, x.fingerprint, x.precision, x.backend,
                                                x.proofs)
                              ORDER BY x.capability), '[]')
      INTO fresh
      FROM (SELECT DISTINCT ON (minion_capability(k, f.value ->> 'model'))
                   minion_capability(k, f.value ->> 'model') AS capability, f.value ->> 'model' AS model,
                   lower(f.value ->> 'fingerprint') AS fingerprint, f.value ->> 'precision' AS precision,
                   f.value ->> 'backend' AS backend, (f.value ->> 'proofs')::smallint AS proofs
              FROM jsonb_array_elements(p_fingerprints) AS f(value)
              JOIN executors e ON e.id = p_executor
             CROSS JOIN unnest(e.kinds) AS k
             WHERE k <> 'sleep'
             ORDER BY minion_capability(k, f.value ->> 'model')) x;
    SELECT coalesce(jsonb_agg(jsonb_build_array(f.capability, f.model, f.fingerprint, f.precision, f.backend,
                                                f.proofs)
                              ORDER BY f.capability), '[]')
      INTO held
      FROM executor_fingerprints f WHERE f.executor_id = p_executor;
    IF fresh = held THEN
        RETURN jsonb_array_length(fresh);
    END IF;

    -- New fingerprints: trust starts again (its next results are checked until it agrees again).
    UPDATE executors SET agreements = 0, trusted = false WHERE id = p_executor;
    UPDATE executor_fingerprint_history SET valid_to = at WHERE executor_id = p_executor AND valid_to IS NULL;
    DELETE FROM executor_fingerprints WHERE executor_id = p_executor;
    INSERT INTO executor_fingerprints (executor_id, capability, model, fingerprint, precision, backend, proofs)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, (r ->> 5)::smallint
      FROM jsonb_array_elements(fresh) AS r;
    INSERT INTO executor_fingerprint_history (executor_id, capability, model, fingerprint, precision, backend,
                                              valid_from)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, at FROM jsonb_array_elements(fresh) AS r;

    SELECT p.valid_from INTO oldest_kept
      FROM (SELECT DISTINCT h.valid_from FROM executor_fingerprint_history h
             WHERE h.executor_id = p_executor ORDER BY h.valid_from DESC OFFSET 63 LIMIT 1) p;
    IF oldest_kept IS NOT NULL THEN
        DELETE FROM executor_fingerprint_history h WHERE h.executor_id = p_executor AND h.valid_from < oldest_kept;
    END IF;
    RETURN jsonb_array_length(fresh);
END $$;

-- (Replaces 080's: a held candidate's output is not garbage.)
CREATE OR REPLACE FUNCTION minion_gc_outputs(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH parsed AS (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id, m[4]::uuid AS token
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^outputs/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$') AS m
         WHERE m IS NOT NULL)
    SELECT p.k FROM parsed p
     WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = p.task_id)
        OR NOT EXISTS (
            SELECT 1 FROM subtasks s
             WHERE s.task_id = p.task_id AND s.subtask_id = p.subtask_id
               AND (s.output_key = p.k
                    OR (s.state = 'leased' AND s.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_backups b
                                WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                  AND b.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_checks c
                                WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
                                  AND c.lease_token = p.token)))
$$;

-- (Replaces 085's: nor is a held candidate's verified copy.)
CREATE OR REPLACE FUNCTION minion_gc_results(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT r.k FROM (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^results/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-'
                                  '[0-9a-f]{16}\.jsonl$') AS m
         WHERE m IS NOT NULL) r
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.task_id = r.task_id AND s.subtask_id = r.subtask_id AND s.result_key = r.k)
       AND NOT EXISTS (SELECT 1 FROM subtask_checks c
                        WHERE c.task_id = r.task_id AND c.subtask_id = r.subtask_id AND c.result_key = r.k)
$$;

-- (Replaces 180's: a checking subtask is cancelled with its task; its held candidates dropped.)
CREATE OR REPLACE FUNCTION minion_cancel_task(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task. Completing, failing and reclaiming
    -- lock a subtask, then its task; taking the task first here would deadlock with them.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state IN ('pending', 'leased', 'checking')
      ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks SET status = 'cancelled', finished_at = now(), split_done = true,
                     cancelled_subtasks = open_subtasks, open_subtasks = 0
     WHERE id = p_task_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT task_id, subtask_id, attempts, lease_executor, lease_token, leased_at, 'cancelled', 'task cancelled'
      FROM subtasks WHERE task_id = p_task_id AND state = 'leased';
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT b.task_id, b.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at, 'cancelled',
           'task cancelled'
      FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
     WHERE b.task_id = p_task_id;
    UPDATE subtask_attempts a SET outcome = 'cancelled', error = 'task cancelled'
      FROM subtask_checks c
     WHERE c.task_id = p_task_id AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id
       AND a.lease_token = c.lease_token AND a.outcome = 'candidate';
    DELETE FROM subtask_checks WHERE task_id = p_task_id;
    DELETE FROM subtask_backups WHERE task_id = p_task_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = p_task_id;
    UPDATE subtasks SET state = 'cancelled', lease_executor = NULL
     WHERE task_id = p_task_id AND state IN ('pending', 'leased', 'checking');
    RETURN true;
END $$;

-- (Replaces 180's: waits for the closes of checking subtasks too.)
CREATE OR REPLACE FUNCTION minion_settle_waiting(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Waits for each in-flight close, then sees the row as it committed.
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('pending', 'leased', 'checking') FOR KEY SHARE;
    IF FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    RETURN (SELECT finished_at IS NOT NULL FROM tasks WHERE id = p_task_id);
END $$;

-- (Replaces 260's: a checking subtask is in flight like a leased one; nothing else changes.)
CREATE OR REPLACE FUNCTION minion_task_try_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    IF minion_settle_deferred() THEN
        RETURN;  -- minion_settle_after_batch decides
    END IF;
    SELECT split_done, status, kind, model, priority, open_subtasks INTO t FROM tasks WHERE id = p_task_id;
    IF NOT FOUND OR NOT t.split_done OR t.status NOT IN ('splitting', 'queued', 'running') THEN
        RETURN;  -- not split yet: minion_finish_split decides
    END IF;
    -- One probe of the queue index (capability, priority and task known), from the tail.
    PERFORM 1 FROM subtasks s
      WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
        AND s.priority = t.priority AND s.task_id = p_task_id
      ORDER BY s.subtask_id DESC LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    IF t.open_subtasks - (minion_task_slot_sums(p_task_id)).closed <= 0 THEN
        PERFORM minion_task_settle(p_task_id);
        RETURN;
    END IF;
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('leased', 'checking')
      LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('tasks', p_task_id::text);
END $$;

-- (Replaces 180's: subtasks_checking, those whose result waits for a spot check, apart from
-- pending ones.)
DROP FUNCTION minion_task_counts(bigint);
CREATE FUNCTION minion_task_counts(p_task_id bigint,
    OUT subtasks_total bigint, OUT subtasks_pending bigint, OUT subtasks_leased bigint,
    OUT subtasks_done bigint, OUT subtasks_failed bigint, OUT subtasks_cancelled bigint,
    OUT records_done bigint, OUT subtasks_checking bigint)
LANGUAGE sql STABLE AS $$
    SELECT t.subtasks_total, t.open_subtasks - p.closed - l.leased - l.checking, l.leased,
           t.subtasks_total - (t.open_subtasks - p.closed) - (t.failed_subtasks + p.failed) - t.cancelled_subtasks,
           t.failed_subtasks + p.failed, t.cancelled_subtasks, t.records_done + p.records_done, l.checking
      FROM tasks t
     CROSS JOIN LATERAL minion_task_slot_sums(t.id) p
     CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE s.state = 'leased') AS leased,
                                count(*) FILTER (WHERE s.state = 'checking') AS checking
                           FROM subtasks s
                          WHERE s.task_id = t.id AND s.state IN ('leased', 'checking')) l
     WHERE t.id = p_task_id
$$;
