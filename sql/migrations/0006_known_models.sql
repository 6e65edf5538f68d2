-- The models the pool knows: every capability an executor has advertised, kept after it leaves, so
-- that work for a known model waits for its next executor and only a model nobody ever served is
-- refused at once.

-- Every model the pool knows: each capability ('kind:model') an executor has ever advertised, kept
-- when the executor leaves or stops serving it (minion_note_known_models), so that work for a model
-- the pool knows waits for its next executor while one nobody ever served is refused at once.
CREATE TABLE known_models (
    capability     text PRIMARY KEY,   -- 'kind:model', as in executors.capabilities
    kind           text NOT NULL,
    model          text NOT NULL,
    advertised_at  timestamptz NOT NULL DEFAULT now()   -- first advertised
);

-- Each capability an executor advertises joins the models the pool knows (known_models), once: a
-- registration that repeats what is known writes nothing. 'sleep:*' needs no model and is left out.
-- A model may hold ':' (Ollama's 'llama3:8b'); a kind never does.
CREATE FUNCTION minion_note_known_models() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO known_models (capability, kind, model)
    SELECT c, split_part(c, ':', 1), substr(c, strpos(c, ':') + 1)
      FROM unnest(NEW.capabilities) AS c
     WHERE c <> 'sleep:*' AND strpos(c, ':') > 0
       AND NOT EXISTS (SELECT 1 FROM known_models k WHERE k.capability = c)
     ORDER BY c
    ON CONFLICT (capability) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER executors_known_models AFTER INSERT OR UPDATE OF capabilities ON executors
    FOR EACH ROW EXECUTE FUNCTION minion_note_known_models();

-- Whether an executor has ever advertised kind p_kind with model p_model (a revision, 'name@rev',
-- is the model itself, as minion_capability has it).
CREATE FUNCTION minion_model_known(p_kind text, p_model text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM known_models WHERE capability = minion_capability(p_kind, p_model))
$$;

-- What executors registered before this migration advertised: their capabilities now, and those
-- their fingerprint history names (models they served before they last registered).
INSERT INTO known_models (capability, kind, model, advertised_at)
SELECT c, split_part(c, ':', 1), substr(c, strpos(c, ':') + 1), min(at)
  FROM (SELECT unnest(e.capabilities) AS c, e.created_at AS at FROM executors e
        UNION ALL
        SELECT h.capability, h.valid_from FROM executor_fingerprint_history h) advertised
 WHERE c <> 'sleep:*' AND strpos(c, ':') > 0
 GROUP BY c
 ORDER BY c
ON CONFLICT (capability) DO NOTHING;
