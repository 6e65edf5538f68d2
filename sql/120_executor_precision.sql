-- The precision each executor runs each model in, as its agent reported with its hardware at
-- registration: hardware.precision = [{"model", "device", "precision", "cosine", "setting"}, ...]
-- (cosine: the minimum cosine to fp32 over the agent's probe batch; setting: auto, or the
-- precision forced by --precision). One row per executor, team and model; agents that report no
-- precision (older agents, sleep or Ollama only) have no rows. `hardware` is what a client sent,
-- so anything but an array of objects is skipped, and a cosine that is not a number reads NULL.

CREATE VIEW grafana_executor_precision AS
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
       coalesce(p.value ->> 'setting', 'auto') AS setting
  FROM grafana_executors ge
  JOIN executors e ON e.id = ge.executor_id
 CROSS JOIN LATERAL jsonb_array_elements(
           CASE WHEN jsonb_typeof(e.hardware -> 'precision') = 'array' THEN e.hardware -> 'precision'
                ELSE '[]'::jsonb END) AS p(value)
 WHERE jsonb_typeof(p.value) = 'object';

-- As 050_views.sql's grant block: the read-only role reads the view, nothing else.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        GRANT SELECT ON grafana_executor_precision TO minions_grafana;
    END IF;
END $$;
