-- Fair share between teams: each team's usage, whose turn it is, the negotiator that writes it,
-- starving tasks, and the claim that takes turns and keeps lease caps.

-- Each team's recent use of the pool: compute-seconds of its attempts as the usage account charges
-- them (minion_attempt_use: used and verification; lost is nobody's use),
-- decayed with a half-life (MINIONS_FAIR_SHARE_HALF_LIFE_S), as of usage_at. Folded from the
-- attempts by the negotiator (minion_fair_share_cycle), never written by a claim or a complete.
CREATE TABLE team_usage (
    team      text PRIMARY KEY,
    usage     double precision NOT NULL DEFAULT 0 CHECK (usage >= 0),
    usage_at  timestamptz NOT NULL DEFAULT now()
);

-- Whose turn it is: for each capability several teams have work pending for (or one team with a
-- lease cap), a round of turns in which each team has turns in proportion to its weight, the team
-- with the least weighted recent usage first. A claim takes the turn a shared sequence points at
-- (minion_fair_share_cursor), so nothing is written per claim. Rewritten by each negotiation.
CREATE TABLE fair_share_turns (
    capability  text NOT NULL,
    turn        integer NOT NULL CHECK (turn >= 0),
    turns       integer NOT NULL CHECK (turns > turn),
    team        text NOT NULL,
    PRIMARY KEY (capability, turn)
);

CREATE SEQUENCE minion_fair_share_cursor;

-- The negotiator's place in the attempts' history: attempts that ended up to folded_to are in
-- team_usage. One row.
CREATE TABLE fair_share_state (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    folded_to  timestamptz NOT NULL DEFAULT now()
);

-- Tasks with work pending and no lease in flight for longer than MINIONS_STARVATION_S while an
-- executor that could serve them was busy with other work (the negotiator notes and clears them;
-- shown in the task's warnings and on Grafana). since: its last result, or its submission.
CREATE TABLE task_starvation (
    task_id   bigint PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    since     timestamptz NOT NULL,
    noted_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX team_shares_capped ON team_shares (team) WHERE max_leases > 0;

INSERT INTO fair_share_state DEFAULT VALUES;

-- A team's usage as of now, decayed with half-life p_half_life_s from usage_at.
CREATE FUNCTION minion_decayed(p_usage double precision, p_at timestamptz, p_half_life_s double precision)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT p_usage * exp(ln(0.5) * greatest(extract(epoch FROM now() - p_at), 0) / p_half_life_s)
$$;

-- The (team, capability) pairs that have pending work: a skip scan of subtasks_pending_team, one
-- probe a pair.
CREATE FUNCTION minion_pending_pairs() RETURNS TABLE (team text, capability text) LANGUAGE sql STABLE AS $$
    WITH RECURSIVE pairs AS (
        (SELECT s.team::text AS team, s.capability FROM subtasks s WHERE s.state = 'pending'
          ORDER BY s.team, s.capability LIMIT 1)
        UNION ALL
        SELECT n.team, n.capability FROM pairs p, LATERAL (
            SELECT s.team::text AS team, s.capability FROM subtasks s
             WHERE s.state = 'pending' AND (s.team, s.capability) > (p.team::minion_name, p.capability)
             ORDER BY s.team, s.capability LIMIT 1) n
    )
    SELECT team, capability FROM pairs
$$;

-- One negotiation (see the header). p_round: turns in a round (more: finer shares); p_starving_s: how
-- long a task may wait with work pending and no lease while executors that could serve it are busy
-- elsewhere before it is noted as starving. Returns the capabilities given turns, or NULL when
-- another watchdog's negotiation holds the lock.
CREATE FUNCTION minion_fair_share_cycle(p_half_life_s double precision, p_round integer,
                                        p_starving_s double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    -- Attempts of transactions still committing are folded at the next run: their ended_at is their
    -- transaction's start, so a margin behind now() lets them land first.
    upto timestamptz := now() - interval '2 seconds';
    since timestamptz;
    cap text;
    pair_teams text[];
    pair_caps text[];
    teams text[];
    weights double precision[];
    current double precision[];
    total double precision;
    best integer;
    round_teams text[];
    given integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(-707102) THEN
        RETURN NULL;
    END IF;
    SELECT folded_to INTO since FROM fair_share_state;
    IF upto > since THEN
        INSERT INTO team_usage AS u (team, usage, usage_at)
        SELECT s.team::text,
               sum(minion_decayed(minion_attempt_seconds(a.seconds, a.started_at, a.ended_at), a.ended_at,
                                  p_half_life_s)), now()
          FROM subtask_attempts a JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
         WHERE a.ended_at > since AND a.ended_at <= upto
           AND minion_attempt_use(a.outcome) IN ('used', 'verification')  -- as the account charges it
         GROUP BY s.team
        ON CONFLICT (team) DO UPDATE
           SET usage = minion_decayed(u.usage, u.usage_at, p_half_life_s) + excluded.usage, usage_at = now();
        UPDATE fair_share_state SET folded_to = upto;
    END IF;

    SELECT coalesce(array_agg(p.team), '{}'), coalesce(array_agg(p.capability), '{}')
      INTO pair_teams, pair_caps FROM minion_pending_pairs() p;
    DELETE FROM fair_share_turns;
    FOR cap IN SELECT p.capability FROM unnest(pair_teams, pair_caps) AS p(team, capability)
                 LEFT JOIN team_shares c ON c.team = p.team
                GROUP BY p.capability
               HAVING count(*) > 1 OR bool_or(c.max_leases > 0)
                ORDER BY 1 LOOP
        SELECT array_agg(x.team ORDER BY x.key, x.team), array_agg(x.weight ORDER BY x.key, x.team)
          INTO teams, weights
          FROM (SELECT p.team, coalesce(c.weight, 1) AS weight,
                       minion_decayed(coalesce(u.usage, 0), coalesce(u.usage_at, now()), p_half_life_s)
                       / coalesce(c.weight, 1) AS key
                  FROM unnest(pair_teams, pair_caps) AS p(team, capability)
                  LEFT JOIN team_usage u ON u.team = p.team
                  LEFT JOIN team_shares c ON c.team = p.team
                 WHERE p.capability = cap) x;
        total := (SELECT sum(w) FROM unnest(weights) AS w);
        current := array_fill(0::double precision, ARRAY[cardinality(teams)]);
        round_teams := '{}';
        -- Smooth weighted round robin: each turn every team gains its weight, the richest takes the
        -- turn (the earlier in usage order on a tie) and pays the total.
        FOR turn IN 0 .. p_round - 1 LOOP
            best := 1;
            FOR i IN 1 .. cardinality(teams) LOOP
                current[i] := current[i] + weights[i];
                IF current[i] > current[best] THEN
                    best := i;
                END IF;
            END LOOP;
            current[best] := current[best] - total;
            round_teams := round_teams || teams[best];
        END LOOP;
        INSERT INTO fair_share_turns (capability, turn, turns, team)
        SELECT cap, r.n - 1, p_round, r.team FROM unnest(round_teams) WITH ORDINALITY AS r(team, n);
        given := given + 1;
    END LOOP;

    -- A capped team frees room as its leases end, which nothing announces: wake the claims waiting
    -- for its capabilities while it has room and work.
    FOR cap IN SELECT DISTINCT p.capability FROM unnest(pair_teams, pair_caps) AS p(team, capability)
                 JOIN team_shares c ON c.team = p.team
                WHERE c.max_leases > 0
                  AND c.max_leases > minion_team_leases_in_flight(c.team) LOOP
        PERFORM pg_notify('subtasks', cap);
    END LOOP;

    -- Starvation: an open task with work pending and nothing in flight, waiting longer than
    -- p_starving_s since its last result (or its submission), while an executor that could serve
    -- it (online, of its capability, its team or shared, not quarantined) holds other leases.
    DELETE FROM task_starvation w
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = w.task_id AND s.state = 'pending')
        OR EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = w.task_id AND s.state IN ('leased', 'checking'));
    INSERT INTO task_starvation (task_id, since)
    SELECT t.id, x.since
      FROM tasks t
      JOIN (SELECT DISTINCT p.team FROM unnest(pair_teams) AS p(team)) pt ON pt.team = t.team
      CROSS JOIN LATERAL (
          SELECT greatest(t.created_at, (SELECT a.ended_at FROM subtask_attempts a
                                          WHERE a.task_id = t.id AND a.outcome = 'done'
                                          ORDER BY a.ended_at DESC LIMIT 1)) AS since) x
     WHERE t.split_done AND t.status IN ('splitting', 'queued', 'running')
       AND NOT EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = t.id AND s.state IN ('leased', 'checking'))
       AND EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = t.id AND s.state = 'pending')
       AND x.since < now() - make_interval(secs => p_starving_s)
       AND EXISTS (SELECT 1 FROM executors e
                    WHERE e.status = 'online' AND e.quarantined_at IS NULL
                      AND minion_capability(t.kind, t.model) = ANY (e.capabilities)
                      AND (e.team IS NULL OR e.team = t.team)
                      AND EXISTS (SELECT 1 FROM subtasks l WHERE l.lease_executor = e.id AND l.state = 'leased'))
    ON CONFLICT (task_id) DO NOTHING;
    RETURN given;
