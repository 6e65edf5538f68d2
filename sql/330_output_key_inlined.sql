-- The output key is computed in the statement that asks for it, not by a function call (issue 11).
--
-- minion_output_key was declared IMMUTABLE over format(), which PostgreSQL marks STABLE (it may call
-- any type's output function). The planner inlines a SQL function only when its body is as immutable
-- as the function says, so every call went through the SQL-function executor: set up, run
-- `SELECT format(...)` as a statement of its own, torn down. A claim and a complete each made one
-- such call per lease (pg_stat_statements in bench/drain.py's sql-new and http-inline1 arms: two
-- `SELECT format(...)` statements per subtask, besides the SQL-function machinery around them).
--
-- The same key from text concatenation and casts whose output functions (int4, int8, uuid) are
-- immutable: the planner folds the body into the calling statement. The layout is unchanged,
-- `outputs/<task>/<subtask>/<attempt>-<token>.jsonl` (sql/070 reads the token back from it), and so is
-- every key already written; tests/test_sql_leases.py compares the two forms.

CREATE OR REPLACE FUNCTION minion_output_key(p_task_id bigint, p_subtask_id integer, p_attempt integer, p_token uuid)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'outputs/' || p_task_id::text || '/' || p_subtask_id::text || '/' || p_attempt::text || '-'
           || p_token::text || '.jsonl'
$$;
