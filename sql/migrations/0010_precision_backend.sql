-- The engine each executor runs each model on (torch or MLX; agents before the choice existed ran
-- torch), as a last column of grafana_executor_precision: the agent reports it in each precision
-- entry of its registration.
CREATE OR REPLACE VIEW grafana_executor_precision AS
SELECT ge.team,
       ge.executor_id,
       ge.executor,
       ge.device,
       ge.chip,
       ge.status,
       ge.online,
       p.value ->> 'model' AS model,
       coalesce(p.value ->> 'precision', 'unknown') AS precision,
       CASE WHEN jsonb_typeof(p.value -> 'cosine') = 'number'
            THEN (p.value ->> 'cosine')::double precision END AS cosine,
       coalesce(p.value ->> 'setting', 'auto') AS setting,
       coalesce(p.value ->> 'backend', 'torch') AS backend
  FROM grafana_executors ge
  JOIN executors e ON e.id = ge.executor_id
 CROSS JOIN LATERAL jsonb_array_elements(
           CASE WHEN jsonb_typeof(e.hardware -> 'precision') = 'array' THEN e.hardware -> 'precision'
                ELSE '[]'::jsonb END) AS p(value)
 WHERE jsonb_typeof(p.value) = 'object';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        GRANT SELECT ON grafana_executor_precision TO minions_grafana;
    END IF;
END $$;