END $$;

-- The leases team p_team holds now: its open tasks' subtasks in flight (leased or checking).
CREATE FUNCTION minion_team_leases_in_flight(p_team text) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM tasks t JOIN subtasks s ON s.task_id = t.id
     WHERE t.team = p_team AND NOT (t.status IN ('completed', 'failed', 'cancelled'))
       AND s.state IN ('leased', 'checking')
$$;

-- The leases team p_team may still take now under its lease cap (team_shares.max_leases): the cap
-- less its leases in flight (leased or checking). Takes the team's cap lock until the transaction
-- ends, so two claims cannot both fill the last room. Only claims of teams with a cap call it.
CREATE FUNCTION minion_team_lease_room(p_team text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    cap integer;
BEGIN
    SELECT max_leases INTO cap FROM team_shares WHERE team = p_team;
    IF coalesce(cap, 0) <= 0 THEN
        RETURN 2147483647;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('minion_team_leases:' || p_team, 0));
    RETURN cap - minion_team_leases_in_flight(p_team);
END $$;

-- The whole queue may now leave teams out (p_excluded): a new signature.
DROP FUNCTION minion_claim_some_in(uuid, text[], text, text, text, integer, integer);

-- Up to p_n pending subtasks in one filter (minion_claim_in's filters: the whole queue, a team, a
-- project or a task), in claim order, leased to p_executor. p_first: how many the batch holds already
-- (their leased_at come first, a microsecond apart, so the attempts' history shows the claim order).
-- An executor of one capability (the common case: one kind and model) gets its p_n in one probe of
-- the queue index. With several, it takes one subtask at a time, the best head among them, as
-- minion_claim_in does: probing each capability for p_n at once would keep up to p_n rows of every
-- capability locked, untaken, until the claim commits, hidden from the claimers that serve only that
-- capability (who would wait out their long poll with work pending). The project-or-task lookup is two
-- gated branches, which a generic plan can resolve. The probes pass over tasks pinned to another
-- fingerprint, and the rows found are taken only once their tasks are pinned to this executor's, with
-- a second probe after a lost pin race.
-- p_excluded: teams the whole queue passes over (those at their lease cap; a team's own probe never
-- gets them). Returns the new lease tokens, in claim order ('{}' when nothing in the filter is pending).
CREATE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                                p_task_name text, p_n integer, p_first integer,
                                                p_excluded text[] DEFAULT '{}')
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    caps text[] := ARRAY(SELECT DISTINCT c FROM unnest(p_caps) AS c);
    fp text;  -- the executor's fingerprint for caps[1] (the queue's and a team's probe)
    task_ids bigint[];
    subtask_ids integer[];
    more_tasks bigint[];
    more_subtasks integer[];
    refused bigint[];
    to_pin bigint[];  -- the tasks of the rows found that have a model (sleep is never pinned)
    t record;
    cap text;
    tok uuid;
    toks uuid[] := '{}';
    taken uuid[];
