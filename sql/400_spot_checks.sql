-- Replicated spot checks and earned trust (issue 26, items 3 and 4).
--
-- One way to run a subtask twice: the straggler backup (sql/030). A lease chosen for a check (at
-- claim: every lease of an executor not trusted yet, and a random share of the others) commits
-- nothing when it completes: its verified result is held as a candidate (subtask_checks) and the
-- subtask moves to 'checking' (open: its task cannot end). A replica of a checking subtask is a
-- backup lease (a subtask_backups row) taken by another executor (one that ran nothing of it yet,
-- another API token first) of the task's fingerprint; a lost or released replica deletes its row,
-- which re-offers the subtask. The API compares the replica's verified output with the candidates
-- (services/api/spot_check.py: embeddings by cosine per record, completions and sleep by equal
-- text and ids) and hands its verdict to minion_check_vote, which moves the state:
--   agrees with a candidate  -> that candidate commits (the subtask is done, as any complete);
--   disagrees with the one   -> it is held as a second candidate; a third executor runs it;
--   disagrees with both      -> no quorum: both dropped, the subtask runs again from the queue
--                               (failed for good once out of attempts).
-- Trust: each executor counts agreements and disagreements; `trusted` once it has agreed
-- minions.trust_agreements times with model fingerprints reported (reset when they change); the
-- losing side of a quorum gains a disagreement, and at minions.quarantine_after it is quarantined
-- (minion_quarantine_executor). The settings are session settings (custom GUCs) the API sets on its
-- connections from MINIONS_SPOT_CHECK_SHARE, MINIONS_TRUST_AGREEMENTS, MINIONS_QUARANTINE_AFTER
-- (defaults 0.02, 5, 2): reading one costs no table access, so a claim of a trusted executor pays
-- nothing for them. A session that sets none (psql, a SQL test) checks nothing: share 0, trust 0.
-- A lease is checked only while another executor could run its replica (online, not quarantined,
-- serving one of its capabilities): a lone executor's results commit as before.
--
-- Cost on the hot path: a complete reads s.check_wanted from the row it already locks (no statement);
-- a claim marks its chosen leases with one UPDATE only when it chose some, and probes the partial
-- index of checking subtasks (empty while nothing is checked) once.

-- 'checking': completed once, its result held until a replica agrees.
ALTER TABLE subtasks DROP CONSTRAINT subtasks_state_check;
ALTER TABLE subtasks ADD CONSTRAINT subtasks_state_check
    CHECK (state IN ('pending', 'leased', 'checking', 'done', 'failed', 'cancelled'));
ALTER TABLE subtasks ADD COLUMN check_wanted boolean NOT NULL DEFAULT false;
ALTER TABLE subtasks ADD CONSTRAINT subtasks_checking_token CHECK (state <> 'checking' OR lease_token IS NOT NULL);
CREATE INDEX subtasks_checking ON subtasks (capability, priority DESC, task_id, subtask_id) WHERE state = 'checking';

-- candidate: a result held for a check; agreed: a replica that matched the committed one;
-- outvoted: a result on the losing side of a quorum (or of no quorum); revoked: a committed result
-- of an executor later quarantined, run again.
ALTER TABLE subtask_attempts DROP CONSTRAINT subtask_attempts_outcome_check;
ALTER TABLE subtask_attempts ADD CONSTRAINT subtask_attempts_outcome_check
    CHECK (outcome IN ('done', 'failed', 'lost', 'released', 'cancelled', 'superseded', 'candidate', 'agreed',
                       'outvoted', 'revoked'));

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
    records        integer NOT NULL,
    seconds        double precision,
    started_at     timestamptz NOT NULL,
    PRIMARY KEY (task_id, subtask_id, round),
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE,
    CHECK ((result_key IS NULL) = (result_sha256 IS NULL) OR result_data IS NOT NULL)
);
CREATE INDEX subtask_checks_executor ON subtask_checks (executor_id);

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

-- Trust, per executor (reset when its model fingerprints change: sql/390's registration).
ALTER TABLE executors
    ADD COLUMN agreements integer NOT NULL DEFAULT 0 CHECK (agreements >= 0),
    ADD COLUMN disagreements integer NOT NULL DEFAULT 0 CHECK (disagreements >= 0),
    ADD COLUMN trusted boolean NOT NULL DEFAULT false,
    ADD COLUMN quarantined_at timestamptz,
    ADD COLUMN quarantine_reason text,
    ADD CONSTRAINT executors_quarantine_reason CHECK ((quarantined_at IS NULL) = (quarantine_reason IS NULL)),
    ADD CONSTRAINT executors_quarantined_untrusted CHECK (quarantined_at IS NULL OR NOT trusted);

-- A trust setting: the session's minions.<name>, else the default.
CREATE FUNCTION minion_trust_setting(p_name text, p_default double precision) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('minions.' || p_name, true), '')::double precision, p_default)
$$;

