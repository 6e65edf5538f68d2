-- Review fixes: a stale-check sweep never carries one group's lone candidate into the next group;
-- a dispute on an overdue candidate waits its own wait; only a vouched executor's report keeps a
-- model pin; the age cap reads a task's typical run once (not per lease) and the kind's fallback
-- looks at the latest 1,000 attempts; the watchdog blames hangers after its loop, executors locked
-- in id order (a vote's lock order); verify ties a vouched agreement to the committed attempt.
DROP FUNCTION minion_lease_age_cap(bigint, text, integer, double precision, double precision, text);

CREATE FUNCTION minion_lease_age_cap(p_per_record_s double precision, p_kind text, p_records integer,
                                     p_factor double precision, p_floor_s double precision, p_ceilings text)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(c.ceiling, greatest(p_floor_s, coalesce(p_factor * p_per_record_s * greatest(p_records, 1),
                                                         c.ceiling)))
      FROM (SELECT coalesce(minion_pair_value(p_kind, p_ceilings),
                            minion_pair_value('*', p_ceilings), 3600) AS ceiling) c
$$;

CREATE OR REPLACE FUNCTION minion_typical_run_s(p_task_id bigint, p_records integer) RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
DECLARE
    per double precision;
    n bigint;
BEGIN
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.per), count(*) INTO per, n
      FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) / greatest(coalesce(a.records, 1), 1) AS per
              FROM subtask_attempts a
             WHERE a.task_id = p_task_id AND a.outcome = 'done'
             ORDER BY a.ended_at DESC LIMIT 1000) x;
    IF n < 3 THEN
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.per), count(*) INTO per, n
          FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) / greatest(coalesce(a.records, 1), 1) AS per
                  FROM (SELECT r.task_id, r.ended_at, r.started_at, r.records FROM subtask_attempts r
                         WHERE r.outcome = 'done' ORDER BY r.ended_at DESC LIMIT 1000) a
                  JOIN tasks k ON k.id = a.task_id
                  JOIN tasks me ON me.id = p_task_id AND me.kind = k.kind AND me.model = k.model) x;
    END IF;
    RETURN CASE WHEN n >= 3 THEN per * greatest(p_records, 1) END;
END $$;

