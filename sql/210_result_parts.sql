-- Compacted results (issue 14, item 6). A completed task's committed outputs, read one object per
-- subtask, are copied in subtask order into a few large result parts (`parts/<task>/<part>-<nonce>.jsonl`)
-- whose SHA-256 and size are recorded here, so parts still serve exactly the verified bytes and a
-- client can fetch them by presigned GET straight from the store.
--
-- Crash safety: a part is written first and recorded after (minion_record_result_part); a part written
-- but never recorded is garbage (minion_gc_parts). A compaction resumes after the last recorded part.
-- Only once every subtask is covered (minion_finish_compaction) are the parts served and the
-- per-subtask objects garbage; until then they are what results are read from.

CREATE TABLE result_parts (
    task_id       bigint  NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    part          integer NOT NULL CHECK (part >= 0),
    first_subtask integer NOT NULL,
    last_subtask  integer NOT NULL CHECK (last_subtask >= first_subtask),
    key           text    NOT NULL UNIQUE,
    sha256        bytea   NOT NULL CHECK (length(sha256) = 32),
    bytes         bigint  NOT NULL CHECK (bytes >= 0),
    records       bigint  NOT NULL CHECK (records >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, part)
);

-- A task whose parts cover all its subtasks: from then on results are served from its parts.
CREATE TABLE compacted_tasks (
    task_id      bigint PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    parts        integer NOT NULL,
    bytes        bigint  NOT NULL,
    compacted_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION minion_task_compacted(p_task_id bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM compacted_tasks WHERE task_id = p_task_id)
$$;

-- Completed tasks not yet compacted, oldest end first. Failed and cancelled tasks are not compacted:
-- their results (with an error line per lost record) keep being read per subtask.
CREATE FUNCTION minion_tasks_to_compact(p_limit integer) RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    SELECT t.id FROM tasks t
     WHERE t.status = 'completed'
       AND NOT EXISTS (SELECT 1 FROM compacted_tasks c WHERE c.task_id = t.id)
     ORDER BY t.finished_at, t.id
     LIMIT p_limit
$$;

-- Record one written part: true, or false when it is not the next part of a completed, uncompacted
-- task (another compactor recorded this part first, the task was deleted): the caller's object is
-- then garbage. Parts follow each other without gaps, in subtask order.
CREATE FUNCTION minion_record_result_part(p_task_id bigint, p_part integer, p_first integer, p_last integer,
                                          p_key text, p_sha256 bytea, p_bytes bigint, p_records bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    prev result_parts;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status = 'completed' FOR SHARE;
    IF NOT FOUND OR minion_task_compacted(p_task_id) THEN
        RETURN false;
    END IF;
    SELECT * INTO prev FROM result_parts WHERE task_id = p_task_id ORDER BY part DESC LIMIT 1;
    IF p_part <> coalesce(prev.part + 1, 0) OR p_first <= coalesce(prev.last_subtask, -1) THEN
        RETURN false;
    END IF;
    INSERT INTO result_parts (task_id, part, first_subtask, last_subtask, key, sha256, bytes, records)
    VALUES (p_task_id, p_part, p_first, p_last, p_key, p_sha256, p_bytes, p_records)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

-- Mark a task compacted once its parts cover every subtask: true when it is (now or already).
CREATE FUNCTION minion_finish_compaction(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    covered integer;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status = 'completed' FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF minion_task_compacted(p_task_id) THEN
        RETURN true;
    END IF;
    SELECT coalesce(max(last_subtask), -1) INTO covered FROM result_parts WHERE task_id = p_task_id;
    IF EXISTS (SELECT 1 FROM subtasks WHERE task_id = p_task_id AND (subtask_id > covered OR state <> 'done')) THEN
        RETURN false;
    END IF;
    INSERT INTO compacted_tasks (task_id, parts, bytes)
    SELECT p_task_id, count(*), coalesce(sum(bytes), 0) FROM result_parts WHERE task_id = p_task_id
    ON CONFLICT DO NOTHING;
    RETURN true;
END $$;

-- Garbage among part keys: a part no row records (written by a compaction that crashed or lost a
-- race before recording it, or of a deleted task). The collector's grace period covers the moment
-- between a part's write and its record.
CREATE FUNCTION minion_gc_parts(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT k FROM unnest(p_keys) AS k
     WHERE k ~ '^parts/[0-9]{1,18}/[0-9]{1,9}-[0-9a-f]{16}\.jsonl$'
       AND NOT EXISTS (SELECT 1 FROM result_parts p WHERE p.key = k)
$$;

-- Garbage among per-subtask keys (`outputs/<task>/…`, `results/<task>/…`) once their task is
-- compacted: a compacted task is completed (no live lease) and its committed bytes are in its recorded
-- parts, which is what results are read from. The collector asks this beside minion_gc_outputs (080)
-- and minion_gc_results (085), which judge the keys of tasks not compacted.
CREATE FUNCTION minion_gc_compacted(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT k FROM unnest(p_keys) AS k,
                  regexp_match(k, '^(outputs|results)/([0-9]{1,18})/[0-9]{1,9}/[0-9A-Za-z._-]+\.jsonl$') AS m
     WHERE m IS NOT NULL AND minion_task_compacted(m[2]::bigint)
$$;