BEGIN
    IF p_n < 1 THEN
        RETURN '{}';
    END IF;
    IF p_team IS NULL AND cardinality(p_excluded) > 0 AND cardinality(caps) > 1 THEN
        -- Teams left out of the whole queue (at their lease cap): one capability at a time, each
        -- probe with the exclusion (rare: only while some team has a cap).
        FOREACH cap IN ARRAY caps LOOP
            EXIT WHEN cardinality(toks) >= p_n;
            toks := toks || minion_claim_some_in(p_executor, ARRAY[cap], NULL, NULL, NULL, p_n - cardinality(toks),
                                                 p_first + cardinality(toks), p_excluded);
        END LOOP;
        RETURN toks;
    END IF;
    IF p_project IS NULL AND cardinality(caps) <> 1 THEN
        FOR k IN 1 .. p_n LOOP
            tok := minion_claim_in(p_executor, caps, p_team, NULL, NULL);
            EXIT WHEN tok IS NULL;
            toks := toks || tok;
        END LOOP;
        IF p_first > 0 OR cardinality(toks) > 1 THEN  -- minion_claim_in stamps now(): shifted here
            UPDATE subtasks s
               SET leased_at = s.leased_at + (p_first + array_position(toks, s.lease_token) - 1) * interval '1 microsecond'
             WHERE s.lease_token = ANY (toks);
        END IF;
        RETURN toks;
    END IF;
    IF p_project IS NULL THEN
        fp := minion_executor_fingerprint(p_executor, caps[1]);
    END IF;
    -- A second probe only after a lost pin race.
    FOR pass IN 1 .. 2 LOOP
        task_ids := '{}';
        subtask_ids := '{}';
        refused := '{}';
        to_pin := '{}';
        -- The whole queue and a team's queue are two statements, not one with `p_team IS NULL OR`: each
        -- keeps its own partial index (subtasks_pending_queue, subtasks_pending_team) in a cached plan.
        IF p_project IS NULL AND p_team IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                       AND NOT (s.team::text = ANY (p_excluded))
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSIF p_project IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSE
            -- A project or a task: its few open task rows in claim order, each an O(log n) probe of the
            -- queue index for what is still wanted (as minion_claim_in). One capability per task, so
            -- nothing is locked that is not taken.
            -- A whole project and a task by name are two branches, not one `p_task_name IS NULL OR`
            -- condition: in one generic plan (above) that condition could not use the task's name, and
            -- every claim would read all of the project's tasks. Only one branch runs: the first is gated
            -- on the name being NULL, the second finds nothing when it is.
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint FROM tasks
                      WHERE p_task_name IS NULL AND team = p_team AND project = p_project
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                     UNION ALL
                     SELECT id, priority, minion_capability(kind, model), fingerprint FROM tasks
                      WHERE team = p_team AND project = p_project AND name = p_task_name
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY 2 DESC, 1 LOOP
                EXIT WHEN cardinality(task_ids) + cardinality(toks) >= p_n;
                CONTINUE WHEN NOT (t.cap = ANY (caps));
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
                SELECT coalesce(array_agg(q.task_id ORDER BY q.subtask_id), '{}'),
                       coalesce(array_agg(q.subtask_id ORDER BY q.subtask_id), '{}')
                  INTO more_tasks, more_subtasks
                  FROM (SELECT s.task_id, s.subtask_id FROM subtasks s
                         WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority
                           AND s.task_id = t.id
                         ORDER BY s.subtask_id LIMIT p_n - cardinality(task_ids) - cardinality(toks)
                           FOR UPDATE SKIP LOCKED) q;
                task_ids := task_ids || more_tasks;
                subtask_ids := subtask_ids || more_subtasks;
                IF t.cap <> 'sleep:*' AND cardinality(more_tasks) > 0 THEN
                    to_pin := to_pin || t.id;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN cardinality(task_ids) = 0;

        IF fp IS NOT NULL THEN
            to_pin := ARRAY(SELECT DISTINCT x FROM unnest(task_ids) AS x);
        END IF;
        IF cardinality(to_pin) > 0 THEN
            refused := minion_claim_pin_tasks(p_executor, to_pin);
            IF cardinality(refused) > 0 THEN  -- its rows stay locked until the claim commits, untaken
                SELECT coalesce(array_agg(w.task_id ORDER BY w.n), '{}'),
                       coalesce(array_agg(w.subtask_id ORDER BY w.n), '{}')
                  INTO task_ids, subtask_ids
                  FROM unnest(task_ids, subtask_ids) WITH ORDINALITY AS w(task_id, subtask_id, n)
                 WHERE NOT (w.task_id = ANY (refused));
            END IF;
        END IF;

        IF cardinality(task_ids) > 0 THEN
            taken := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(task_ids)));
            INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
            SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, w.tok
              FROM unnest(task_ids, subtask_ids, taken) AS w(task_id, subtask_id, tok)
              JOIN subtasks s ON s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            UPDATE subtasks s
               SET state = 'leased', lease_token = w.tok, lease_executor = p_executor,
                   leased_at = now() + (p_first + cardinality(toks) + w.n - 1) * interval '1 microsecond',
                   attempts = s.attempts + 1
              FROM unnest(task_ids, subtask_ids, taken) WITH ORDINALITY AS w(task_id, subtask_id, tok, n)
             WHERE s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            toks := toks || taken;
        END IF;
        EXIT WHEN cardinality(refused) = 0 OR cardinality(toks) >= p_n;
    END LOOP;
    RETURN toks;
