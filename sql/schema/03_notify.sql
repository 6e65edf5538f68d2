-- NOTIFY channels. A notification is a wake-up, never the only record of work: every listener
-- also sweeps on start and after a reconnect.

-- tasks: one notification per new task (payload: task id); the splitter listens.
CREATE FUNCTION minion_notify_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tasks', NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify AFTER INSERT ON tasks
    FOR EACH ROW WHEN (NOT NEW.split_done) EXECUTE FUNCTION minion_notify_task();

-- subtasks: the API wakes long-polling claims. Statement-level for inserts, so a split batch of
-- thousands of rows is one notification per capability, not one per row.
CREATE FUNCTION minion_notify_subtasks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cap text;
BEGIN
    FOR cap IN SELECT DISTINCT capability FROM new_subtasks WHERE state = 'pending' LOOP
        PERFORM pg_notify('subtasks', cap);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER subtasks_notify_insert AFTER INSERT ON subtasks
    REFERENCING NEW TABLE AS new_subtasks
    FOR EACH STATEMENT EXECUTE FUNCTION minion_notify_subtasks_inserted();

-- A subtask that returns to the queue (released, failed for a retry, reclaimed). Row-level with a
-- WHEN clause, so claims and completions (the hot path) never run it; PostgreSQL folds identical
-- notifications of one transaction into one, so a mass requeue is one per capability.
CREATE FUNCTION minion_notify_subtask_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('subtasks', NEW.capability);
    RETURN NULL;
END $$;

CREATE TRIGGER subtasks_notify_requeue AFTER UPDATE OF state ON subtasks
    FOR EACH ROW WHEN (NEW.state = 'pending' AND OLD.state IS DISTINCT FROM 'pending')
    EXECUTE FUNCTION minion_notify_subtask_requeued();

-- heartbeats: the watchdog keeps deadlines only for executors that hold a lease.
-- Payload: '<executor_id> <live leases>'. Only heartbeats notify (UPDATE OF beat_at), never claims:
-- a NOTIFY serialises commits cluster-wide, which the claim path cannot afford.
CREATE FUNCTION minion_notify_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('heartbeats', NEW.executor_id::text || ' ' || minion_lease_count(NEW.executor_id)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER heartbeats_notify AFTER INSERT OR UPDATE OF beat_at ON heartbeats
    FOR EACH ROW EXECUTE FUNCTION minion_notify_heartbeat();