-- Whether an executor may be trusted: agreed often enough, and (serving a model) reported what it loaded.
CREATE FUNCTION minion_executor_earns_trust(p_executor uuid, p_agreements integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_agreements >= minion_trust_setting('trust_agreements', 0)
       AND (EXISTS (SELECT 1 FROM executor_fingerprints f WHERE f.executor_id = p_executor)
            OR NOT EXISTS (SELECT 1 FROM executors e, unnest(e.kinds) k WHERE e.id = p_executor AND k <> 'sleep'))
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

-- A replica for p_executor: a checking subtask of its capabilities (its team's, if it has one) with
-- no replica running, none of whose candidates it produced, of its fingerprint (or of a task not
-- pinned: one run so far by executors that report none, sql/393); subtasks whose candidates came
-- from another API token first. Returns the replica's token (a backup row), or NULL. A replica pins
-- nothing.
CREATE FUNCTION minion_claim_replica(p_executor uuid, p_token_id bigint, p_caps text[], p_team text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    FOR cand IN
        SELECT s.task_id, s.subtask_id FROM subtasks s
         WHERE s.state = 'checking' AND s.capability = ANY (p_caps) AND (p_team IS NULL OR s.team = p_team)
           AND NOT EXISTS (SELECT 1 FROM subtask_backups b WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id)
           AND NOT EXISTS (SELECT 1 FROM subtask_checks c
                            WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id AND c.executor_id = p_executor)
           AND (s.capability = 'sleep:*'
                OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id),
                            minion_executor_fingerprint(p_executor, s.capability))
                   = minion_executor_fingerprint(p_executor, s.capability))
         ORDER BY EXISTS (SELECT 1 FROM subtask_checks c JOIN executors e ON e.id = c.executor_id
                           WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id AND e.token_id = p_token_id),
                  s.priority DESC, s.task_id, s.subtask_id
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
-- wanted of its capabilities comes first (one at most a claim, as a backup row: `backup` true);
-- and the leases won that are chosen for a check (all of an executor not trusted, else each with
-- probability minions.spot_check_share) are marked, in one UPDATE when any is. Otherwise as before.)
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
        IF share > 0 THEN
            checked := ARRAY(SELECT w FROM unnest(won) AS w WHERE share >= 1 OR random() < share);
            -- Checked only where another executor could run the replica (else the result would wait
            -- for one for ever): one online, not quarantined, serving one of these capabilities.
            IF cardinality(checked) > 0
               AND EXISTS (SELECT 1 FROM executors o
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

-- (Replaces 380's: a lease marked for a check holds its result as a candidate instead of
-- committing it: 'held'; its subtask stays open, 'checking', until a replica votes. A replica's
-- complete changes nothing here: 'replica', the API then compares and calls minion_check_vote.
-- A retried complete of a held candidate is answered 'repeat'. Otherwise unchanged.)
CREATE OR REPLACE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                           p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                           p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL,
                                           p_dimension integer DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
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
    IF p_dimension IS NOT NULL AND NOT minion_pin_dimension(s.task_id, p_dimension) THEN
        RETURN 'dimension_mismatch';
    END IF;
    IF role = 'replica' THEN
        RETURN 'replica';
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
    IF s.check_wanted THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, records, seconds,
                                    started_at)
        VALUES (s.task_id, s.subtask_id, 1, p_token, winner_executor, s.attempts,
                minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
                p_result_key, p_sha256, p_bytes, p_result_data, p_records, p_seconds, winner_started);
        UPDATE subtasks
           SET state = 'checking', lease_executor = NULL, lease_token = p_token, check_wanted = false
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