END $$;

-- The claim of up to p_max subtasks. Rows: one per lease won (verdict 'leased'); else one row whose
-- verdict says why none: 'empty' (nothing fits now: `capabilities` says what to wait for),
-- 'not_found', 'not_your_executor', 'deregistered', 'quarantined'. `owner`: the API token of the
-- executor (for later fencing of who may complete). Never waits: what is pending now.
--
-- In order: a spot check's replica wanted of the executor's capabilities (one at most a claim,
-- answered as a lease like any: `backup` false); each preference tier, then the team whose turn it
-- is when several teams share the executor's queue (fair_share_turns, teams.sql: no row is written
-- per claim, a shared sequence picks the turn), then the whole queue, asked once for what is still
-- wanted (minion_claim_some_in; a team with a lease cap only up to its room, never from the whole
-- queue); with nothing pending and p_backup_factor > 0,
-- one backup of a straggler. The leases won that are chosen for a check are marked (check_token) in
-- one UPDATE, only when the share may choose any: all of an executor not trusted, else each with its
-- team's share (minions.spot_check_team_shares) or minions.spot_check_share; only checkable ones
-- (minion_checkable, or a sampled completion with proofs: minion_executor_proves) that another
-- executor could replicate now (minion_replica_executors).
--
-- Tasks of the leases won are read in the lookup that lists them, and only those still 'splitting' or
-- 'queued' are marked running (an UPDATE that changes nothing still opens the table's indexes and
-- triggers); the answer's rows are found by the lease-token index (every won token is a lease this
-- transaction holds locked).
--
-- Plans: PostgreSQL plans a PL/pgSQL statement with parameters at each of its first five runs, then
-- keeps a generic plan unless its estimate is worse than the custom plans' average. The claim's
-- statements over arrays and limits are estimated at 10 elements or a tenth of the queue without
-- their values, and at 1 with them, so the generic estimate always lost and five of them were planned
-- again at every claim (~0.9 ms a claim). force_generic_plan keeps one plan per statement and
-- connection, in the custom plans' shape. A plan made while subtasks is small (a fresh database)
-- would scan the table where an index finds the row, and keep that shape until the statistics change;
-- every statement here is a lookup by key or an ordered probe of the queue's indexes, so
-- enable_seqscan = off holds for the whole call (the functions it calls included).
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
    fair text[] := '{}';  -- the teams whose turn it is (fair_share_turns), for the executor's capabilities
    capped text[];        -- teams with a lease cap: never taken from the whole queue
    rooms integer[];      -- the leases each of them may still take now (NULL: not read yet)
    k integer;
    n integer;
    got uuid[];
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
    IF ex.team IS NULL AND EXISTS (SELECT 1 FROM fair_share_turns f WHERE f.capability = ANY (ex.capabilities)) THEN
        k := nextval('minion_fair_share_cursor') % 2147483647;
        fair := ARRAY(SELECT f.team FROM fair_share_turns f
                       WHERE f.capability = ANY (ex.capabilities) AND f.turn = k % f.turns
                       ORDER BY f.capability);
    END IF;
    capped := ARRAY(SELECT c.team::text FROM team_shares c WHERE c.max_leases > 0 ORDER BY c.team);
    rooms := array_fill(NULL::integer, ARRAY[cardinality(capped)]);  -- each read when first needed
    -- Preferences first (an owner's choice beats fairness), then the team whose turn it is, then the
    -- whole queue (the executor's team's, if it has one). A team with a lease cap takes at most its room.
    FOR pref IN (SELECT p.position, p.team::text AS team, p.project, p.task_name FROM executor_preferences p
                  WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 UNION ALL SELECT 2147483000 + f.n, f.team, NULL, NULL FROM unnest(fair) WITH ORDINALITY AS f(team, n)
                 UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                 ORDER BY 1 LOOP
        EXIT WHEN cardinality(won) >= wanted;
        n := wanted - cardinality(won);
        k := array_position(capped, pref.team);
        IF k IS NOT NULL THEN
            rooms[k] := coalesce(rooms[k], minion_team_lease_room(pref.team));
            n := least(n, rooms[k]);
            CONTINUE WHEN n <= 0;
        END IF;
        got := minion_claim_some_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name, n,
                                    cardinality(won), CASE WHEN pref.team IS NULL THEN capped ELSE '{}' END);
        IF k IS NOT NULL THEN
            rooms[k] := rooms[k] - cardinality(got);
        END IF;
        won := won || got;
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

-- A replica for p_executor: a checking subtask of its capabilities (its team's, if it has one) with
-- no replica running, that it may replicate (minion_replica_allowed), of its fingerprint (or of a
-- task not pinned: one run so far by executors that report none). Returns the replica's
-- token (a backup row), or NULL. A replica pins nothing.
CREATE OR REPLACE FUNCTION minion_claim_replica(p_executor uuid, p_token_id bigint, p_caps text[], p_team text)
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

-- Tasks noted as starving (minion_fair_share_cycle): waiting with work pending while executors that
-- could serve them run other work. The alert rule minions-starving reads it.
CREATE VIEW grafana_starving_tasks AS
SELECT t.team::text AS team, t.project::text AS project, t.name::text AS task_name, t.id AS task_id,
       minion_capability(t.kind, t.model) AS capability, w.since,
       extract(epoch FROM now() - w.since)::float8 AS waiting_s
  FROM task_starvation w JOIN tasks t ON t.id = w.task_id;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        GRANT SELECT ON grafana_starving_tasks TO minions_grafana;
    END IF;
END $$;
