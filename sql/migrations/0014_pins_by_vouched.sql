-- Only a vouched executor's first lease pins a task to its fingerprint (a volunteer's
-- made-up fingerprint pinned a task and committed random vectors no other executor could check).
CREATE OR REPLACE FUNCTION minion_claim_pin_tasks(p_executor uuid, p_task_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    now_pinned text;
    refused bigint[] := '{}';
    vouched boolean;
BEGIN
    FOR t IN SELECT k.id, k.fingerprint AS pinned,
                    minion_executor_fingerprint(p_executor, minion_capability(k.kind, k.model)) AS mine
               FROM tasks k WHERE k.id = ANY (p_task_ids) AND k.kind <> 'sleep'
              ORDER BY k.id LOOP
        IF t.pinned IS NULL THEN
            CONTINUE WHEN t.mine LIKE 'unknown:%';
            vouched := coalesce(vouched, minion_executor_vouched(p_executor));
            CONTINUE WHEN NOT vouched;
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