-- One side of a quorum gains (p_agreed) or loses trust; at minions.quarantine_after disagreements
-- it is quarantined.
CREATE FUNCTION minion_executor_voted(p_executor uuid, p_agreed boolean, p_task_id bigint, p_subtask_id integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e executors%ROWTYPE;
BEGIN
    IF p_agreed THEN
        UPDATE executors SET agreements = agreements + 1 WHERE id = p_executor RETURNING * INTO e;
        IF NOT e.trusted AND e.quarantined_at IS NULL AND minion_executor_earns_trust(p_executor, e.agreements) THEN
            UPDATE executors SET trusted = true WHERE id = p_executor;
        END IF;
        RETURN;
    END IF;
    UPDATE executors SET disagreements = disagreements + 1, trusted = false, agreements = 0
     WHERE id = p_executor RETURNING * INTO e;
    IF e.disagreements >= minion_trust_setting('quarantine_after', 2) THEN
        PERFORM minion_quarantine_executor(p_executor,
            format('outvoted %s times by other executors'' results (last: task %s, subtask %s)',
                   e.disagreements, p_task_id, p_subtask_id));
    END IF;
END $$;

-- A replica's vote, after the API compared its verified output with the candidates of its subtask:
-- p_agrees_with the round of the candidate it matches, NULL for none. Returns 'agreed' (that
-- candidate committed), 'disputed' (this result held as the second candidate: a third executor
-- runs the subtask), 'no_quorum' (three different answers: the subtask runs again, or fails once out
-- of attempts), or what minion_complete would ('lost', 'cancelled', 'records_mismatch').
CREATE FUNCTION minion_check_vote(p_token uuid, p_records integer, p_seconds double precision,
                                  p_result_key text, p_sha256 bytea, p_bytes bigint, p_result_data bytea,
                                  p_agrees_with smallint)
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
        DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE subtasks
           SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = w.lease_token,
               output_key = w.output_key, result_key = w.result_key, result_sha256 = w.result_sha256,
               result_bytes = w.result_bytes, result_data = w.result_data, check_wanted = false
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE subtask_attempts SET outcome = 'done', ended_at = now()
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = w.lease_token
           AND outcome = 'candidate';
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'agreed',
                p_records, p_seconds);
        PERFORM minion_executor_voted(w.executor_id, true, s.task_id, s.subtask_id);
        PERFORM minion_executor_voted(b.executor_id, true, s.task_id, s.subtask_id);
        IF l.lease_token IS NOT NULL THEN
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'its result was outvoted 2 to 1'
             WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = l.lease_token
               AND outcome = 'candidate';
            PERFORM minion_executor_voted(l.executor_id, false, s.task_id, s.subtask_id);
        END IF;
        PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
        RETURN 'agreed';
    END IF;

    IF n = 1 THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, records, seconds,
                                    started_at)
        SELECT s.task_id, s.subtask_id, 3 - c.round, p_token, b.executor_id, s.attempts,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
               p_result_key, p_sha256, p_bytes, p_result_data, p_records, p_seconds, b.leased_at
          FROM subtask_checks c WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'candidate',
                p_records, p_seconds);
        RETURN 'disputed';  -- still checking, no replica: offered to a third executor
    END IF;

    -- Three different answers: no majority, no one to blame. Run it again, checked.
    UPDATE subtask_attempts a SET outcome = 'outvoted', error = 'no two results agreed'
      FROM subtask_checks c
     WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
       AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id AND a.lease_token = c.lease_token
       AND a.outcome = 'candidate';
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'outvoted',
            'no two results agreed', p_records, p_seconds);
    DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    IF s.attempts < (SELECT max_attempts FROM tasks WHERE id = s.task_id) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, check_wanted = false,
               last_error = 'spot check: no two of three results agreed'
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    ELSE
        UPDATE subtasks
           SET state = 'failed', done_at = now(), check_wanted = false,
               last_error = 'spot check: no two of three results agreed'
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_subtask_closed(s.task_id, true,
            format('subtask %s failed: no two of three results agreed (spot check)', s.subtask_id));
    END IF;
    RETURN 'no_quorum';
END $$;