CREATE OR REPLACE FUNCTION minion_end_overage_leases(p_factor double precision, p_floor_s double precision, p_ceilings text,
                                          p_quarantine_after integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    o record;
    n integer := 0;
    why text;
    blamed uuid[] := '{}';
BEGIN
    -- Only what is older than the floor is looked at (few rows, by the leased_at index): a cap is never
    -- less. A task's typical run is read once, whatever its leases.
    FOR o IN WITH held AS (
                 SELECT s.lease_token AS tok, s.lease_executor AS executor_id, s.leased_at, s.task_id, s.subtask_id,
                        s.records
                   FROM subtasks s
                  WHERE s.state = 'leased' AND s.leased_at < now() - make_interval(secs => p_floor_s)
                 UNION ALL
                 SELECT b.lease_token, b.executor_id, b.leased_at, b.task_id, b.subtask_id, s.records
                   FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
                  WHERE b.leased_at < now() - make_interval(secs => p_floor_s)
             ), typical AS (
                 SELECT t.id, t.kind, minion_typical_run_s(t.id, 1) AS per_record
                   FROM tasks t WHERE t.id IN (SELECT DISTINCT task_id FROM held)
             )
             SELECT h.*, c.cap FROM held h JOIN typical y ON y.id = h.task_id
             CROSS JOIN LATERAL (SELECT minion_lease_age_cap(y.per_record, y.kind, h.records, p_factor, p_floor_s,
                                                             p_ceilings) AS cap) c
              WHERE h.leased_at < now() - make_interval(secs => least(c.cap, 1e9))
              ORDER BY h.task_id, h.subtask_id LOOP
        why := format('held past its age cap (%s s) without a result', round(o.cap::numeric));
        IF minion_end_lease(o.tok, 'lost', why, false, true) <> 'ok' THEN
            CONTINUE;  -- ended meanwhile
        END IF;
        n := n + 1;
        IF NOT minion_executor_vouched(o.executor_id) THEN
            blamed := blamed || o.executor_id;
        END IF;
    END LOOP;
    -- The executors last, locked in id order: a vote locks its subtask, then its voters; locking one
    -- here between two subtasks would be the other order.
    PERFORM 1 FROM executors WHERE id = ANY (blamed) ORDER BY id FOR UPDATE;
    FOR o IN SELECT x.id, count(*) AS times FROM unnest(blamed) AS x(id) GROUP BY x.id ORDER BY x.id LOOP
        UPDATE executors SET disagreements = disagreements + o.times, agreements = 0, trusted = false
         WHERE id = o.id;
        UPDATE executors
           SET quarantined_at = now(), quarantine_settled = false,
               quarantine_reason = format('let %s leases or replicas pass their age cap or lost quorums (last: %s)',
                                          disagreements, why)
         WHERE id = o.id AND quarantined_at IS NULL AND disagreements >= p_quarantine_after;
    END LOOP;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION minion_release_orphan_pins(p_after_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    t record;
    d record;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.id, k.fingerprint FROM tasks k
              WHERE k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision AND k.kind <> 'sleep'
                AND k.status IN ('queued', 'running')
                AND EXISTS (SELECT 1 FROM subtasks s WHERE s.task_id = k.id AND s.state IN ('pending', 'checking'))
                AND NOT EXISTS (SELECT 1 FROM executor_fingerprints f
                                  JOIN executors e ON e.id = f.executor_id
                                  JOIN api_tokens a ON a.id = e.token_id AND a.trusted  -- only a vouched one pins
                                  JOIN heartbeats h ON h.executor_id = f.executor_id
                                 WHERE f.capability = minion_capability(k.kind, k.model)
                                   AND f.fingerprint = k.fingerprint AND e.quarantined_at IS NULL
                                   AND h.alive_at > now() - make_interval(secs => p_after_s))
              ORDER BY k.id LOOP
        -- Subtasks first, then the task: the lock order of every function that ends an attempt.
        FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
                   FROM subtasks s JOIN subtask_attempts a ON a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                                                         AND a.lease_token = s.lease_token
                  WHERE s.task_id = t.id AND s.state = 'done' AND a.outcome IN ('done', 'unchecked')
                    AND NOT minion_executor_vouched(a.executor_id)
                  ORDER BY s.subtask_id
                    FOR UPDATE OF s LOOP
            PERFORM 1 FROM tasks WHERE id = t.id AND status IN ('queued', 'running') FOR UPDATE;
            EXIT WHEN NOT FOUND;
            PERFORM minion_revoke_result(d.task_id, d.subtask_id, d.records, d.lease_token,
                                         'its result was a volunteer''s under a model pin released',
                                         format('model pin %s released: no executor reported it for %s s',
                                                t.fingerprint, p_after_s));
        END LOOP;
        UPDATE tasks SET fingerprint = NULL, pin_released_at = now(), pin_released_fingerprint = t.fingerprint
         WHERE id = t.id AND fingerprint = t.fingerprint AND status IN ('queued', 'running');
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION minion_settle_stale_checks(p_wait_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION minion_verify_task(p_task_id bigint, p_name text, p_all boolean, p_created_by bigint,
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
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts, input_uri,
                       request_hash, created_by, placement)
    VALUES (t.team, t.project, p_name, t.kind,
            CASE WHEN t.fingerprint_from_revision THEN t.model || '@' || t.fingerprint ELSE t.model END,
            t.params, t.priority, t.subtask_size, t.max_attempts, t.input_uri, 'verify:' || t.request_hash,
            p_created_by, 'trusted')
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO new_id;
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

