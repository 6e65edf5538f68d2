-- Last, so that it covers every view the files before it made: Grafana's role and its grants.

-- The read-only role Grafana logs in as. Roles are cluster-wide (several databases may share one
-- server, and may migrate at once), so it is created only if missing, and a concurrent creation is
-- not an error. It logs in but has no password: set one (ALTER ROLE minions_grafana PASSWORD ...)
-- where Postgres asks for one. A migrating user that may not create roles leaves it to an operator
-- (a warning, not a failure); the grants below then wait for an operator to create it and run them again.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        BEGIN
            CREATE ROLE minions_grafana LOGIN;
            ALTER ROLE minions_grafana SET default_transaction_read_only = on;
            ALTER ROLE minions_grafana SET statement_timeout = '30s';
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it first
            WHEN insufficient_privilege THEN
                RAISE WARNING 'cannot create role minions_grafana (%); create it, then grant it '
                              'SELECT on the grafana_* views', SQLERRM;
        END;
    END IF;
END $$;

-- The grants: SELECT on the grafana_* views and nothing else. Views read the tables with their
-- owner's rights, so the role needs no table privilege at all.
DO $$
DECLARE
    v record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM PUBLIC, minions_grafana', current_schema());
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM PUBLIC, minions_grafana',
                   current_schema());
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO minions_grafana', current_schema());
    FOR v IN SELECT c.relname FROM pg_class c
              WHERE c.relkind = 'v' AND c.relnamespace = current_schema()::regnamespace
                AND c.relname LIKE 'grafana\_%'
              ORDER BY c.relname LOOP
        EXECUTE format('GRANT SELECT ON %I TO minions_grafana', v.relname);
    END LOOP;
    -- Functions the views call run as the querying role (EXECUTE is PUBLIC's by default; granted
    -- here explicitly so a REVOKE FROM PUBLIC elsewhere cannot break the dashboards).
    GRANT EXECUTE ON FUNCTION minion_executor_status(text, integer, timestamptz, double precision),
                              minion_error_reason(text)
       TO minions_grafana;
END $$;