-- Quarantine: the executor claims nothing more (403 quarantined), its leases and replicas are
-- released, the results it has held for checks are dropped (a subtask left with none runs again
-- from the queue), and every result it committed in a task not ended yet is revoked and runs
-- again. Returns the subtasks run again; NULL when it was quarantined already.
CREATE FUNCTION minion_quarantine_executor(p_executor uuid, p_reason text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    d record;
    n integer := 0;
BEGIN
    UPDATE executors SET quarantined_at = now(), quarantine_reason = p_reason, trusted = false
     WHERE id = p_executor AND quarantined_at IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM minion_end_executor_leases(p_executor, 'released', 'executor quarantined: ' || p_reason, false);
    FOR c IN SELECT k.task_id, k.subtask_id, k.lease_token FROM subtask_checks k
              WHERE k.executor_id = p_executor ORDER BY k.task_id, k.subtask_id LOOP
        PERFORM 1 FROM subtasks WHERE task_id = c.task_id AND subtask_id = c.subtask_id FOR UPDATE;
        DELETE FROM subtask_checks WHERE lease_token = c.lease_token;
        UPDATE subtask_attempts SET outcome = 'outvoted', error = 'executor quarantined'
         WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND lease_token = c.lease_token
           AND outcome = 'candidate';
        IF NOT EXISTS (SELECT 1 FROM subtask_checks WHERE task_id = c.task_id AND subtask_id = c.subtask_id) THEN
            DELETE FROM subtask_backups WHERE task_id = c.task_id AND subtask_id = c.subtask_id;
            UPDATE subtasks SET state = 'pending', lease_token = NULL, check_wanted = false
             WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND state = 'checking';
            n := n + 1;
        ELSE
            UPDATE subtasks s SET lease_token = k.lease_token
              FROM subtask_checks k
             WHERE s.task_id = c.task_id AND s.subtask_id = c.subtask_id
               AND k.task_id = s.task_id AND k.subtask_id = s.subtask_id AND s.lease_token = c.lease_token;
        END IF;
    END LOOP;
    -- Tasks that ended with its results: warned (one pass over the attempts; a quarantine is rare).
    INSERT INTO task_quarantine_warnings (task_id, executor_id, subtasks, reason)
    SELECT a.task_id, p_executor, count(*), p_reason
      FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
     WHERE a.executor_id = p_executor AND a.outcome = 'done' AND t.status IN ('completed', 'failed', 'cancelled')
     GROUP BY a.task_id
    ON CONFLICT (task_id, executor_id) DO UPDATE SET subtasks = excluded.subtasks, reason = excluded.reason;
    -- Its committed results in tasks that have not ended: revoked, run again (a reopened subtask
    -- counts as open again through this backend's progress slot, under the task row's lock, which a
    -- settle takes too: the task cannot end meanwhile).
    FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
               FROM tasks t
               JOIN subtask_attempts a ON a.task_id = t.id AND a.outcome = 'done' AND a.executor_id = p_executor
               JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
                              AND s.state = 'done' AND s.lease_token = a.lease_token
              WHERE t.status IN ('splitting', 'queued', 'running')
              ORDER BY s.task_id, s.subtask_id
                FOR UPDATE OF s LOOP
        PERFORM 1 FROM tasks WHERE id = d.task_id AND status IN ('splitting', 'queued', 'running') FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, output_key = NULL, result_key = NULL, result_sha256 = NULL,
               result_bytes = NULL, result_data = NULL, done_at = NULL, check_wanted = false,
               last_error = 'its result came from a quarantined executor'
         WHERE task_id = d.task_id AND subtask_id = d.subtask_id;
        UPDATE subtask_attempts SET outcome = 'revoked', error = 'executor quarantined: ' || p_reason
         WHERE task_id = d.task_id AND subtask_id = d.subtask_id AND lease_token = d.lease_token AND outcome = 'done';
        INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
        VALUES (d.task_id, pg_backend_pid(), -1, 0, -d.records)
        ON CONFLICT (task_id, slot) DO UPDATE
           SET closed = p.closed - 1, records_done = p.records_done - d.records;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- An admin lifts a quarantine: the executor starts again as new (its results checked until it earns
-- trust). Returns false when it was not quarantined.
CREATE FUNCTION minion_release_quarantine(p_executor uuid) RETURNS boolean LANGUAGE sql AS $$
    UPDATE executors SET quarantined_at = NULL, quarantine_reason = NULL, agreements = 0, disagreements = 0,
                         trusted = false
     WHERE id = p_executor AND quarantined_at IS NOT NULL
    RETURNING true
$$;

-- (Replaces 392's: a registration that changes the executor's fingerprints resets its trust.)
CREATE OR REPLACE FUNCTION minion_set_executor_fingerprints(p_executor uuid, p_fingerprints jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();  -- after this registration ended the executor's leases
    fresh jsonb;
    held jsonb;
    oldest_kept timestamptz;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_array(x.capability, x.model, x.fingerprint, x.precision, x.backend)
                              ORDER BY x.capability), '[]')
      INTO fresh
      FROM (SELECT DISTINCT ON (minion_capability(k, f.value ->> 'model'))
                   minion_capability(k, f.value ->> 'model') AS capability, f.value ->> 'model' AS model,
                   lower(f.value ->> 'fingerprint') AS fingerprint, f.value ->> 'precision' AS precision,
                   f.value ->> 'backend' AS backend
              FROM jsonb_array_elements(p_fingerprints) AS f(value)
              JOIN executors e ON e.id = p_executor
             CROSS JOIN unnest(e.kinds) AS k
             WHERE k <> 'sleep'
             ORDER BY minion_capability(k, f.value ->> 'model')) x;
    SELECT coalesce(jsonb_agg(jsonb_build_array(f.capability, f.model, f.fingerprint, f.precision, f.backend)
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
    INSERT INTO executor_fingerprints (executor_id, capability, model, fingerprint, precision, backend)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4 FROM jsonb_array_elements(fresh) AS r;
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
