-- A task's model pin (sql/390, 391) can no longer strand it, and the per-token executor cap (sql/360)
-- counts the executors a token uses, not every name it ever registered.
--
-- 1. An executor that reported no fingerprint for a model ('unknown:<id>': an older agent, or a model
--    it had not loaded when it registered, the usual case the first time a fleet serves a model)
--    pins nothing. It works on tasks not pinned yet and leaves them unpinned: before, its first
--    lease pinned the task to 'unknown:<id>', so the whole task ran on that one machine, and once
--    the agent restarted and reported the model's real fingerprint (or vanished) nobody matched the
--    pin again: the task waited forever. Its attempts read as 'unknown:<id>' in the history, so
--    they are shown as such (and are the first a replicated check should take).
-- 2. A pin its first lease set is given back while the task has nothing from it: no subtask done,
--    none leased (minion_unpin_idle_tasks, run by the watchdog's sweep). A machine that pinned a task
--    and then vanished, or a hostile executor that claimed one subtask of every new task and went
--    silent, strands nothing beyond the lease timeout. A task pinned by its submission
--    (`model@revision`) keeps its pin. A task with results keeps its pin: its other subtasks must
--    run on the same model, even when no machine of that fingerprint is online now.
-- 3. A token's executors are counted for MINIONS_MAX_EXECUTORS_PER_TOKEN while in use: registered
--    in the last 7 days or heard from in the last day. A fleet of short-lived hosts that name
--    themselves after their hostname (containers, CI runners) otherwise reached the cap for good,
--    with no way to remove names.

ALTER TABLE tasks ADD COLUMN fingerprint_from_revision boolean NOT NULL DEFAULT false;

-- (Replaces 390's: also records that the pin came with the submission, so it is never given back.)
CREATE OR REPLACE FUNCTION minion_task_model_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind <> 'sleep' AND strpos(NEW.model, '@') > 0 THEN
        NEW.fingerprint := lower(substring(NEW.model FROM '@([^@]*)$'));
        NEW.model := regexp_replace(NEW.model, '@[^@]*$', '');
        NEW.fingerprint_from_revision := true;
    END IF;
    RETURN NEW;
END $$;

-- (Replaces 391's: an executor with no reported fingerprint for the task's model pins nothing and
-- may take a task no one pinned; everything else is as before.)
CREATE OR REPLACE FUNCTION minion_claim_pin_tasks(p_executor uuid, p_task_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    now_pinned text;
    refused bigint[] := '{}';
BEGIN
    FOR t IN SELECT k.id, k.fingerprint AS pinned,
                    minion_executor_fingerprint(p_executor, minion_capability(k.kind, k.model)) AS mine
               FROM tasks k WHERE k.id = ANY (p_task_ids) AND k.kind <> 'sleep'
              ORDER BY k.id LOOP
        IF t.pinned IS NULL THEN
            CONTINUE WHEN t.mine LIKE 'unknown:%';
            UPDATE tasks SET fingerprint = t.mine WHERE id = t.id AND fingerprint IS NULL;
            IF NOT FOUND THEN
                SELECT k.fingerprint INTO now_pinned FROM tasks k WHERE k.id = t.id;
                IF now_pinned IS DISTINCT FROM t.mine THEN
                    refused := refused || t.id;
                END IF;
            END IF;
        ELSIF t.pinned <> t.mine THEN
            refused := refused || t.id;
        END IF;
    END LOOP;
    RETURN refused;
END $$;

-- Open tasks pinned by a lease (not by their submission) that hold nothing from it: no subtask in a
-- state other than pending, failed or cancelled. Their pin is cleared; the count is returned. The
-- pin is cleared under the task row's lock and only if still unused, so a claim pinning or leasing
-- meanwhile either commits first (then a subtask is leased: kept) or waits for this.
CREATE FUNCTION minion_unpin_idle_tasks() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.id FROM tasks k
              WHERE k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision
                AND k.status IN ('queued', 'running')
              ORDER BY k.id LOOP
        UPDATE tasks k SET fingerprint = NULL
         WHERE k.id = t.id AND k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision
           AND NOT EXISTS (SELECT 1 FROM subtasks s
                            WHERE s.task_id = t.id AND s.state NOT IN ('pending', 'failed', 'cancelled'));
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- (Replaces 360's: the executors counted against p_max_executors are those in use, registered in
-- the last 7 days or heard from in the last day; everything else is as before.)
CREATE OR REPLACE FUNCTION minion_register_executor_bounded(p_token_id bigint, p_team text, p_name text,
                                                            p_hardware jsonb, p_kinds text[], p_models text[],
                                                            p_preferences jsonb, p_max_executors integer,
                                                            p_per_minute integer, OUT verdict text,
                                                            OUT executor_id uuid, OUT retry_after_s integer)
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
    recent integer;
    oldest timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
        -- One new name of a token at a time, so two API processes cannot both squeeze under a bound.
        PERFORM pg_advisory_xact_lock(hashtextextended('minion_register:' || p_token_id::text, 0));
        -- Read again under the lock: a registration of this very name may have committed meanwhile.
        IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
            SELECT count(*) FILTER (WHERE e.registered_at > now() - interval '7 days'
                                       OR h.alive_at > now() - interval '1 day'),
                   count(*) FILTER (WHERE e.created_at > now() - interval '1 minute'),
                   min(e.created_at) FILTER (WHERE e.created_at > now() - interval '1 minute')
              INTO held, recent, oldest
              FROM executors e LEFT JOIN heartbeats h ON h.executor_id = e.id
             WHERE e.token_id = p_token_id;
            IF held >= p_max_executors THEN
                verdict := 'too_many_executors';
                RETURN;
            END IF;
            IF recent >= p_per_minute THEN
                verdict := 'too_many_registrations';
                retry_after_s := greatest(1, ceil(extract(epoch FROM oldest + interval '1 minute' - now())))::integer;
                RETURN;
            END IF;
        END IF;
    END IF;
    verdict := 'ok';
    executor_id := minion_register_executor(p_token_id, p_team, p_name, p_hardware, p_kinds, p_models,
                                            p_preferences);
END $$;
